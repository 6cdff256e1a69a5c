// Package localcluster runs a whole Keel cluster on one machine: a bare git
// repository served by git's own binaries, and several keel agent processes
// on the process driver (or the one Options.Driver names), each with its
// own state directory, all on loopback addresses. keel demo and the end-to-end tests are built on it.
package localcluster

import (
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/internal/loopnet"
	"github.com/keel-dev/keel/nodeexec/process"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// Options describes a local cluster.
type Options struct {
	// Dir holds everything: the repositories and one state directory per
	// node. It is created.
	Dir string
	// Keel is the keel binary the agents run.
	Keel string
	// Nodes are the node names (default n1, n2, n3); the first is labelled
	// keel.dev/ingress=true, unless IngressNodes says otherwise.
	Nodes []string
	// IngressNodes are the nodes labelled keel.dev/ingress=true (default:
	// the first node).
	IngressNodes []string
	// ReportKeys gives every node an ed25519 key (<Dir>/keys/<node>): its
	// public half is the node's reportKey, and its agent signs its reports
	// with it (--report-key) and opens the shared certificates with it.
	ReportKeys bool
	// PodCIDR and ServiceCIDR default to a random pair of /16s of
	// 127.0.0.0/8, so that clusters running side by side never collide.
	PodCIDR, ServiceCIDR netip.Prefix
	// LivenessTTL and ReportInterval of the cluster (default 9 s and 3 s).
	LivenessTTL, ReportInterval time.Duration
	// Poll is the agents' --poll (default 2 s).
	Poll time.Duration
	// Files are the workload specs to commit first, by path.
	Files map[string]string
	// Driver is the agents' --driver; empty means process. Teardown
	// stops the instances of the process driver only: those of another
	// driver are the caller's to stop.
	Driver string
	// AgentArgs are extra flags for every agent; NodeArgs for one.
	AgentArgs []string
	NodeArgs  map[string][]string
	// NodeEnv are extra environment variables for one node's agent (a
	// FreeBSD host's simulator, say), before those Start is given.
	NodeEnv map[string][]string
	// FDLimit, when set, is every agent's RLIMIT_NOFILE (soft and hard),
	// set by sh's ulimit before the agent is executed.
	FDLimit int
	// RepoURL is what the agents pull and push reports to; the bare
	// repository's path when empty. Set it to serve the repository over
	// HTTP (git http-backend), say.
	RepoURL string
	// Gossip turns the gossip ring on: cluster.yaml gets spec.gossip with
	// a port free on every node's address (GossipPort, when not set), and
	// every agent the key file GossipKeyFile (made at New).
	Gossip     bool
	GossipPort int
}

// Cluster is a running local cluster.
type Cluster struct {
	Options
	Bare   string // the repository the agents pull, as a path
	Work   string // a work tree to commit from
	agents map[string]*agentProc
}

// agentProc is a running agent process; done is closed once it has exited,
// with err its exit status.
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// addrs caches the listener addresses it recorded.
	addrs map[string]string
}

// New creates the repositories with the cluster, nodes and Files committed
// (and locked), but starts no agent.
func New(opts Options) (*Cluster, error) {
	if len(opts.Nodes) == 0 {
		opts.Nodes = []string{"n1", "n2", "n3"}
	}
	if !opts.PodCIDR.IsValid() || !opts.ServiceCIDR.IsValid() {
		a := 20 + rand.IntN(200)
		opts.PodCIDR = netip.MustParsePrefix(fmt.Sprintf("127.%d.0.0/16", a))
		opts.ServiceCIDR = netip.MustParsePrefix(fmt.Sprintf("127.%d.0.0/16", a+1))
	}
	if opts.LivenessTTL == 0 {
		opts.LivenessTTL = 9 * time.Second
	}
	if opts.ReportInterval == 0 {
		opts.ReportInterval = opts.LivenessTTL / 3
	}
	if opts.Poll == 0 {
		opts.Poll = 2 * time.Second
	}
	if opts.IngressNodes == nil {
		opts.IngressNodes = opts.Nodes[:1]
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	c := &Cluster{Options: opts, Bare: filepath.Join(dir, "cluster.git"), Work: filepath.Join(dir, "cluster"),
		agents: map[string]*agentProc{}}
	if err := os.MkdirAll(c.Work, 0o755); err != nil {
		return nil, err
	}
	if _, err := c.git(dir, "init", "-q", "--bare", "-b", "main", c.Bare); err != nil {
		return nil, err
	}
	if _, err := c.git(c.Work, "init", "-q", "-b", "main"); err != nil {
		return nil, err
	}
	if _, err := c.git(c.Work, "remote", "add", "origin", c.Bare); err != nil {
		return nil, err
	}
	// So that a person can commit in the work tree without a git identity.
	for _, kv := range [][2]string{{"user.name", "keel demo"}, {"user.email", "demo@keel.invalid"}} {
		if _, err := c.git(c.Work, "config", kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	if opts.Gossip {
		if c.GossipPort == 0 {
			if c.GossipPort, err = freeGossipPort(len(opts.Nodes)); err != nil {
				return nil, err
			}
		}
		key := make([]byte, 32)
		if _, err := crand.Read(key); err != nil {
			return nil, err
		}
		if err := os.WriteFile(c.GossipKeyFile(), []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	files := map[string]string{"cluster.yaml": c.clusterYAML()}
	for i, n := range opts.Nodes {
		files["nodes/"+n+".yaml"] = c.nodeYAML(i, n)
		if opts.ReportKeys {
			pub, err := writeKey(c.KeyFile(n))
			if err != nil {
				return nil, err
			}
			files["nodes/"+n+".yaml"] += "  reportKey: " + pub + "\n"
		}
	}
	for k, v := range opts.Files {
		files[k] = v
	}
	if _, err := c.Commit("a local Keel cluster", files); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) clusterYAML() string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Cluster
metadata:
  name: local
spec:
  podCIDR: %s
  serviceCIDR: %s
  livenessTTL: %s
  reportInterval: %s
`, c.PodCIDR, c.ServiceCIDR, c.LivenessTTL, c.ReportInterval) + c.gossipYAML()
}

func (c *Cluster) gossipYAML() string {
	if !c.Gossip {
		return ""
	}
	return fmt.Sprintf("  gossip:\n    port: %d\n", c.GossipPort)
}

// GossipKeyFile is the gossip ring's key file every agent is given.
func (c *Cluster) GossipKeyFile() string { return filepath.Join(c.Dir, "gossip.key") }

// freeGossipPort finds a port free for TCP and UDP on the addresses of
// nodes 127.0.1.1 to 127.0.1.n (nodeYAML's), so that clusters running
// side by side do not share a ring.
func freeGossipPort(n int) (int, error) {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("127.0.1.%d", i+1)
	}
	return loopnet.FreePort(addrs...)
}

// nodeYAML gives node i the address 127.0.1.(i+1) and the i-th /24 of the
// pod CIDR.
func (c *Cluster) nodeYAML(i int, name string) string {
	labels := ""
	if slices.Contains(c.IngressNodes, name) {
		labels = "\n  labels:\n    keel.dev/ingress: \"true\""
	}
	b := c.PodCIDR.Addr().As4()
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Node
metadata:
  name: %s%s
spec:
  address: 127.0.1.%d
  podCIDR: %d.%d.%d.0/24
  capacity: {cpu: "8", memory: 8G}
`, name, labels, i+1, b[0], b[1], i+1)
}

// git runs git with a configuration of its own, never the user's.
func (c *Cluster) git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=keel demo", "GIT_AUTHOR_EMAIL=demo@keel.invalid",
		"GIT_COMMITTER_NAME=keel demo", "GIT_COMMITTER_EMAIL=demo@keel.invalid")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// Commit writes files into the work tree (an empty content removes the
// file), runs keel lock when the specs are valid, commits and pushes. It
// returns the new commit.
func (c *Cluster) Commit(msg string, files map[string]string) (string, error) {
	for path, content := range files {
		p := filepath.Join(c.Work, filepath.FromSlash(path))
		if content == "" {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", err
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if _, err := render.Render(os.DirFS(c.Work)); err == nil {
		lock := exec.Command(c.Keel, "lock", "--repo", c.Work)
		if out, err := lock.CombinedOutput(); err != nil {
			return "", fmt.Errorf("keel lock: %w: %s", err, out)
		}
	}
	if _, err := c.git(c.Work, "add", "-A"); err != nil {
		return "", err
	}
	if _, err := c.git(c.Work, "commit", "-q", "--allow-empty", "-m", msg); err != nil {
		return "", err
	}
	if _, err := c.git(c.Work, "push", "-q", "-f", "origin", "main"); err != nil {
		return "", err
	}
	return c.git(c.Work, "rev-parse", "HEAD")
}

// KeyFile is where node's private report key is, with ReportKeys.
func (c *Cluster) KeyFile(node string) string { return filepath.Join(c.Dir, "keys", node) }

// writeKey writes a new ed25519 private key to path (OpenSSH format, 0600)
// and returns its public half as an authorized_keys line.
func writeKey(path string) (string, error) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", err
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))), nil
}

// StateDir is the state directory of node's agent.
func (c *Cluster) StateDir(node string) string { return filepath.Join(c.Dir, "nodes", node) }

// Start starts node's agent; env adds environment variables (crash points).
// The agent binds its metrics listener on a port of its choosing, which
// MetricsAddr reads back.
func (c *Cluster) Start(node string, env ...string) error {
	if p := c.agents[node]; p != nil {
		return fmt.Errorf("agent %s already runs", node)
	}
	state := c.StateDir(node)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	// The addresses of a previous run must not be read as this run's.
	if err := agent.ClearListenFiles(state); err != nil {
		return err
	}
	cmd := c.agentCommand(node, env)
	logf, err := os.OpenFile(filepath.Join(state, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = agentProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p := &agentProc{cmd: cmd, done: make(chan struct{}), addrs: map[string]string{}}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	c.agents[node] = p
	return nil
}

// AgentArgv returns the argv that runs node's agent (the keel binary
// first), as Start runs it: for a person to start a stopped node again.
func (c *Cluster) AgentArgv(node string) []string {
	return c.agentCommand(node, nil).Args
}

// LogFile is where node's agent writes its log.
func (c *Cluster) LogFile(node string) string { return filepath.Join(c.StateDir(node), "agent.log") }

// agentCommand is the command that runs node's agent, with env added to
// its environment after NodeEnv's.
func (c *Cluster) agentCommand(node string, env []string) *exec.Cmd {
	repo := c.Bare
	if c.RepoURL != "" {
		repo = c.RepoURL
	}
	args := []string{"agent", "--repo", repo, "--node", node, "--state-dir", c.StateDir(node),
		"--poll", c.Poll.String(), "--metrics-listen", "127.0.0.1:0", "--reconcile-interval", "1s", "--stop-grace", "3s"}
	if c.Driver != "" {
		args = append(args, "--driver", c.Driver)
	}
	if c.ReportKeys {
		args = append(args, "--report-key", c.KeyFile(node))
	}
	if c.Gossip {
		args = append(args, "--gossip-key", c.GossipKeyFile())
	}
	args = append(args, c.AgentArgs...)
	args = append(args, c.NodeArgs[node]...)
	cmd := exec.Command(c.Keel, args...)
	if c.FDLimit > 0 {
		// The same process: sh executes the agent in its place.
		cmd = exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, c.FDLimit), c.Keel}, args...)...)
	}
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	cmd.Env = append(cmd.Env, c.NodeEnv[node]...)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// Running reports whether node's agent runs (or was started and not yet
// stopped or waited for: see Dead).
func (c *Cluster) Running(node string) bool { return c.agents[node] != nil }

// PID is the process id of node's agent (not of its instances), 0 when it
// does not run: a test may signal it alone (SIGSTOP starves it).
func (c *Cluster) PID(node string) int {
	if p := c.agents[node]; p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// Dead returns an error naming every agent that was started, was not
// stopped, and has exited, with the end of its log; nil when there is none.
func (c *Cluster) Dead() error {
	var errs []error
	for _, node := range slices.Sorted(mapKeys(c.agents)) {
		p := c.agents[node]
		select {
		case <-p.done:
			errs = append(errs, fmt.Errorf("agent %s exited unexpectedly (%v); the end of its log:\n%s", node, p.err, c.LogTail(node, 30)))
		default:
		}
	}
	return errors.Join(errs...)
}

// LogTail returns the last n lines of node's agent log.
func (c *Cluster) LogTail(node string, n int) string {
	b, err := os.ReadFile(filepath.Join(c.StateDir(node), "agent.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// MetricsAddr returns the address node's agent serves its metrics on, once
// it has bound it.
func (c *Cluster) MetricsAddr(ctx context.Context, node string) (string, error) {
	return c.ListenAddr(ctx, node, "metrics")
}

// ListenAddr waits until node's agent has recorded the address of its
// listener name ("metrics", "webhook") and returns it. It fails at once when
// the agent exits meanwhile.
func (c *Cluster) ListenAddr(ctx context.Context, node, name string) (string, error) {
	p := c.agents[node]
	if p == nil {
		return "", fmt.Errorf("agent %s does not run", node)
	}
	if a := p.addrs[name]; a != "" {
		return a, nil
	}
	path := agent.ListenFile(c.StateDir(node), name)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			a := strings.TrimSpace(string(b))
			p.addrs[name] = a
			return a, nil
		}
		select {
		case <-p.done:
			return "", fmt.Errorf("agent %s exited (%v) before listening for %s; the end of its log:\n%s", node, p.err, name, c.LogTail(node, 30))
		case <-ctx.Done():
			return "", fmt.Errorf("agent %s has not recorded its %s address: %w", node, name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Exited waits until node's agent exits by itself (a crash point) or ctx ends.
func (c *Cluster) Exited(ctx context.Context, node string) error {
	p := c.agents[node]
	if p == nil {
		return fmt.Errorf("agent %s does not run", node)
	}
	select {
	case <-p.done:
		delete(c.agents, node)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop stops node's agent: SIGTERM (a clean stop; instances keep running)
// or SIGKILL.
func (c *Cluster) Stop(node string, sig syscall.Signal) error {
	p := c.agents[node]
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	delete(c.agents, node)
	return nil
}

// Status asks node's agent for its status over its socket.
func (c *Cluster) Status(ctx context.Context, node string) (agent.Status, error) {
	var st agent.Status
	// One connection per request, closed after it: a client per call that
	// kept its connection alive would leave it idle on the agent's socket,
	// whose connection limit then makes the next callers wait until the
	// idle timeout reaps them.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", filepath.Join(c.StateDir(node), "keel.sock"))
		}}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://keel/v1/status", nil)
	resp, err := client.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status of %s: %s", node, resp.Status)
	}
	return st, json.Unmarshal(body, &st)
}

// Tip is the commit on main in the served repository.
func (c *Cluster) Tip() (string, error) { return c.git(c.Bare, "rev-parse", "main") }

// Model renders the work tree's specs.
func (c *Cluster) Model() (*render.Model, error) { return render.Render(os.DirFS(c.Work)) }

// Converged reports whether every agent runs the tip commit, with no
// instance operation in flight, and the cluster runs exactly its
// instances: each on one alive node, running its current spec. The string
// says what is missing.
func (c *Cluster) Converged(ctx context.Context) (bool, string) {
	tip, err := c.Tip()
	if err != nil {
		return false, err.Error()
	}
	m, err := c.Model()
	if err != nil {
		return false, err.Error()
	}
	return c.ConvergedTo(ctx, tip, m)
}

// ConvergedTo is Converged for a tip and its model known to the caller: a
// caller that polls it often (a benchmark's every 10 ms) spares the machine
// a git process and a render at every poll, which would otherwise slow
// the agents it measures.
func (c *Cluster) ConvergedTo(ctx context.Context, tip string, m *render.Model) (bool, string) {
	runningOn := map[string][]string{}
	for _, node := range c.Nodes {
		if !c.Running(node) {
			continue
		}
		st, err := c.Status(ctx, node)
		if err != nil {
			return false, fmt.Sprintf("%s: %v", node, err)
		}
		if st.Applied != tip {
			return false, fmt.Sprintf("%s applied %.10s, not the tip %.10s", node, st.Applied, tip)
		}
		if st.Operations > 0 {
			// An instance being stopped is still reported as it was.
			return false, fmt.Sprintf("%s has %d instance operations in flight", node, st.Operations)
		}
		for _, in := range st.Report.Instances {
			inst := m.Instance(in.Name)
			if in.State != report.StateRunning {
				continue
			}
			if inst == nil {
				return false, fmt.Sprintf("%s still runs %s, which is not in the specs", node, in.Name)
			}
			if inst.Surge {
				return false, fmt.Sprintf("%s still runs the surge instance %s: a rollout is under way", node, in.Name)
			}
			if in.SpecHash != inst.SpecHash {
				return false, fmt.Sprintf("%s runs %s at an old spec", node, in.Name)
			}
			if !in.IsReady() {
				return false, fmt.Sprintf("%s runs %s, not ready yet", node, in.Name)
			}
			runningOn[in.Name] = append(runningOn[in.Name], node)
		}
	}
	for _, inst := range m.Instances {
		if inst.Surge {
			continue // runs only while a rollout is under way
		}
		switch n := runningOn[inst.Name]; len(n) {
		case 0:
			return false, inst.Name + " runs nowhere"
		case 1:
		default:
			return false, fmt.Sprintf("%s runs on %s", inst.Name, strings.Join(n, " and "))
		}
	}
	return true, ""
}

// WaitConverged waits until Converged, or returns the last reason.
func (c *Cluster) WaitConverged(ctx context.Context) error {
	return c.WaitFor(ctx, func() (bool, string) { return c.Converged(ctx) })
}

// WaitFor polls cond every 100 ms until it holds or ctx ends. It fails at
// once when an agent exits that was not stopped (see Dead).
func (c *Cluster) WaitFor(ctx context.Context, cond func() (bool, string)) error {
	why := ""
	for {
		if err := c.Dead(); err != nil {
			return err
		}
		ok, reason := cond()
		if ok {
			return nil
		}
		why = reason
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Teardown stops every agent and, on the process driver, every instance,
// and leaves Dir in place.
func (c *Cluster) Teardown() {
	for _, node := range slices.Sorted(mapKeys(c.agents)) {
		_ = c.Stop(node, syscall.SIGTERM)
	}
	if c.Driver != "" && c.Driver != "process" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, node := range c.Nodes {
		d, err := process.New(process.Options{StateDir: c.StateDir(node)})
		if err != nil {
			continue
		}
		running, _ := d.Running(ctx)
		for name := range running {
			_ = d.Stop(ctx, name, 2*time.Second)
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
