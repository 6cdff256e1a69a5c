//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/internal/loopnet"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// keelBin is the keel binary the agents run, built by TestMain (with the
// race detector when the tests have it); demoBin is the one the workloads
// run (keel demo-web), always without it, since they are not under test.
// fbsdsimBin is the FreeBSD userland simulator's multi-call binary (the
// freebsd driver's commands, TestFreeBSD*), built without the race
// detector: it is not under test here, and runs once per command.
// skipReason, when set, says why this machine cannot run the tests.
var (
	keelBin    string
	demoBin    string
	fbsdsimBin string
	skipReason string
)

func TestMain(m *testing.M) {
	// Never the developer's git configuration, for the tests' own git
	// commands and for the agents they start.
	os.Setenv("GIT_CONFIG_GLOBAL", "/dev/null")
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	if os.Getenv("GORACE") == "" {
		// A race-enabled agent otherwise lingers a second at every exit.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	switch _, err := exec.LookPath("git"); {
	case runtime.GOOS != "linux":
		skipReason = "the end-to-end tests run agents on the process driver, which needs Linux's /proc"
	case err != nil:
		skipReason = "git is not installed: the end-to-end tests serve the cluster repository with git's own binaries"
	}
	if skipReason != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "keel-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	keelBin, demoBin = filepath.Join(dir, "keel"), filepath.Join(dir, "keel-demo")
	fbsdsimBin = filepath.Join(dir, "fbsdsim")
	err = build(keelBin, raceEnabled)
	if err == nil && raceEnabled {
		err = build(demoBin, false)
	} else if err == nil {
		err = os.Link(keelBin, demoBin)
	}
	if err == nil {
		err = buildPackage(fbsdsimBin, false, "github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim/cmd/fbsdsim")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// Measured after the build, which would count as contention.
	var why string
	slowdown, why = measureSlowdown()
	// A whole multiple of three seconds, so that reportInterval is exactly
	// a third of it (the most render accepts).
	ttl = (scaled(ttl) + 3*time.Second - 1).Truncate(3 * time.Second)
	reportInterval = ttl / 3
	fmt.Fprintf(os.Stderr, "e2e: slowdown %.2f (%s): livenessTTL %s, reportInterval %s, deadlines ×%.2f\n", slowdown, why, ttl, reportInterval, slowdown)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// build builds keel into out.
func build(out string, race bool) error {
	return buildPackage(out, race, "github.com/keel-dev/keel/cmd/keel")
}

// buildPackage builds the command pkg into out.
func buildPackage(out string, race bool, pkg string) error {
	// go test puts its own go first in PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("building %s: %w", pkg, err)
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, pkg)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// Short cluster settings, so that a dead node's work moves within seconds,
// on an idle machine; TestMain scales ttl and reportInterval by the
// slowdown it measures, so that a busy machine's late reports are not
// taken for deaths.
var (
	ttl            = 6 * time.Second
	reportInterval = 2 * time.Second
)

const poll = time.Second

// subnets returns a pod and a service /16 of 127.0.0.0/8 that no other
// cluster uses, of this process or of any other test process (a file lock
// holds them until the test ends).
func subnets(t testing.TB) (pod, service netip.Prefix) {
	t.Helper()
	p, err := loopnet.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	return p.A, p.B
}

// cluster is a local cluster under test, with the context that bounds the
// test.
type cluster struct {
	*localcluster.Cluster
	t   testing.TB
	ctx context.Context
}

// newCluster creates a cluster in a temporary directory with opts.Files
// committed, starts an agent on every node, and bounds the test with
// timeout. Teardown, the check for data races in the agents and, on
// failure, the agents' logs are taken care of.
func newCluster(t testing.TB, timeout time.Duration, opts localcluster.Options) *cluster {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Keel == "" {
		opts.Keel = keelBin
	}
	if !opts.PodCIDR.IsValid() {
		opts.PodCIDR, opts.ServiceCIDR = subnets(t)
	}
	if opts.LivenessTTL == 0 {
		opts.LivenessTTL = ttl
		opts.ReportInterval = reportInterval
	}
	if opts.Poll == 0 {
		opts.Poll = poll
	}
	lc, err := localcluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{Cluster: lc, t: t}
	t.Cleanup(func() {
		lc.Teardown()
		c.checkRaces()
		if t.Failed() {
			c.dumpLogs()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), scaled(timeout))
	t.Cleanup(cancel)
	c.ctx = ctx
	for _, n := range lc.Nodes {
		if err := lc.Start(n); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// checkRaces fails the test when the race detector found a data race in
// an agent (built with -race when the tests are).
func (c *cluster) checkRaces() {
	for _, n := range c.Nodes {
		b, err := os.ReadFile(filepath.Join(c.StateDir(n), "agent.log"))
		if err != nil {
			continue
		}
		if i := bytes.Index(b, []byte("WARNING: DATA RACE")); i >= 0 {
			end := min(len(b), i+6000)
			c.t.Errorf("agent %s: data race:\n%s", n, b[i:end])
		}
	}
}

// dumpLogs shows the end of every agent's log.
func (c *cluster) dumpLogs() {
	for _, n := range c.Nodes {
		b, err := os.ReadFile(filepath.Join(c.StateDir(n), "agent.log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		c.t.Logf("agent %s, end of its log:\n%s", n, strings.Join(lines, "\n"))
	}
}

// commit commits files (an empty content removes a file) and pushes.
func (c *cluster) commit(msg string, files map[string]string) string {
	c.t.Helper()
	h, err := c.Commit(msg, files)
	if err != nil {
		c.t.Fatal(err)
	}
	return h
}

// converge waits until the cluster runs the tip, each instance once.
func (c *cluster) converge(what string) {
	c.t.Helper()
	// Specs that do not render never converge: say so now, not at the
	// deadline.
	if _, err := c.Model(); err != nil {
		c.t.Fatalf("%s: the specs committed do not render: %v", what, err)
	}
	start := time.Now()
	if err := c.WaitConverged(c.ctx); err != nil {
		c.t.Fatalf("%s: not converged: %v", what, err)
	}
	c.t.Logf("%s: converged in %s", what, time.Since(start).Round(10*time.Millisecond))
}

// waitFor waits until cond holds, failing the test at the deadline.
func (c *cluster) waitFor(what string, cond func() (bool, string)) {
	c.t.Helper()
	if err := c.WaitFor(c.ctx, cond); err != nil {
		c.t.Fatalf("waiting until %s: %v", what, err)
	}
}

// statuses asks every running agent for its status.
func (c *cluster) statuses() (map[string]agent.Status, error) {
	out := map[string]agent.Status{}
	for _, n := range c.Nodes {
		if !c.Running(n) {
			continue
		}
		st, err := c.Status(c.ctx, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		out[n] = st
	}
	return out, nil
}

// mustStatuses is statuses, retried until the deadline: an agent that is
// busy or just restarted may not answer at once.
func (c *cluster) mustStatuses() map[string]agent.Status {
	c.t.Helper()
	var out map[string]agent.Status
	c.waitFor("every agent answers", func() (bool, string) {
		var err error
		out, err = c.statuses()
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

// runningOn maps each instance reported running to the nodes that report it.
func runningOn(sts map[string]agent.Status) map[string][]string {
	out := map[string][]string{}
	for _, n := range slices.Sorted(mapKeys(sts)) {
		for _, in := range sts[n].Report.Instances {
			if in.State == report.StateRunning {
				out[in.Name] = append(out[in.Name], n)
			}
		}
	}
	return out
}

// reported returns the instance as node's status reports it, or nil.
func reported(st agent.Status, name string) *report.Instance {
	return st.Report.Instance(name)
}

// model renders the work tree.
func (c *cluster) model() *render.Model {
	c.t.Helper()
	m, err := c.Model()
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

// tip is the commit on main in the served repository.
func (c *cluster) tip() string {
	c.t.Helper()
	h, err := c.Tip()
	if err != nil {
		c.t.Fatal(err)
	}
	return h
}

// published reads the reports published in the served repository.
func (c *cluster) published() (map[string]report.Report, error) {
	repo, err := git.PlainOpen(c.Bare)
	if err != nil {
		return nil, err
	}
	reports, problems, err := sync.ReadReports(repo, render.DefaultReportRefPrefix)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("report problems: %s", strings.Join(problems, "; "))
	}
	out := map[string]report.Report{}
	for _, r := range reports {
		out[r.Node] = r
	}
	return out, nil
}

// mustPublished is published, retried until the deadline: git may be
// writing a ref just then.
func (c *cluster) mustPublished() map[string]report.Report {
	c.t.Helper()
	var out map[string]report.Report
	c.waitFor("the published reports can be read", func() (bool, string) {
		var err error
		out, err = c.published()
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

// proc is a live process that carries an instance's environment.
type proc struct {
	PID      int
	Instance string
	Root     string // KEEL_DRIVER_ROOT: the state directory of its node
	Env      map[string]string
}

// instanceProcs lists the live (not zombie) processes whose environment
// names an instance of one of roots (state directories), from /proc.
func instanceProcs(roots ...string) []proc {
	want := map[string]bool{}
	for _, r := range roots {
		want[realPath(r)] = true
	}
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, ok := procEnv(pid)
		if !ok || env["KEEL_INSTANCE"] == "" || !want[env["KEEL_DRIVER_ROOT"]] || !procAlive(pid) {
			continue
		}
		out = append(out, proc{PID: pid, Instance: env["KEEL_INSTANCE"], Root: env["KEEL_DRIVER_ROOT"], Env: env})
	}
	return out
}

func procEnv(pid int) (map[string]string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, false
	}
	env := map[string]string{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env, true
}

// procAlive reports whether pid exists and is not a zombie.
func procAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}

func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// stateDirs returns the state directories of the given nodes, or of all.
func (c *cluster) stateDirs(nodes ...string) []string {
	if len(nodes) == 0 {
		nodes = c.Nodes
	}
	var out []string
	for _, n := range nodes {
		out = append(out, c.StateDir(n))
	}
	return out
}

// nodeOf maps a state directory back to its node.
func (c *cluster) nodeOf(root string) string {
	for _, n := range c.Nodes {
		if realPath(c.StateDir(n)) == root {
			return n
		}
	}
	return root
}

// placement is where an instance's process runs.
type placement struct {
	Node string
	PID  int
}

// procsByInstance lists the instance processes of the whole cluster, by
// instance.
func (c *cluster) procsByInstance() map[string][]placement {
	out := map[string][]placement{}
	for _, p := range instanceProcs(c.stateDirs()...) {
		out[p.Instance] = append(out[p.Instance], placement{Node: c.nodeOf(p.Root), PID: p.PID})
	}
	return out
}

// checkOneEach fails unless every instance of the model has exactly one
// process in the cluster, and no other instance has any; it returns where
// each runs.
func (c *cluster) checkOneEach(m *render.Model) map[string]placement {
	c.t.Helper()
	procs := c.procsByInstance()
	out := map[string]placement{}
	for _, inst := range m.Instances {
		switch ps := procs[inst.Name]; len(ps) {
		case 1:
			out[inst.Name] = ps[0]
		default:
			c.t.Errorf("instance %s has %d processes: %v", inst.Name, len(ps), ps)
		}
	}
	for name, ps := range procs {
		if m.Instance(name) == nil {
			c.t.Errorf("instance %s is not in the specs but has processes: %v", name, ps)
		}
	}
	return out
}

// httpGet GETs http://addr:port/ and returns the body.
func httpGet(ctx context.Context, addr netip.Addr, port int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, scaled(3*time.Second))
	defer cancel()
	u := "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(port)) + "/"
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return string(b), nil
}

// agentPID finds the PID of node's agent from /proc (localcluster keeps
// its processes to itself).
func (c *cluster) agentPID(node string) int {
	c.t.Helper()
	state := c.StateDir(node)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 1 && args[1] == "agent" && slices.Contains(args, state) && procAlive(pid) {
			return pid
		}
	}
	c.t.Fatalf("no agent process found for %s", node)
	return 0
}

// stopInstances stops every instance of node for good, through the process
// driver, as if the node had lost power with its agent.
func (c *cluster) stopInstances(node string) {
	c.t.Helper()
	d, err := processDriver(c.StateDir(node))
	if err != nil {
		c.t.Fatal(err)
	}
	running, err := d.Running(c.ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	for name := range running {
		if err := d.Stop(c.ctx, name, time.Second); err != nil {
			c.t.Fatal(err)
		}
	}
}

// killAgent kills node's agent with SIGKILL; its instances keep running.
func (c *cluster) killAgent(node string) {
	c.t.Helper()
	if err := c.Stop(node, syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
}

// procStatusField reads a "Name:  value" line of /proc/<pid>/status.
func procStatusField(pid int, field string) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s in /proc/%d/status", field, pid)
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

// metric reads one sample of node's /metrics: the line that starts with
// series (a name, with its labels if any).
func (c *cluster) metric(node, series string) (float64, error) {
	addr, err := c.MetricsAddr(c.ctx, node)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, scaled(5*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s in /metrics", node, series)
}

// waitAllAlive waits until every running agent sees every running agent
// alive, so that new work is spread over all of them rather than started
// by whichever agent believes itself alone.
func (c *cluster) waitAllAlive() {
	c.t.Helper()
	c.waitAlive("every agent sees the others alive", false)
}

// waitSettled waits as waitAllAlive does, and until no running agent's
// plan holds a node settling (planner.SettlePeriod): from then on each of
// them may take another node's instances. Each plan judges by the reports
// of its last fetch, so a fixed sleep of the settle period is not enough:
// a plan may hold a node settling for up to a poll interval longer (with
// a ring, the safety poll: max(--poll, reportInterval)), and two plans
// that disagree on it place a moved replica on two nodes. The metrics are
// the last plan's: in a quiet cluster whose agents fetch rarely (a long
// safety poll) they stay as they were.
func (c *cluster) waitSettled() {
	c.t.Helper()
	c.waitAlive("every agent sees the others alive and settled", true)
}

// waitAlive is waitAllAlive, and waitSettled when settled is true: alive
// and settling are read in one condition, since a plan that dropped a
// node to dead also shows none settling.
func (c *cluster) waitAlive(what string, settled bool) {
	c.t.Helper()
	c.waitFor(what, func() (bool, string) {
		var running []string
		for _, n := range c.Nodes {
			if c.Running(n) {
				running = append(running, n)
			}
		}
		for _, n := range running {
			alive, err := c.metric(n, "keel_nodes_alive")
			if err != nil {
				return false, err.Error()
			}
			if int(alive) != len(running) {
				return false, fmt.Sprintf("%s sees %d nodes alive, not %d", n, int(alive), len(running))
			}
			if !settled {
				continue
			}
			settling, err := c.metric(n, "keel_nodes_settling")
			if err != nil {
				return false, err.Error()
			}
			if settling != 0 {
				return false, fmt.Sprintf("%s sees %d nodes settling", n, int(settling))
			}
		}
		return true, ""
	})
}

// waitEndpoints waits until every agent proxies service to exactly the
// replicas that run (so that its last fetch saw every node's last report).
func (c *cluster) waitEndpoints(service string, port int) {
	c.t.Helper()
	c.waitFor("every agent proxies "+service+" to its running replicas", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		var want []string
		for _, st := range sts {
			for _, ri := range st.Report.Instances {
				if ri.State == report.StateRunning && strings.HasPrefix(ri.Name, service+"-") {
					want = append(want, netip.AddrPortFrom(ri.Address, uint16(port)).String())
				}
			}
		}
		slices.Sort(want)
		for n, st := range sts {
			var got []string
			for _, s := range st.Report.Services {
				if s.Name == service {
					got = slices.Sorted(slices.Values(s.Endpoints))
				}
			}
			if !slices.Equal(got, want) {
				return false, fmt.Sprintf("%s proxies %s to %v, the replicas run at %v", n, service, got, want)
			}
		}
		return true, ""
	})
}

// logContains reports whether node's agent log contains s, and the line.
func (c *cluster) logContains(node, s string) (bool, string) {
	b, err := os.ReadFile(filepath.Join(c.StateDir(node), "agent.log"))
	if err != nil {
		return false, ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, s) {
			return true, line
		}
	}
	return false, ""
}

func itoa(i int) string { return strconv.Itoa(i) }
