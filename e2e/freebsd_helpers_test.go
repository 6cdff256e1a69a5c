//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// The freebsd driver's end-to-end tests run real `keel agent --driver
// freebsd` processes against the FreeBSD userland simulator's executables
// (fbsdsim): each node is a FreeBSD host of its own, whose state (datasets,
// jails, interfaces, routes, rctl rules) lives on disk under its root. A
// workload is a real process (jexec execs /usr/bin/env, which execs the
// command on this machine), but jail addresses are not real here, so the
// tests check the simulated hosts' state and the agents' reports, never
// HTTP.

const (
	fbsdPool = "zroot"
	// fbsdStopTimeout is jail -r's stop.timeout on the simulated hosts.
	fbsdStopTimeout = 2 * time.Second
)

// fbsdImages are the base images every simulated host holds, each with its
// @keel snapshot.
var fbsdImages = []string{"base/demo", "base/other"}

// fbsdCluster is a cluster on the freebsd driver, with each node's
// simulated host.
type fbsdCluster struct {
	*cluster
	// hosts maps each node to its simulator root.
	hosts map[string]string
}

// newFreeBSDCluster prepares one simulated FreeBSD host per node (the
// pool's keel/{jails,volumes,base} datasets, the base images and their
// @keel snapshots, a short stop timeout) and starts an agent with --driver
// freebsd on each, as newCluster does. The workloads left running are
// killed when the test ends.
func newFreeBSDCluster(t *testing.T, timeout time.Duration, opts localcluster.Options) *fbsdCluster {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if len(opts.Nodes) == 0 {
		opts.Nodes = []string{"n1", "n2", "n3"}
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	bin := filepath.Join(opts.Dir, "fbsd-bin")
	if err := fbsdsim.Install(bin, fbsdsimBin); err != nil {
		t.Fatal(err)
	}
	hosts := map[string]string{}
	opts.Driver = "freebsd"
	opts.NodeEnv = map[string][]string{}
	for i, n := range opts.Nodes {
		root := filepath.Join(opts.Dir, "hosts", n)
		// localcluster gives node i the address 127.0.1.(i+1): the host's
		// NIC holds it, so peers' routes have a reachable gateway.
		prepareFreeBSDHost(t, root, netip.AddrFrom4([4]byte{127, 0, 1, byte(i + 1)}))
		hosts[n] = root
		opts.NodeEnv[n] = []string{
			fbsdsim.RootEnv + "=" + root,
			fbsdsim.StopTimeoutEnv + "=" + fbsdStopTimeout.String(),
			"KEEL_FREEBSD_ROOT=" + root,
			"KEEL_FREEBSD_BINDIR=" + bin,
		}
	}
	// Registered before newCluster's teardown, so run after it: once the
	// agents are stopped, the workloads they left are killed.
	t.Cleanup(func() {
		for _, root := range hosts {
			killHostWorkloads(t, root)
		}
	})
	fc := &fbsdCluster{cluster: newCluster(t, timeout, opts), hosts: hosts}
	return fc
}

// prepareFreeBSDHost makes root a FreeBSD host as the operator leaves it
// for Keel (docs/install-freebsd.md): the parent datasets, the base images
// with their @keel snapshots, VNET and RACCT in the kernel, and its NIC
// em0 with the node's address.
func prepareFreeBSDHost(t *testing.T, root string, addr netip.Addr) {
	t.Helper()
	s := fbsdsim.OnDisk(root, fbsdsim.Options{
		Pools:       []string{fbsdPool},
		HostIfaces:  []fbsdsim.HostIface{{Name: "em0", Addrs: []fbsdsim.Addr{{IP: addr.String(), Prefix: 24}}}},
		StopTimeout: fbsdStopTimeout,
	})
	run := func(argv ...string) {
		t.Helper()
		res, err := s.Run(t.Context(), argv)
		if err != nil || res.Code != 0 {
			t.Fatalf("preparing the host %s: %s: %v %s", root, strings.Join(argv, " "), err, res.Stderr)
		}
	}
	for _, ds := range []string{"jails", "volumes", "base"} {
		run("zfs", "create", "-p", fbsdPool+"/keel/"+ds)
	}
	for _, image := range fbsdImages {
		ds := fbsdPool + "/keel/" + image
		if err := s.MakeBaseImage(ds, "/usr/bin/env"); err != nil {
			t.Fatal(err)
		}
		run("zfs", "snapshot", ds+"@keel")
	}
	s.SetSysctl("kern.boottime", "{ sec = 1700000000, usec = 250000 } Tue Nov 14 22:13:20 2023")
	s.SetSysctl("kern.features.vimage", "1")
}

// killHostWorkloads kills the workloads still running on a simulated host
// (real processes that jexec started), as a power cut would.
func killHostWorkloads(t testing.TB, root string) {
	st, err := fbsdsim.Load(root)
	if err != nil {
		t.Logf("reading the host %s: %v", root, err)
		return
	}
	for _, p := range st.Procs {
		// Load drops a process whose pid is gone or was reused.
		if p.Real && !p.Exited {
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		}
	}
}

// hostState reads node's simulated host.
func (c *fbsdCluster) hostState(node string) (*fbsdsim.State, error) {
	return fbsdsim.Load(c.hosts[node])
}

// jailPIDs maps each jail of node's host to its live processes' pids.
func (c *fbsdCluster) jailPIDs(node string) map[string][]int {
	c.t.Helper()
	st, err := c.hostState(node)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string][]int{}
	for _, p := range st.Procs {
		if !p.Exited {
			out[p.Jail] = append(out[p.Jail], p.Pid)
		}
	}
	return out
}

// workloadPIDs is jailPIDs without the exec checks in flight: the live
// processes of each jail but those that run one of its instance's exec
// checks (in m). The agent runs a check as a process of the jail (jexec:
// freebsd.Driver.Exec), at any moment, and a check in flight when the
// agent crashes runs on to its end, an orphan.
func (c *fbsdCluster) workloadPIDs(node string, m *render.Model) map[string][]int {
	c.t.Helper()
	st, err := c.hostState(node)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string][]int{}
	for _, p := range st.Procs {
		if p.Exited {
			continue
		}
		if inst := m.Instance(strings.TrimPrefix(p.Jail, "keel-")); inst != nil && isExecCheck(inst.Spec.Checks, envCommand(p.Argv)) {
			continue
		}
		out[p.Jail] = append(out[p.Jail], p.Pid)
	}
	return out
}

// isExecCheck reports whether cmd is the command of one of checks' exec
// checks.
func isExecCheck(checks render.Checks, cmd []string) bool {
	for _, ch := range []*render.Check{checks.Startup, checks.Readiness, checks.Liveness} {
		if ch != nil && ch.Exec != nil && slices.Equal(ch.Exec.Command, cmd) {
			return true
		}
	}
	return false
}

// envCommand is the command that argv, as the freebsd driver has jexec
// run it (/usr/bin/env -i NAME=value... command...), runs.
func envCommand(argv []string) []string {
	if len(argv) < 2 || argv[0] != "/usr/bin/env" || argv[1] != "-i" {
		return argv
	}
	cmd := argv[2:]
	for len(cmd) > 0 && strings.Contains(cmd[0], "=") {
		cmd = cmd[1:]
	}
	return cmd
}

// checkHosts waits until every node in alive (running agents) holds
// exactly what the model places on it, and fails with every difference
// found last: see hostProblems.
func (c *fbsdCluster) checkHosts(what string, alive ...string) {
	c.t.Helper()
	var last []string
	// The routes and VIPs follow a pass or two after the instances.
	ctx, cancel := context.WithTimeout(c.ctx, scaled(30*time.Second))
	defer cancel()
	err := c.WaitFor(ctx, func() (bool, string) {
		last = c.hostProblems(alive)
		return len(last) == 0, strings.Join(last, "; ")
	})
	if err != nil {
		c.t.Fatalf("%s: the simulated hosts are not as the model says:\n\t%s", what, strings.Join(last, "\n\t"))
	}
	c.t.Logf("%s: the hosts of %v hold exactly their instances", what, alive)
}

// hostProblems compares each alive node's simulated host with the model
// and the agents' reports, and returns every difference, one line each:
//   - the instances reported running on the node are exactly its jails
//     keel-<instance> (none elsewhere), each in a VNET, rooted in its own
//     clone of its image's @keel snapshot, with a live process;
//   - each jail has one epair: the a-end up on keel0, the b-end in the
//     jail's VNET with the instance's address on the node's /24, and a
//     default route through the gateway (the .1, aliased on keel0);
//   - devfs on the root's /dev, each volume's dataset (with its quota)
//     nullfs-mounted at its mountPath;
//   - the jail's rctl rules are exactly those of its spec's resources;
//   - the node reports exactly the volume datasets its host holds;
//   - every Service VIP is a /32 alias on keel0;
//   - the host routes are exactly one per alive peer: its /24 via its
//     address, out of em0;
//   - fbsdsim's leak check finds nothing else (no stray jail, epair,
//     clone, mount, alias, route or rctl rule);
//   - and no agent logged a warning of fbsdWarnings.
func (c *fbsdCluster) hostProblems(alive []string) []string {
	m, err := c.Model()
	if err != nil {
		return []string{err.Error()}
	}
	sts, err := c.statuses()
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	nodes := map[string]render.Node{}
	for _, n := range m.Nodes {
		nodes[n.Name] = n
	}
	var vips []string
	for _, s := range m.Services {
		vips = append(vips, s.VIP.Addr.String())
	}
	for _, node := range alive {
		st, ok := sts[node]
		if !ok {
			bad("%s: its agent does not run", node)
			continue
		}
		host, err := c.hostState(node)
		if err != nil {
			bad("%s: reading its host: %v", node, err)
			continue
		}
		var jails []string
		for _, ri := range st.Report.Instances {
			if ri.State != report.StateRunning {
				continue
			}
			inst := m.Instance(ri.Name)
			if inst == nil {
				bad("%s: runs %s, which is not in the specs", node, ri.Name)
				continue
			}
			jails = append(jails, "keel-"+ri.Name)
			for _, p := range jailProblems(host, *inst, ri, nodes[node]) {
				bad("%s: %s", node, p)
			}
		}
		for name, j := range host.Jails {
			if !j.Dying && strings.HasPrefix(name, "keel-") && !slices.Contains(jails, name) {
				bad("%s: jail %s exists, but the agent reports no running %s", node, name, strings.TrimPrefix(name, "keel-"))
			}
		}
		var reportedVols, hostVols []string
		for _, v := range st.Report.Volumes {
			reportedVols = append(reportedVols, v.Name)
		}
		for name := range host.Datasets {
			if v, ok := strings.CutPrefix(name, fbsdPool+"/keel/volumes/"); ok && !strings.Contains(v, "/") {
				hostVols = append(hostVols, v)
			}
		}
		slices.Sort(reportedVols)
		slices.Sort(hostVols)
		if !slices.Equal(reportedVols, hostVols) {
			bad("%s: reports the volumes %v, its host holds %v", node, reportedVols, hostVols)
		}
		bridge := host.Iface("", render.DefaultBridge)
		for _, vip := range vips {
			if bridge == nil || !slices.Contains(bridge.Addrs, fbsdsim.Addr{IP: vip, Prefix: 32}) {
				bad("%s: VIP %s is not a /32 alias on %s", node, vip, render.DefaultBridge)
			}
		}
		var routes []string
		for _, peer := range alive {
			if peer == node {
				continue
			}
			p := nodes[peer]
			dest := p.PodCIDR.Prefix.String()
			routes = append(routes, dest)
			// Through em0, the NIC on the nodes' network.
			want := fbsdsim.Route{Dest: dest, Gateway: p.Address.Addr.String(), Iface: "em0"}
			if !slices.Contains(host.Routes, want) {
				bad("%s: no route to %s's subnet %s via %s on em0 (routes %v)", node, peer, want.Dest, want.Gateway, host.Routes)
			}
		}
		for _, l := range host.LeaksExpect(fbsdsim.Expect{Jails: jails, VIPs: vips, Routes: routes}) {
			bad("%s: leak: %s", node, l)
		}
	}
	for _, node := range c.Nodes {
		for _, l := range c.driverWarnings(node) {
			bad("%s: the agent warned: %s", node, l)
		}
	}
	return out
}

// fbsdWarnings are the warnings of an agent on the freebsd driver that
// none of these tests may cause: a host prerequisite missing (the hosts
// are prepared fully), a route or VIP the driver could not set, an
// instance error, the driver's own warnings.
var fbsdWarnings = []string{
	`msg="host prerequisite"`, `msg=routes`, `msg="service addresses"`, `msg=instance `,
	`msg="undoing a failed provision"`, `msg="reading the start time of a workload"`, `msg="recording a workload"`,
	`msg="ignoring an unreadable instance record"`, `msg="reading kern.boottime`,
}

// driverWarnings returns the lines of node's agent log that carry one of
// fbsdWarnings.
func (c *fbsdCluster) driverWarnings(node string) []string {
	b, err := os.ReadFile(filepath.Join(c.StateDir(node), "agent.log"))
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, "level=WARN") {
			continue
		}
		for _, w := range fbsdWarnings {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// jailProblems checks the jail of one instance that its node reports
// running (see hostProblems).
func jailProblems(host *fbsdsim.State, inst render.Instance, ri report.Instance, node render.Node) []string {
	var out []string
	bad := func(format string, a ...any) {
		out = append(out, inst.Name+": "+fmt.Sprintf(format, a...))
	}
	name := "keel-" + inst.Name
	ds := fbsdPool + "/keel/jails/" + inst.Name
	root := "/" + ds
	j := host.Jail(name)
	if j == nil {
		bad("reported running, but there is no jail %s", name)
		return out
	}
	if !j.VNet || j.Path != root || !j.Persist {
		bad("jail %s: vnet %v, path %s, persist %v; want a persistent vnet jail rooted at %s", name, j.VNet, j.Path, j.Persist, root)
	}
	if !slices.ContainsFunc(host.Procs, func(p fbsdsim.Proc) bool { return p.Jail == name && !p.Exited }) {
		bad("jail %s holds no live process", name)
	}
	if d := host.Datasets[ds]; d == nil {
		bad("no root dataset %s", ds)
	} else if want := fbsdPool + "/keel/" + inst.Spec.Image + "@keel"; d.Origin != want {
		bad("root %s is a clone of %q, want %s", ds, d.Origin, want)
	}

	// The network: one epair, its b-end in the jail.
	var ends []*fbsdsim.Iface
	for _, i := range host.Ifaces {
		if i.VNet == name && i.Kind == "epair" {
			ends = append(ends, i)
		}
	}
	if len(ends) != 1 {
		bad("%d epair ends in the jail's VNET, want 1", len(ends))
	} else {
		b := ends[0]
		subnet := node.PodCIDR.Prefix
		addr := fbsdsim.Addr{IP: ri.Address.String(), Prefix: 24}
		if !subnet.Contains(ri.Address) {
			bad("reported address %s is outside its node's subnet %s", ri.Address, subnet)
		}
		if !b.Up || !slices.Equal(b.Addrs, []fbsdsim.Addr{addr}) {
			bad("%s in the jail: up %v, addresses %v; want up with %s/24", b.Name, b.Up, b.Addrs, addr.IP)
		}
		a := host.Iface("", b.Peer)
		bridge := host.Iface("", render.DefaultBridge)
		switch {
		case a == nil:
			bad("the host end %s of %s is not on the host", b.Peer, b.Name)
		case !a.Up || bridge == nil || !slices.Contains(bridge.Members, a.Name):
			bad("the host end %s: up %v, not a member of %s", a.Name, a.Up, render.DefaultBridge)
		}
		gw := subnet.Masked().Addr().Next()
		if bridge == nil || !slices.Contains(bridge.Addrs, fbsdsim.Addr{IP: gw.String(), Prefix: 24}) {
			bad("the gateway %s/24 is not aliased on %s", gw, render.DefaultBridge)
		}
		if !slices.Contains(host.Routes, fbsdsim.Route{VNet: name, Dest: "default", Gateway: gw.String(), Iface: b.Name}) {
			bad("no default route via %s on %s in the jail (routes %v)", gw, b.Name, host.Routes)
		}
	}

	// Mounts: devfs, and each volume's dataset over nullfs.
	if !slices.ContainsFunc(host.Mounts, func(m fbsdsim.Mount) bool { return m.FSType == "devfs" && m.On == root+"/dev" }) {
		bad("no devfs on %s/dev", root)
	}
	for _, v := range inst.Spec.Volumes {
		vds := fbsdPool + "/keel/volumes/" + v.Name
		if d := host.Datasets[vds]; d == nil {
			bad("no volume dataset %s", vds)
		} else if v.Size > 0 && d.Props["quota"] != fmt.Sprint(int64(v.Size)) {
			bad("volume %s has quota %q, want %d", vds, d.Props["quota"], int64(v.Size))
		}
		on := root + v.MountPath
		if !slices.ContainsFunc(host.Mounts, func(m fbsdsim.Mount) bool { return m.FSType == "nullfs" && m.From == "/"+vds && m.On == on }) {
			bad("volume %s is not nullfs-mounted on %s", vds, on)
		}
	}

	// Limits: exactly the spec's rules.
	var want, got []string
	if cpu := int64(inst.Spec.Resources.CPU); cpu > 0 {
		want = append(want, fmt.Sprintf("jail:%s:pcpu:deny=%d", name, (cpu+5)/10))
	}
	if mem := int64(inst.Spec.Resources.Memory); mem > 0 {
		want = append(want, fmt.Sprintf("jail:%s:vmemoryuse:deny=%d", name, mem))
	}
	for _, r := range host.Rctl {
		if strings.HasPrefix(r, "jail:"+name+":") {
			got = append(got, r)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		bad("rctl rules %v, want %v", got, want)
	}
	return out
}

// fbsdWeb is a stateless Service on the freebsd driver: vnet jails whose
// workload is a real sleep. A sleep listens on no port, so its readiness
// is an exec check run in the jail (jexec), which passes.
func fbsdWeb(replicas int, image string) string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: %d
  port: 8080
  template:
    image: %s
    command: [/bin/sleep, "100000"]
    checks:
      readiness: {exec: {command: [/bin/sleep, "0"]}}
    network: {vnet: true}
    resources: {cpu: 100m, memory: 64M}
`, replicas, image)
}

// fbsdDB is a stateful Service: each replica has a volume with a quota.
func fbsdDB(replicas int) string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Service
metadata:
  name: db
spec:
  replicas: %d
  port: 5432
  template:
    image: base/demo
    command: [/bin/sleep, "100000"]
    checks:
      readiness: {exec: {command: [/bin/sleep, "0"]}}
    network: {vnet: true}
    resources: {cpu: 100m, memory: 64M}
    volumes:
      - name: data
        mountPath: /var/db
        size: 32M
`, replicas)
}

// fbsdJail is a stateful Jail with a volume (a quota) and limits, on node
// (any when empty).
func fbsdJail(name, node string) string {
	s := fmt.Sprintf(`apiVersion: keel/v1
kind: Jail
metadata:
  name: %s
spec:
  image: base/demo
  command: [/bin/sleep, "100000"]
  network: {vnet: true}
  resources: {cpu: 250m, memory: 128M}
  volumes:
    - name: %s-data
      mountPath: /var/db/%s
      size: 64M
`, name, name, name)
	if node != "" {
		s += "  node: " + node + "\n"
	}
	return s
}

// placement maps each instance reported running to its one node, failing
// the test when one runs on several.
func (c *fbsdCluster) placement() map[string]string {
	c.t.Helper()
	out := map[string]string{}
	for name, nodes := range runningOn(c.mustStatuses()) {
		if len(nodes) != 1 {
			c.t.Fatalf("%s is reported running on %v", name, nodes)
		}
		out[name] = nodes[0]
	}
	return out
}

// checkGone fails unless no trace of the instances is left on the hosts of
// nodes: no jail, root dataset, epair in its VNET, mount under its root or
// rctl rule.
func (c *fbsdCluster) checkGone(what string, nodes []string, instances ...string) {
	c.t.Helper()
	for _, node := range nodes {
		host, err := c.hostState(node)
		if err != nil {
			c.t.Fatal(err)
		}
		for _, name := range instances {
			jail, ds := "keel-"+name, fbsdPool+"/keel/jails/"+name
			if _, ok := host.Jails[jail]; ok {
				c.t.Errorf("%s: %s: jail %s is left", what, node, jail)
			}
			if host.Datasets[ds] != nil {
				c.t.Errorf("%s: %s: root dataset %s is left", what, node, ds)
			}
			for _, i := range host.Ifaces {
				if i.VNet == jail {
					c.t.Errorf("%s: %s: interface %s is left in %s's VNET", what, node, i.Name, jail)
				}
			}
			for _, m := range host.Mounts {
				if m.On == "/"+ds || strings.HasPrefix(m.On, "/"+ds+"/") {
					c.t.Errorf("%s: %s: %s mount on %s is left", what, node, m.FSType, m.On)
				}
			}
			for _, r := range host.Rctl {
				if strings.HasPrefix(r, "jail:"+jail+":") {
					c.t.Errorf("%s: %s: rctl rule %s is left", what, node, r)
				}
			}
		}
	}
}

// hasVolume reports whether node's host holds the volume's dataset.
func (c *fbsdCluster) hasVolume(node, volume string) bool {
	c.t.Helper()
	host, err := c.hostState(node)
	if err != nil {
		c.t.Fatal(err)
	}
	return host.Datasets[fbsdPool+"/keel/volumes/"+volume] != nil
}

// fbsdsimExpect is what a host of the cluster may hold besides the jails:
// the Services' VIPs and the routes to the other nodes' subnets.
func fbsdsimExpect(c *fbsdCluster, jails, alive []string) fbsdsim.Expect {
	c.t.Helper()
	m := c.model()
	e := fbsdsim.Expect{Jails: jails}
	for _, s := range m.Services {
		e.VIPs = append(e.VIPs, s.VIP.Addr.String())
	}
	for _, n := range m.Nodes {
		if slices.Contains(alive, n.Name) {
			e.Routes = append(e.Routes, n.PodCIDR.Prefix.String())
		}
	}
	return e
}
