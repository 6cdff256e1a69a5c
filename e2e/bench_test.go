//go:build linux

package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/loadgen"
	"github.com/keel-dev/keel/localcluster"
)

// minPushes is the fewest pushes the latency figures are taken over.
const minPushes = 20

// BenchmarkPushToConverged measures the time from git push to a converged
// cluster (every agent on the new commit, every instance running its new
// spec) on three nodes, each push changing the web Service's env, so that
// its three replicas restart one after the other. Run it with
// -benchtime=20x (or more): each iteration is one push, and the median and
// p95 are reported over at least 20 pushes whatever the benchtime.
func BenchmarkPushToConverged(b *testing.B) {
	b.Run("fsnotify", func(b *testing.B) { benchPushToConverged(b, nil, false) })
	b.Run("fsnotify+gossip", func(b *testing.B) { benchPushToConverged(b, nil, true) })
	b.Run("poll=1s", func(b *testing.B) { benchPushToConverged(b, []string{"--no-watch"}, false) })
}

// benchPushToConverged runs BenchmarkPushToConverged with the agents'
// extra args, and with the gossip ring on and signed reports (the drains
// and rollout steps then take their reports over it, docs/agent.md
// "Gossip") or off.
func benchPushToConverged(b *testing.B, args []string, gossip bool) {
	c := newCluster(b, 10*time.Minute, localcluster.Options{
		Poll:       time.Second,
		Gossip:     gossip,
		ReportKeys: gossip, // the ring carries signed reports only
		AgentArgs:  args,
		Files:      map[string]string{"apps/web.yaml": webService(3, "base/demo", "v0")},
	})
	c.converge("first commit")
	var took []time.Duration
	push := func() {
		n := len(took) + 1
		c.prepare(fmt.Sprintf("push %d", n), "apps/web.yaml", webService(3, "base/demo", fmt.Sprintf("v%d", n)))
		// The tip and the model to converge to are the work tree's, known
		// before the push: the poll below asks only the agents.
		out, err := exec.Command("git", "-C", c.Work, "rev-parse", "HEAD").Output()
		if err != nil {
			b.Fatal(err)
		}
		tip := strings.TrimSpace(string(out))
		m, err := c.Model()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		c.push()
		for {
			if ok, _ := c.ConvergedTo(c.ctx, tip, m); ok {
				break
			}
			if c.ctx.Err() != nil {
				b.Fatalf("push %d did not converge", n)
			}
			time.Sleep(10 * time.Millisecond) // a polling period
		}
		took = append(took, time.Since(start))
	}
	for b.Loop() {
		push()
	}
	for len(took) < minPushes {
		push()
	}
	slices.Sort(took)
	b.ReportMetric(ms(took[len(took)/2]), "median-ms")
	b.ReportMetric(ms(took[(len(took)*95+99)/100-1]), "p95-ms")
	b.ReportMetric(float64(len(took)), "pushes")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// prepare writes one file in the cluster's work tree and commits it,
// without pushing, so that the timing starts at the push itself.
func (c *cluster) prepare(msg, path, content string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.Work, filepath.FromSlash(path)), []byte(content), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.gitWork("commit", "-q", "-a", "-m", msg)
}

// push pushes the work tree's main to the served repository.
func (c *cluster) push() { c.gitWork("push", "-q", "origin", "main") }

func (c *cluster) gitWork(args ...string) {
	c.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = c.Work
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=keel e2e", "GIT_AUTHOR_EMAIL=e2e@keel.invalid",
		"GIT_COMMITTER_NAME=keel e2e", "GIT_COMMITTER_EMAIL=e2e@keel.invalid")
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// idleInstances is how many instances BenchmarkAgentIdle gives its node.
const idleInstances = 100

// BenchmarkAgentIdle measures what one agent costs when nothing changes:
// the CPU time it uses (utime+stime of /proc/<pid>/stat) over a 30 s window
// and its resident memory (VmRSS) at the end, on one node running 100
// instances (sleep processes: the agent is measured, not them). It runs
// with the end-to-end tests' settings (poll and reconcile every second, a
// report every 2 s) and with the agent's defaults (poll 10 s, reconcile
// 5 s, a report every 10 s). The window is taken once, whatever the
// benchtime: run it with -benchtime=1x.
func BenchmarkAgentIdle(b *testing.B) {
	b.Run("poll=1s,reconcile=1s", func(b *testing.B) {
		benchAgentIdle(b, localcluster.Options{})
	})
	b.Run("poll=10s,reconcile=5s", func(b *testing.B) {
		benchAgentIdle(b, localcluster.Options{Poll: 10 * time.Second, LivenessTTL: 30 * time.Second,
			ReportInterval: 10 * time.Second, AgentArgs: []string{"--reconcile-interval", "5s"}})
	})
}

func benchAgentIdle(b *testing.B, opts localcluster.Options) {
	const window = 30 * time.Second
	opts.Nodes = []string{"n1"}
	opts.Files = map[string]string{"apps/idle.yaml": fmt.Sprintf(`apiVersion: keel/v1
kind: Service
metadata:
  name: idle
spec:
  replicas: %d
  port: 9000
  template:
    image: base/demo
    command: [sleep, infinity]
    resources: {cpu: 10m, memory: 16M}
`, idleInstances)}
	c := newCluster(b, 5*time.Minute, opts)
	c.converge(fmt.Sprintf("%d instances", idleInstances))
	if got := len(instanceProcs(c.StateDir("n1"))); got != idleInstances {
		b.Fatalf("%d instance processes, want %d", got, idleInstances)
	}
	pid := c.agentPID("n1")
	time.Sleep(5 * time.Second) // let the start-up settle before measuring
	cpu0 := cpuTime(b, pid)
	time.Sleep(window) // the measurement window
	used := cpuTime(b, pid) - cpu0
	rss, err := procStatusField(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	kb, err := strconv.ParseFloat(strings.TrimSuffix(rss, " kB"), 64)
	if err != nil {
		b.Fatalf("VmRSS %q: %v", rss, err)
	}
	for b.Loop() {
		// Nothing to time per iteration: the figures are the metrics.
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(used)/float64(time.Millisecond)/window.Seconds(), "cpu-ms/s")
	b.ReportMetric(kb/1024, "rss-MB")
}

// cpuTime is the user and system time pid has used, from /proc/<pid>/stat.
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// After the command: state is field 3 of the line, utime 14, stime 15.
	utime, err1 := strconv.ParseInt(fields[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux platform Go supports.
const clockTicks = 100

// BenchmarkRolloutUnderLoad measures what clients see of a rolling update:
// a steady 200 requests/s through the web Service's VIP (twelve
// keep-alive clients and four that open a connection per request: see
// internal/loadgen) while each push changes the Service's env, so that its
// three replicas restart one after the other. It reports the requests
// that failed during all the rollouts, and the p99 latency of the
// requests sent during them against that of a steady window before the
// first push. Run it with -benchtime=5x (or more): each iteration is one
// push and its rollout.
func BenchmarkRolloutUnderLoad(b *testing.B) {
	c := newCluster(b, 10*time.Minute, localcluster.Options{
		Poll:  time.Second,
		Files: map[string]string{"apps/web.yaml": webService(3, "base/demo", "v0")},
	})
	c.converge("first commit")
	c.waitEndpoints("web", webPort)
	target := net.JoinHostPort(c.model().Service("web").VIP.Addr.String(), itoa(webPort))
	l := startLoad(b, loadgen.Options{URL: "http://" + target + "/", Rate: 200, KeepAlive: 12, Fresh: 4})
	time.Sleep(5 * time.Second) // the steady state
	l.Mark("steady")
	n := 0
	for b.Loop() {
		n++
		c.prepare(fmt.Sprintf("push %d", n), "apps/web.yaml", webService(3, "base/demo", fmt.Sprintf("v%d", n)))
		c.push()
		c.converge(fmt.Sprintf("push %d", n))
		c.waitEndpoints("web", webPort)
	}
	res := l.Stop()
	steady, during := res.Before("steady"), res.After("steady")
	b.ReportMetric(float64(during.Failed), "failed")
	b.ReportMetric(float64(during.Sent), "requests")
	b.ReportMetric(ms(steady.P99), "steady-p99-ms")
	b.ReportMetric(ms(during.P99), "rollout-p99-ms")
	if during.Failed > 0 {
		b.Errorf("%d of %d requests failed during the rollouts: %v", during.Failed, during.Sent, during.Errors)
	}
}

// BenchmarkRolloutTime measures how long a rolling update of a 3-replica
// Service takes, from git push to every replica ready at its new spec and
// every proxy following (and, with a surge, the surge instance gone): with
// the default strategy (one replica at a time) and with maxSurge: 1 and
// maxUnavailable: 0 (a new replica first, then one old one at a time),
// each without a ring (every hand-off through git) and with the ring and
// report keys (as make demo). Run it with -benchtime=10x.
func BenchmarkRolloutTime(b *testing.B) {
	for _, bc := range []struct {
		name, strategy string
		gossip         bool
	}{
		{"default", "", false},
		{"maxSurge=1", "  strategy: {maxSurge: 1, maxUnavailable: 0}\n", false},
		{"default+gossip", "", true},
		{"maxSurge=1+gossip", "  strategy: {maxSurge: 1, maxUnavailable: 0}\n", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			spec := func(greeting string) string {
				s := webService(3, "base/demo", greeting)
				return strings.Replace(s, "  template:\n", bc.strategy+"  template:\n", 1)
			}
			c := newCluster(b, 10*time.Minute, localcluster.Options{Poll: time.Second, Gossip: bc.gossip, ReportKeys: bc.gossip,
				Files: map[string]string{"apps/web.yaml": spec("v0")}})
			c.converge("first commit")
			var took []time.Duration
			push := func() {
				n := len(took) + 1
				c.prepare(fmt.Sprintf("push %d", n), "apps/web.yaml", spec(fmt.Sprintf("v%d", n)))
				start := time.Now()
				c.push()
				for {
					if ok, _ := c.Converged(c.ctx); ok && len(c.procsByInstance()["web-3"]) == 0 {
						break
					}
					if c.ctx.Err() != nil {
						b.Fatalf("push %d did not converge", n)
					}
					time.Sleep(10 * time.Millisecond)
				}
				took = append(took, time.Since(start))
			}
			for b.Loop() {
				push()
			}
			slices.Sort(took)
			b.ReportMetric(ms(took[len(took)/2]), "median-ms")
			b.ReportMetric(ms(took[(len(took)*95+99)/100-1]), "p95-ms")
		})
	}
}
