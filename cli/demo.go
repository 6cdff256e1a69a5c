package cli

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/report"
)

// demoHost is the demo Ingress's host: Pebble's DNS answers it with the
// nodes' addresses; a client reaches it with curl --resolve.
const demoHost = "www.keel.test"

// demoFiles are the demo cluster's workloads: repo-example's, on loopback,
// each instance running keel's own demo-web service.
func demoFiles(keel, webImage string) map[string]string {
	return map[string]string{
		"apps/web.yaml": fmt.Sprintf(`# A stateless web service: three replicas behind one VIP, from the
# demo's OCI image (its etc/version is what GET /version answers).
# Try: change replicas or GREETING, then commit and git push; or push a
# new image (keel demo-image) and commit its digest.
apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: 3
  port: 8080
  template:
    image: %s
    command: [%q, demo-web, --port, "8080", --version-file, etc/version]
    env:
      GREETING: hello
      HEALTHZ: ok               # fail: /healthz answers 503, a version never ready
    checks:
      readiness:                # traffic and rollouts follow it
        http: {path: /healthz}
        period: 2s
    resources: {cpu: 100m, memory: 64M}
  strategy:
    progressDeadline: 15s       # a replica not ready by then pauses the rollout
`, webImage, keel),
		"apps/db.yaml": fmt.Sprintf(`# A stateful service: each replica keeps its request count in its volume,
# and stays pinned to its node by keel.lock.
apiVersion: keel/v1
kind: Service
metadata:
  name: db
spec:
  replicas: 2
  port: 5432
  template:
    image: base/demo
    command: [%q, demo-web, --port, "5432", --data, "${KEEL_VOLUME_DATA}"]
    resources: {cpu: 100m, memory: 64M}
    volumes:
      - name: data
        mountPath: /var/db
`, keel),
		"apps/www.yaml": `# HTTPS for the web Service: every ingress node serves it, with one
# certificate the Ingress's owner obtains (here from a local Pebble) and
# shares, encrypted to the nodes' report keys, on refs/keel/certs/` + demoHost + `.
apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: ` + demoHost + `
  backend:
    service: web
  tls:
    email: demo@keel.invalid
`,
		"jails/exporter.yaml": fmt.Sprintf(`apiVersion: keel/v1
kind: Jail
metadata:
  name: exporter
spec:
  image: base/demo
  command: [%q, demo-web, --port, "9100"]
  node: n2
  resources: {cpu: 50m, memory: 32M}
`, keel),
	}
}

func (e *env) demoCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a local three-node cluster on the process driver, deployed by git push",
		Long: `Demo creates a git repository with a demo cluster (a web Service with three
replicas, a stateful db Service with volumes, a plain jail), starts three
agents on the process driver (no root needed: instances are processes on
loopback addresses), waits until every instance runs, and prints how to
reach them and how to deploy a change with git push. Ctrl-C stops the
agents and every instance, and removes the demo directory unless --dir
was given.`,
		Args: cobra.NoArgs,
	}
	dir := cmd.Flags().String("dir", "", "keep the demo in this directory (default: a temporary one, removed at the end)")
	timeout := cmd.Flags().Duration("timeout", 2*time.Minute, "how long to wait for the cluster to converge")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		keel, err := os.Executable()
		if err != nil {
			return err
		}
		root := *dir
		if root == "" {
			if root, err = os.MkdirTemp("", "keel-demo-"); err != nil {
				return err
			}
			defer os.RemoveAll(root)
		}
		reg, err := startDemoRegistry()
		if err != nil {
			return fmt.Errorf("the demo's registry: %w", err)
		}
		defer reg.Close()
		webImage, err := pushDemoImage(e.ctx, reg.host, "v1")
		if err != nil {
			return fmt.Errorf("the demo's web image: %w", err)
		}
		fmt.Fprintf(e.stdout, "keel demo: an OCI registry on %s serves the web application's image, version v1\n", reg.host)
		nodes := []string{"n1", "n2", "n3"}
		opts := localcluster.Options{Dir: root, Keel: keel, Files: demoFiles(keel, webImage), Nodes: nodes, IngressNodes: nodes, ReportKeys: true,
			NodeArgs: map[string][]string{}, Gossip: true}
		fmt.Fprintln(e.stdout, "keel demo: starting Pebble, a local ACME CA, for the Ingress's certificate...")
		ing, err := startDemoACME(root, nodes)
		if err != nil {
			return fmt.Errorf("the demo's ACME CA (Pebble, built with go from the module proxy): %w", err)
		}
		defer ing.peb.Close()
		for i, n := range nodes {
			ip := demoNodeIP(i)
			opts.NodeArgs[n] = []string{"--ingress-http", net.JoinHostPort(ip, strconv.Itoa(ing.http)), "--ingress-https", net.JoinHostPort(ip, strconv.Itoa(ing.https)),
				"--acme-directory", ing.peb.DirectoryURL, "--acme-ca-roots", ing.dirRoots, "--acme-http01-wait", "3s", "--acme-retry-min", "5s"}
		}
		c, err := localcluster.New(opts)
		if err != nil {
			return err
		}
		defer func() {
			fmt.Fprintln(e.stdout, "\nstopping the agents and every instance...")
			c.Teardown()
		}()
		for _, n := range c.Nodes {
			if err := c.Start(n); err != nil {
				return err
			}
		}
		fmt.Fprintf(e.stdout, "keel demo: 3 agents started in %s; waiting for the cluster to converge...\n", root)
		start := time.Now()
		wctx, cancel := context.WithTimeout(e.ctx, *timeout)
		err = c.WaitConverged(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("the demo cluster did not converge (agent logs: %s): %w", filepath.Join(root, "nodes", "*", "agent.log"), err)
		}
		fmt.Fprintf(e.stdout, "converged in %s\n", time.Since(start).Round(100*time.Millisecond))
		fmt.Fprintf(e.stdout, "waiting for every node to serve https://%s/ with a certificate from Pebble...\n", demoHost)
		wctx, cancel = context.WithTimeout(e.ctx, *timeout)
		err = ing.waitServed(wctx, len(nodes))
		cancel()
		if err != nil {
			return fmt.Errorf("the demo's Ingress is not served over HTTPS (agent logs: %s): %w", filepath.Join(root, "nodes", "*", "agent.log"), err)
		}
		fmt.Fprintln(e.stdout)
		e.printDemo(c, keel, reg.host)
		// The status views over the demo's repository: keel status and the
		// dashboard, served in-process until Ctrl-C.
		dash, err := e.startDemoDashboard(c.Bare, keel)
		if err != nil {
			return err
		}
		defer dash.stop()
		e.printDemoIngress(c, ing)
		<-e.ctx.Done()
		return nil
	}
	return cmd
}

// printDemo shows the demo cluster and the commands to try, with keel's
// absolute path (they are run from the demo's work tree).
func (e *env) printDemo(c *localcluster.Cluster, keel, registry string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tINSTANCE\tSTATE\tADDRESS")
	var plan *planner.Plan
	for _, n := range c.Nodes {
		st, err := c.Status(ctx, n)
		if err != nil {
			continue
		}
		for _, in := range st.Report.Instances {
			if in.State == report.StateRunning {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", n, in.Name, in.State, in.Address)
			}
		}
	}
	w.Flush()
	if m, err := c.Model(); err == nil {
		plan = planner.Compute(planner.Input{Model: m, Now: time.Now(), AssumeAlive: true})
		fmt.Fprintln(e.stdout, "\nServices (every node proxies each VIP):")
		for _, s := range plan.Services {
			fmt.Fprintf(e.stdout, "  %-6s curl http://%s:%d/\n", s.Name, s.VIP, s.Port)
		}
	}
	fmt.Fprintln(e.stdout, "\nAgents:")
	w = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  NODE\tPID\tLOG")
	for _, n := range c.Nodes {
		fmt.Fprintf(w, "  %s\t%d\t%s\n", n, c.PID(n), c.LogFile(n))
	}
	w.Flush()
	last := c.Nodes[len(c.Nodes)-1]
	argv := c.AgentArgv(last)
	for i, a := range argv {
		argv[i] = shellQuote(a)
	}
	fmt.Fprintf(e.stdout, `Stop one node's agent (its instances keep running; the gossip ring finds it
dead within seconds, and the others take its stateless work):
  kill %d
Start it again (it carries on from its state directory; stop it yourself
before Ctrl-C, which stops only the agents the demo started):
  GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 %s >> %s 2>&1 &
`, c.PID(last), strings.Join(argv, " "), shellQuote(c.LogFile(last)))
	fmt.Fprintln(e.stdout, "\nMetrics:")
	metrics := ""
	for _, n := range c.Nodes {
		addr, err := c.MetricsAddr(ctx, n)
		if err != nil {
			fmt.Fprintf(e.stdout, "  %s  %v\n", n, err)
			continue
		}
		fmt.Fprintf(e.stdout, "  %s  http://%s/metrics\n", n, addr)
		metrics = cmp.Or(metrics, "http://"+addr+"/metrics")
	}
	fmt.Fprintf(e.stdout, `
Deploy a change with git push, from the demo's work tree:
  cd %s
  sed -i 's/replicas: 3/replicas: 5/' apps/web.yaml
  %s lock && git commit -qam "scale web to 5" && git push -q origin main

Then watch it converge:
  %s node status --state-dir %s
  %s plan --repo %s --reports-remote origin

`, c.Work, shellQuote(keel), shellQuote(keel), c.StateDir(c.Nodes[0]), shellQuote(keel), c.Work)
	var web string
	if plan != nil {
		for _, s := range plan.Services {
			if s.Name == "web" {
				web = fmt.Sprintf("http://%s:%d/", s.VIP, s.Port)
			}
		}
	}
	if web == "" || metrics == "" {
		return
	}
	fmt.Fprintf(e.stdout, `Change the greeting while a load loop runs through the web VIP: the replicas
restart one at a time, each drained first and back in the VIP's endpoints
once ready, so no request fails (the loop exits 1 if one does):
  %[1]s demo-load --duration 12s %[2]s & sleep 1; sed -i 's/GREETING: hello/GREETING: bonjour/' apps/web.yaml && git commit -qam "greet in French" && git push -q origin main; wait $!

Push a version that never becomes ready (its /healthz answers 503): one
replica is restarted with it and gets no traffic; past the progressDeadline
(15 s) the rollout pauses, and the other replicas keep serving:
  sed -i 's/HEALTHZ: ok/HEALTHZ: fail/' apps/web.yaml && git commit -qam "a broken version" && git push -q origin main
  %[1]s demo-load --duration 20s %[2]s
  curl -s %[3]s | grep 'keel_rollout_paused{service="web"} 1'
  %[1]s plan --repo %[4]s --reports-remote origin | grep -A1 '^  web '
Roll back: git revert, paced as any rollout:
  git revert --no-edit HEAD && git push -q origin main

Deploy a new build of the application by its digest: CI would build the
image and push it; here keel demo-image builds version v2, pushes it to the
demo's registry and prints its reference pinned by digest, which the commit
puts in apps/web.yaml. Each node pulls and verifies the image, and the
replicas are replaced one at a time, under load, with no failed request:
  curl -s %[2]sversion
  %[1]s demo-load --duration 12s %[2]s & sleep 1; image=$(%[1]s demo-image --registry %[5]s --version v2) && sed -i "s|image: oci://.*|image: $image|" apps/web.yaml && git commit -qam "web: version v2" && git push -q origin main; wait $!
  curl -s %[2]sversion

`, shellQuote(keel), web, metrics, c.Work, registry)
}

func shellQuote(s string) string {
	if !strings.ContainsAny(s, " '\"$\\") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
