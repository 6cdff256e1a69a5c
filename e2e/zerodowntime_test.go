//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/loadgen"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/report"
)

// web describes the web Service of the zero-downtime tests: demo-web
// replicas with a greeting, extra demo-web flags and environment, and
// optionally a readiness check and a strategy (YAML, indented for their
// place).
type web struct {
	replicas  int
	image     string
	greeting  string
	args      []string
	env       map[string]string
	readiness string // the template's checks.readiness, "" for the default (tcp on the port)
	strategy  string // spec.strategy, "" for the default
}

func (w web) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: %d
  port: %d
`, w.replicas, webPort)
	if w.strategy != "" {
		fmt.Fprintf(&b, "  strategy: %s\n", w.strategy)
	}
	command := []string{strconv.Quote(demoBin), "demo-web", "--port", `"` + itoa(webPort) + `"`}
	for _, a := range w.args {
		command = append(command, strconv.Quote(a))
	}
	fmt.Fprintf(&b, `  template:
    image: %s
    command: [%s]
    env:
      GREETING: %s
`, w.image, strings.Join(command, ", "), w.greeting)
	for _, k := range slices.Sorted(maps.Keys(w.env)) {
		fmt.Fprintf(&b, "      %s: %q\n", k, w.env[k])
	}
	if w.readiness != "" {
		fmt.Fprintf(&b, "    checks:\n      readiness: %s\n", w.readiness)
	}
	b.WriteString("    resources: {cpu: 100m, memory: 64M}\n")
	return b.String()
}

// zeroLoad is the load of every scenario: 200 requests/s through the VIP
// from twelve keep-alive clients and four that open a connection per
// request (12.5 requests/s each, so that a slow answer now and then does
// not lower the rate), plus two keep-alive clients whose every request is
// in flight for a second (see internal/loadgen).
func zeroLoad(target string) loadgen.Options {
	return loadgen.Options{URL: "http://" + target + "/", Rate: 200, KeepAlive: 12, Fresh: 4, Slow: 2, SlowDelay: time.Second}
}

// startLoad starts a load whose requests may take 10 s, stretched by the
// machine's measured slowdown.
func startLoad(tb testing.TB, opts loadgen.Options) *loadgen.Load {
	tb.Helper()
	opts.Timeout = scaled(10 * time.Second)
	l, err := loadgen.Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// TestZeroDowntime runs, on three agents and one after the other, the
// changes a client of a Service must not notice, with the load generator
// sending 200 requests/s through the Service's VIP during each; each
// scenario asserts that not one request failed:
//
//  1. a rolling env change (a restart) of 3 replicas;
//  2. an image change (a replace);
//  3. scaling up 3 → 5, then down 5 → 2;
//  4. a version that never becomes ready: the rollout pauses after one
//     replica, the others keep serving the old version, and git revert
//     rolls it back;
//  5. a version whose replicas bind their port 3 s after they start.
//
// Each scenario starts from the state the one before left and commits
// what it needs first, so that one failing leaves the next meaningful.
func TestZeroDowntime(t *testing.T) {
	t.Parallel()
	base := web{replicas: 3, image: "base/demo", greeting: "hello"}
	c := newCluster(t, 5*time.Minute, localcluster.Options{Files: map[string]string{"apps/web.yaml": base.yaml()}})
	c.converge("first commit")
	vip := c.model().Service("web").VIP.Addr
	target := net.JoinHostPort(vip.String(), itoa(webPort))
	z := &zeroDowntime{c: c, target: target, current: base}
	z.c.waitEndpoints("web", webPort)

	t.Run("1 env change", func(t *testing.T) {
		z := z.with(t)
		next := z.current
		next.greeting = "bonjour"
		res := z.underLoad("GREETING hello → bonjour", func() {
			z.push("greet in French", next)
			z.settle()
		})
		z.noFailures(res)
		z.c.checkAnswers("web", 3, "bonjour")
	})

	t.Run("2 image change", func(t *testing.T) {
		z := z.with(t)
		next := z.current
		next.image = "base/demo2"
		res := z.underLoad("image base/demo → base/demo2", func() {
			z.push("web on base/demo2", next)
			z.settle()
		})
		z.noFailures(res)
	})

	t.Run("3 scale", func(t *testing.T) {
		z := z.with(t)
		up := z.current
		up.replicas = 5
		res := z.underLoad("scale up 3 → 5", func() {
			z.push("scale web to 5", up)
			z.settle()
		})
		z.noFailures(res)
		down := up
		down.replicas = 2
		res = z.underLoad("scale down 5 → 2", func() {
			z.push("scale web to 2", down)
			z.settle()
		})
		z.noFailures(res)
	})

	t.Run("4 never ready, paused, reverted", func(t *testing.T) {
		z := z.with(t)
		// The application's own health endpoint as the readiness check,
		// and a short progressDeadline: a change of checks, rolled out.
		good := z.current
		good.replicas = 3
		good.readiness = "{http: {path: /healthz}}"
		good.strategy = "{progressDeadline: 5s}"
		z.push("web: readiness on /healthz, progressDeadline 5s", good)
		z.settle()
		old := map[string]string{}
		for _, inst := range z.c.model().Instances {
			old[inst.Name] = inst.SpecHash
		}

		bad := good
		bad.greeting = "broken"
		bad.env = map[string]string{"HEALTHZ": "fail"}
		var atNew []string
		res := z.underLoad("a version that never becomes ready, then git revert", func() {
			z.push("web: a version whose /healthz fails", bad)
			newHash := z.c.model().Instance("web-0").SpecHash
			z.c.waitFor("the rollout of web pauses", func() (ok bool, why string) {
				atNew, ok, why = z.paused(old, newHash, 1)
				return ok, why
			})
			z.load.Mark("every agent has paused the rollout")
			// It stays paused: no other replica is released while the
			// agents fetch and plan a few times more.
			deadline := time.Now().Add(3 * poll)
			for time.Now().Before(deadline) {
				if _, ok, why := z.paused(old, newHash, 1); !ok {
					t.Errorf("the paused rollout moved on: %s", why)
					break
				}
				time.Sleep(200 * time.Millisecond) // a sampling period
			}
			z.checkPlanWarns()
			z.load.Mark("git revert")
			z.revert(good)
			z.settle()
			z.c.waitFor("every agent's keel_rollout_paused{service=\"web\"} is 0", func() (bool, string) {
				return z.metricEverywhere(`keel_rollout_paused{service="web"}`, 0)
			})
		})
		z.noFailures(res)
		if n := res.Stats(nil).Greetings["broken"]; n > 0 {
			t.Errorf("the replica that never became ready answered %d requests", n)
		}
		// While paused, the replicas at the old spec served, and only they.
		from, to := res.MarkAt("every agent has paused the rollout"), res.MarkAt("git revert")
		paused := res.Stats(func(s loadgen.Sample) bool { return s.At >= from && s.At < to })
		for name := range old {
			if n := paused.Replicas[name]; slices.Contains(atNew, name) && n > 0 {
				t.Errorf("while paused, %s, at the new spec and never ready, answered %d requests", name, n)
			} else if !slices.Contains(atNew, name) && n == 0 {
				t.Errorf("while paused, %s, at the old spec, answered no request: %v", name, paused.Replicas)
			}
		}
		for name, hash := range old {
			if h := z.c.model().Instance(name).SpecHash; h != hash {
				t.Errorf("after git revert, %s's spec is %.12s, not the old %.12s", name, h, hash)
			}
		}
		z.c.checkAnswers("web", 3, good.greeting)
	})

	t.Run("5 late bind", func(t *testing.T) {
		z := z.with(t)
		// The default readiness check (tcp on the port) again.
		plain := z.current
		plain.readiness, plain.strategy = "", ""
		z.push("web: the default readiness check and strategy", plain)
		z.settle()
		late := plain
		late.args = []string{"--bind-delay", "3s"}
		res := z.underLoad("replicas that bind their port 3 s after they start", func() {
			z.push("web binds late", late)
			z.settle()
		})
		z.noFailures(res)
	})
}

// zeroDowntime is TestZeroDowntime's cluster and the web spec it runs.
type zeroDowntime struct {
	c       *cluster
	t       *testing.T
	target  string
	current web
	load    *loadgen.Load // while a scenario runs under load
}

// with is z for subtest t (whose Fatal must be called from its own
// goroutine).
func (z *zeroDowntime) with(t *testing.T) *zeroDowntime {
	c := *z.c
	c.t = t
	z.t = t
	z.c = &c
	return z
}

// push commits w as apps/web.yaml.
func (z *zeroDowntime) push(msg string, w web) {
	z.t.Helper()
	z.c.commit(msg, map[string]string{"apps/web.yaml": w.yaml()})
	z.current = w
	if z.load != nil {
		z.load.Mark("pushed: " + msg)
	}
}

// revert reverts the last commit with git revert, pushes it, and records
// that the cluster runs w again.
func (z *zeroDowntime) revert(w web) {
	z.t.Helper()
	for _, args := range [][]string{{"revert", "--no-edit", "HEAD"}, {"push", "-q", "origin", "main"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = z.c.Work
		if out, err := cmd.CombinedOutput(); err != nil {
			z.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	z.current = w
}

// settle waits until the cluster runs the tip and every agent proxies web
// to exactly its running replicas.
func (z *zeroDowntime) settle() {
	z.t.Helper()
	z.c.converge(fmt.Sprintf("web at %.10s", z.c.tip()))
	z.c.waitEndpoints("web", webPort)
	if z.load != nil {
		z.load.Mark("converged, every proxy follows")
	}
}

// underLoad runs fn with the load running, after a steady stretch of it
// to compare with, and returns what the load saw.
func (z *zeroDowntime) underLoad(what string, fn func()) loadgen.Result {
	z.t.Helper()
	drains, timeouts := z.logCount("draining instance"), z.logCount("drain timed out")
	l := startLoad(z.t, zeroLoad(z.target))
	z.load = l
	defer func() {
		z.load = nil
		l.Stop()
	}()
	// A steady stretch: 400 answers at 200/s.
	z.c.waitFor("the load runs", func() (bool, string) {
		st := l.SoFar()
		return st.Sent >= 400, fmt.Sprintf("%d requests so far, %d failed", st.Sent, st.Failed)
	})
	l.Mark("steady state until here")
	fn()
	res := l.Stop()
	steady := res.Before("steady state until here")
	during := res.After("steady state until here")
	z.t.Logf("%s: %s\n  paced requests, steady: %d, %d failed, p99 %s; during the change: %d, %d failed, p50 %s, p99 %s",
		what, res.Summary(), steady.Sent, steady.Failed, steady.P99.Round(10*time.Microsecond),
		during.Sent, during.Failed, during.P50.Round(10*time.Microsecond), during.P99.Round(10*time.Microsecond))
	z.t.Logf("%s: the agents logged %d drains, %d of them timed out", what,
		z.logCount("draining instance")-drains, z.logCount("drain timed out")-timeouts)
	return res
}

// logCount counts the lines of every agent's log that contain s.
func (z *zeroDowntime) logCount(s string) int {
	n := 0
	for _, node := range z.c.Nodes {
		b, err := os.ReadFile(z.c.LogFile(node))
		if err == nil {
			n += strings.Count(string(b), s)
		}
	}
	return n
}

// noFailures fails the test unless every request of res succeeded.
func (z *zeroDowntime) noFailures(res loadgen.Result) {
	z.t.Helper()
	if st := res.Stats(nil); st.Failed > 0 {
		z.t.Errorf("%d of %d requests failed; the first:\n  %s", st.Failed, st.Sent, strings.Join(st.Errors, "\n  "))
	}
}

// paused reports whether the rollout of web stands paused with updated
// replicas at newHash, and names them: every agent's
// keel_rollout_paused{service="web"} is 1 and has logged the pause,
// exactly updated replicas run at newHash and are not ready, and every
// other runs at its old spec, ready.
func (z *zeroDowntime) paused(old map[string]string, newHash string, updated int) (atNew []string, ok bool, why string) {
	if ok, why := z.metricEverywhere(`keel_rollout_paused{service="web"}`, 1); !ok {
		return nil, false, why
	}
	sts, err := z.c.statuses()
	if err != nil {
		return nil, false, err.Error()
	}
	for name, hash := range old {
		var seen []report.Instance
		for _, st := range sts {
			if ri := st.Report.Instance(name); ri != nil {
				seen = append(seen, *ri)
			}
		}
		if len(seen) != 1 || seen[0].State != report.StateRunning {
			return nil, false, fmt.Sprintf("%s is reported %+v", name, seen)
		}
		switch ri := seen[0]; ri.SpecHash {
		case newHash:
			if ri.IsReady() {
				return nil, false, name + " is ready at the new spec"
			}
			atNew = append(atNew, name)
		case hash:
			if !ri.IsReady() {
				return nil, false, name + " at the old spec is not ready: " + ri.Check
			}
		default:
			return nil, false, fmt.Sprintf("%s runs at %.12s, neither the old nor the new spec", name, ri.SpecHash)
		}
	}
	if len(atNew) != updated {
		return nil, false, fmt.Sprintf("%v run at the new spec, want %d replicas", atNew, updated)
	}
	for _, n := range z.c.Nodes {
		if ok, _ := z.c.logContains(n, "rollouts paused"); !ok {
			return nil, false, n + " has not logged that the rollout is paused"
		}
	}
	return atNew, true, ""
}

// metricEverywhere reports whether series has value v on every agent.
func (z *zeroDowntime) metricEverywhere(series string, v float64) (bool, string) {
	for _, n := range z.c.Nodes {
		got, err := z.c.metric(n, series)
		if err != nil {
			return false, err.Error()
		}
		if got != v {
			return false, fmt.Sprintf("%s: %s %g", n, series, got)
		}
	}
	return true, ""
}

// checkPlanWarns checks that keel plan, from the work tree and the
// published reports, says that the rollout of web is paused.
func (z *zeroDowntime) checkPlanWarns() {
	z.t.Helper()
	z.c.waitFor("keel plan says the rollout of web is paused", func() (bool, string) {
		cmd := exec.Command(keelBin, "plan", "--repo", z.c.Work, "--reports-remote", "origin", "-o", "json")
		out, err := cmd.Output()
		if err != nil {
			return false, fmt.Sprintf("keel plan: %v", err)
		}
		var plan struct {
			Warnings []planner.Warning `json:"warnings"`
		}
		if err := json.Unmarshal(out, &plan); err != nil {
			return false, err.Error()
		}
		for _, w := range plan.Warnings {
			if w.Code == planner.WarnRolloutPaused && w.Subject == "web" {
				z.t.Logf("keel plan: %s", w.Message)
				return true, ""
			}
		}
		return false, fmt.Sprintf("keel plan warns %+v", plan.Warnings)
	})
}

// TestZeroDowntimeGossip: with the gossip ring on and signed reports, the
// drains and the rollout steps take their acknowledgements over it (the
// nodes' signed reports, drainAcks) rather than from git; a rolling env
// change under load still fails no request, and reports came over the
// ring and were taken, none refused.
func TestZeroDowntimeGossip(t *testing.T) {
	t.Parallel()
	base := web{replicas: 3, image: "base/demo", greeting: "hello"}
	c := newCluster(t, 5*time.Minute, localcluster.Options{Gossip: true, ReportKeys: true, Files: map[string]string{"apps/web.yaml": base.yaml()}})
	c.converge("first commit")
	target := net.JoinHostPort(c.model().Service("web").VIP.Addr.String(), itoa(webPort))
	z := &zeroDowntime{c: c, t: t, target: target, current: base}
	z.c.waitEndpoints("web", webPort)
	timeouts := z.logCount("drain timed out")
	next := base
	next.greeting = "bonjour"
	res := z.underLoad("GREETING hello → bonjour, over the ring", func() {
		z.push("greet in French", next)
		z.settle()
	})
	z.noFailures(res)
	z.c.checkAnswers("web", 3, "bonjour")
	if n := z.logCount("drain timed out") - timeouts; n > 0 {
		t.Errorf("%d drains timed out", n)
	}
	received := 0.0
	for _, n := range c.Nodes {
		v, err := c.metric(n, `keel_drain_ack_messages_total{event="received"}`)
		if err != nil {
			t.Fatal(err)
		}
		received += v
		if r, err := c.metric(n, `keel_drain_ack_messages_total{event="rejected"}`); err != nil || r != 0 {
			t.Errorf("%s: %g reports over the ring rejected (%v)", n, r, err)
		}
	}
	if received == 0 {
		t.Error("no report came over the ring during the rollout")
	}
}
