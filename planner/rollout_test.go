package planner

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// replica is one replica as a test's world holds it: on node a, b or c
// by index, at the rendered spec or not, ready or not.
type replica struct {
	outdated   bool // runs the spec before editEnv was undone
	state      report.State
	ready      *bool     // nil: an agent that runs no checks
	readySince time.Time // zero: since ever
	specSince  time.Time
	// pullSince, when set, is since when its node waits for the image of
	// the rendered spec (report.Pull).
	pullSince time.Time
}

var yes, no = ptr(true), ptr(false)

func ptr[T any](v T) *T { return &v }

// rolloutWorld is a Service web of n replicas on nodes a, b and c, and
// the reports that say how each replica runs, dated at secs(0).
func rolloutWorld(t *testing.T, n int, st render.Strategy, reps map[int]replica) (*render.Model, []report.Report) {
	t.Helper()
	m := repoDef{Nodes: tableNodes("a", "b", "c"),
		Workloads: []workloadDef{{Service: true, Name: "web", Replicas: n, Env: map[string]string{"X": "1"}}}}.model(t)
	m.Services[0].Strategy = st
	nodes := []string{"a", "b", "c"}
	byNode := map[string][]report.Instance{}
	for i := range n {
		r, ok := reps[i]
		if !ok {
			continue
		}
		name := fmt.Sprintf("web-%d", i)
		hash := hashOf(t, m, name)
		if r.outdated {
			hash = hashAfter(t, m, name, editEnv)
		}
		node := nodes[i%3]
		ri := report.Instance{Name: name, State: r.state, SpecHash: hash, Ready: r.ready, ReadySince: r.readySince, SpecSince: r.specSince,
			Address: mustAddr(fmt.Sprintf("10.200.%d.%d", i%3+1, 10+i))}
		if !r.pullSince.IsZero() {
			ri.Pull = &report.Pull{Image: "registry.example.org/web@sha256:" + strings.Repeat("0", 64), SpecHash: hashOf(t, m, name), Since: r.pullSince}
		}
		byNode[node] = append(byNode[node], ri)
	}
	var rs []report.Report
	for _, node := range nodes {
		rs = append(rs, reportOf(node, secs(0), byNode[node]...))
	}
	return m, rs
}

func released(p *Plan) []string {
	var out []string
	for _, pl := range p.Placements {
		if pl.Released {
			out = append(out, pl.Instance)
		}
	}
	return out
}

func endpointNames(s *Service) []string {
	var out []string
	for _, ep := range s.Endpoints {
		out = append(out, ep.Instance)
	}
	return out
}

func running(outdated bool, ready *bool) replica {
	return replica{outdated: outdated, state: report.StateRunning, ready: ready}
}

func TestEndpointsFollowReadiness(t *testing.T) {
	m, rs := rolloutWorld(t, 4, render.Strategy{}, map[int]replica{
		0: running(false, yes),
		1: running(false, no),  // started, its port not bound yet
		2: running(false, nil), // an older agent: running counts as ready
		3: {state: report.StateStarting, ready: no},
	})
	p := plan(m, rs...)
	if got := endpointNames(planService(p, "web")); !slices.Equal(got, []string{"web-0", "web-2"}) {
		t.Fatalf("endpoints %v, want the ready replicas web-0 and web-2", got)
	}
}

func TestReleasedReplicaLeavesEndpoints(t *testing.T) {
	// Every node plans the same from the same reports: the replica a
	// node is about to restart leaves every proxy in the same plan.
	m, rs := rolloutWorld(t, 3, render.Strategy{}, map[int]replica{0: running(true, yes), 1: running(true, yes), 2: running(true, yes)})
	p := plan(m, rs...)
	if got := released(p); !slices.Equal(got, []string{"web-0"}) {
		t.Fatalf("released %v, want web-0", got)
	}
	if got := endpointNames(planService(p, "web")); !slices.Equal(got, []string{"web-1", "web-2"}) {
		t.Fatalf("endpoints %v, want web-1 and web-2 (web-0 drains)", got)
	}
}

func TestMaxUnavailable(t *testing.T) {
	all := func(n int) map[int]replica {
		out := map[int]replica{}
		for i := range n {
			out[i] = running(true, yes)
		}
		return out
	}
	cases := []struct {
		name string
		n    int
		st   render.Strategy
		reps map[int]replica
		want []string
		// waiting is what the rollout waits for while it holds replicas
		// back (Rollout.Waiting): those released and those not available.
		waiting []string
	}{
		{name: "two at once", n: 5, st: render.Strategy{MaxUnavailable: 2}, reps: all(5), want: []string{"web-0", "web-1"},
			waiting: []string{"web-0", "web-1"}},
		{name: "one already restarting leaves room for one", n: 5, st: render.Strategy{MaxUnavailable: 2},
			reps: func() map[int]replica { r := all(5); r[0] = replica{state: report.StateStarting, ready: no}; return r }(),
			want: []string{"web-1"}, waiting: []string{"web-0", "web-1"}},
		{name: "a crashed up-to-date replica uses the budget", n: 3, st: render.Strategy{MaxUnavailable: 1},
			reps:    func() map[int]replica { r := all(3); r[2] = replica{state: report.StateCrashLoop, ready: no}; return r }(),
			waiting: []string{"web-2"}},
		{name: "an outdated replica that serves nothing goes at once", n: 3, st: render.Strategy{MaxUnavailable: 1},
			reps: func() map[int]replica {
				r := all(3)
				r[1] = replica{outdated: true, state: report.StateRunning, ready: no}
				return r
			}(),
			want: []string{"web-1"}},
		{name: "a replica with no report yet counts as unavailable", n: 3, st: render.Strategy{MaxUnavailable: 1},
			reps: map[int]replica{0: running(true, yes), 1: running(true, yes)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, rs := rolloutWorld(t, tc.n, tc.st, tc.reps)
			p := plan(m, rs...)
			if got := released(p); !slices.Equal(got, tc.want) {
				t.Fatalf("released %v, want %v", got, tc.want)
			}
			if tc.waiting != nil {
				if ro := planService(p, "web").Rollout; ro == nil || !slices.Equal(ro.Waiting, tc.waiting) {
					t.Errorf("rollout %+v: want waiting for %v", ro, tc.waiting)
				}
			}
		})
	}
}

func TestMinReadySeconds(t *testing.T) {
	st := render.Strategy{MaxUnavailable: 1, MinReadySeconds: 5}
	updated := func(readyFor int) replica {
		return replica{state: report.StateRunning, ready: yes, readySince: secs(-readyFor), specSince: secs(-readyFor - 1)}
	}
	m, rs := rolloutWorld(t, 3, st, map[int]replica{0: updated(3), 1: running(true, yes), 2: running(true, yes)})
	if got := released(plan(m, rs...)); len(got) != 0 {
		t.Fatalf("released %v while web-0 has been ready for 3 s of the 5 required", got)
	}
	m, rs = rolloutWorld(t, 3, st, map[int]replica{0: updated(6), 1: running(true, yes), 2: running(true, yes)})
	if got := released(plan(m, rs...)); !slices.Equal(got, []string{"web-1"}) {
		t.Fatalf("released %v once web-0 has been ready for 6 s, want web-1", got)
	}
}

// TestReadyAfterClusterTimeCounts: an agent plans at the time of its last
// fetch, and its own replica may have turned ready after that. Without
// minReadySeconds the replica counts as available at once, so the pass
// that sees it ready releases the next one (and the report that says it
// is ready already shows that node's proxies without the next).
func TestReadyAfterClusterTimeCounts(t *testing.T) {
	justReady := replica{state: report.StateRunning, ready: yes, readySince: secs(2), specSince: secs(1)}
	m, rs := rolloutWorld(t, 3, render.Strategy{MaxUnavailable: 1}, map[int]replica{0: justReady, 1: running(true, yes), 2: running(true, yes)})
	if got := released(plan(m, rs...)); !slices.Equal(got, []string{"web-1"}) {
		t.Fatalf("released %v with web-0 ready after the cluster time, want web-1", got)
	}
	m, rs = rolloutWorld(t, 3, render.Strategy{MaxUnavailable: 1, MinReadySeconds: 1}, map[int]replica{0: justReady, 1: running(true, yes), 2: running(true, yes)})
	if got := released(plan(m, rs...)); len(got) != 0 {
		t.Fatalf("released %v with minReadySeconds 1 and web-0 ready after the cluster time", got)
	}
}

func TestProgressDeadline(t *testing.T) {
	broken := func(startedAgo time.Duration) replica {
		return replica{state: report.StateRunning, ready: no, specSince: t0.Add(-startedAgo)}
	}
	reps := func(r replica) map[int]replica {
		return map[int]replica{0: r, 1: running(true, yes), 2: running(true, yes)}
	}
	t.Run("within the deadline the rollout waits", func(t *testing.T) {
		m, rs := rolloutWorld(t, 3, render.Strategy{MaxUnavailable: 1, ProgressDeadline: render.Duration(time.Minute)}, reps(broken(30*time.Second)))
		p := plan(m, rs...)
		ro := planService(p, "web").Rollout
		if ro == nil || ro.Paused || len(released(p)) != 0 || warningOf(p, WarnRolloutWaiting, "web") == nil || !slices.Equal(ro.Waiting, []string{"web-0"}) {
			t.Fatalf("rollout %+v released %v warnings %v: want waiting for web-0, not paused", ro, released(p), p.Warnings)
		}
	})
	t.Run("past it a pause releases nothing more", func(t *testing.T) {
		// maxUnavailable 2 would otherwise release web-1.
		m, rs := rolloutWorld(t, 3, render.Strategy{MaxUnavailable: 2, ProgressDeadline: render.Duration(time.Minute)}, reps(broken(2*time.Minute)))
		p := plan(m, rs...)
		ro := planService(p, "web").Rollout
		if ro == nil || !ro.Paused || !slices.Equal(ro.Failed, []string{"web-0"}) || len(released(p)) != 0 {
			t.Fatalf("rollout %+v released %v: want paused on web-0, nothing released", ro, released(p))
		}
		if w := warningOf(p, WarnRolloutPaused, "web"); w == nil {
			t.Fatalf("no %s warning: %v", WarnRolloutPaused, p.Warnings)
		}
		if got := endpointNames(planService(p, "web")); !slices.Equal(got, []string{"web-1", "web-2"}) {
			t.Fatalf("endpoints %v, want the old replicas serving", got)
		}
	})
	t.Run("failureAction continue goes on", func(t *testing.T) {
		m, rs := rolloutWorld(t, 3, render.Strategy{MaxUnavailable: 1, ProgressDeadline: render.Duration(time.Minute), FailureAction: render.FailureContinue}, reps(broken(2*time.Minute)))
		p := plan(m, rs...)
		if ro := planService(p, "web").Rollout; ro == nil || ro.Paused || !slices.Equal(released(p), []string{"web-1"}) {
			t.Fatalf("rollout %+v released %v: want web-1 released past the failed web-0", ro, released(p))
		}
	})
	t.Run("git revert rolls the failed replica back at once", func(t *testing.T) {
		// After the revert the rendered spec is the old one again: the
		// failed replica is the outdated one, and serves nothing.
		m, rs := rolloutWorld(t, 3, render.Strategy{MaxUnavailable: 1, ProgressDeadline: render.Duration(time.Minute)},
			map[int]replica{0: {outdated: true, state: report.StateRunning, ready: no, specSince: secs(-600)}, 1: running(false, yes), 2: running(false, yes)})
		p := plan(m, rs...)
		if ro := planService(p, "web").Rollout; ro == nil || ro.Paused || !slices.Equal(released(p), []string{"web-0"}) {
			t.Fatalf("rollout %+v released %v: want web-0 released", ro, released(p))
		}
	})
}

// TestPullPastTheDeadline: a replica whose node waits for its new image
// keeps its old copy running (reported ready at the old spec, released
// and so drained); past the progressDeadline the rollout pauses on it,
// and it stays released while the others are left alone.
func TestPullPastTheDeadline(t *testing.T) {
	pulling := func(ago time.Duration) map[int]replica {
		r := running(true, yes)
		r.pullSince = t0.Add(-ago)
		return map[int]replica{0: r, 1: running(true, yes), 2: running(true, yes)}
	}
	st := render.Strategy{MaxUnavailable: 1, ProgressDeadline: render.Duration(time.Minute)}
	t.Run("within the deadline", func(t *testing.T) {
		m, rs := rolloutWorld(t, 3, st, pulling(30*time.Second))
		p := plan(m, rs...)
		if ro := planService(p, "web").Rollout; ro == nil || ro.Paused || !slices.Equal(released(p), []string{"web-0"}) {
			t.Fatalf("rollout %+v released %v: want web-0 released, not paused", ro, released(p))
		}
	})
	for _, mu := range []int{1, 2} {
		t.Run(fmt.Sprintf("past it, maxUnavailable %d", mu), func(t *testing.T) {
			st := st
			st.MaxUnavailable = mu
			m, rs := rolloutWorld(t, 3, st, pulling(2*time.Minute))
			p := plan(m, rs...)
			ro := planService(p, "web").Rollout
			if ro == nil || !ro.Paused || !slices.Equal(ro.Failed, []string{"web-0"}) || !slices.Equal(released(p), []string{"web-0"}) {
				t.Fatalf("rollout %+v released %v: want paused on web-0, only web-0 released", ro, released(p))
			}
			if got := endpointNames(planService(p, "web")); !slices.Equal(got, []string{"web-1", "web-2"}) {
				t.Fatalf("endpoints %v, want the others serving", got)
			}
		})
	}
	t.Run("keel plan shows the failing pull", func(t *testing.T) {
		m, rs := rolloutWorld(t, 3, st, pulling(2*time.Minute))
		rs[0].Instances[0].Pull.Error, rs[0].Instances[0].Pull.Failures = "MANIFEST_UNKNOWN", 7
		p := plan(m, rs...)
		var reason string
		for _, c := range Pending(m, p, rs) {
			if c.Instance == "web-0" {
				reason = c.Reason
			}
		}
		if !strings.Contains(reason, "pulling registry.example.org/web@sha256:") || !strings.Contains(reason, "MANIFEST_UNKNOWN (7 failures)") {
			t.Fatalf("web-0's pending change says %q", reason)
		}
	})
	t.Run("a pull for another spec is not this rollout's", func(t *testing.T) {
		m, rs := rolloutWorld(t, 3, st, pulling(2*time.Minute))
		rs[0].Instances[0].Pull.SpecHash = strings.Repeat("ab", 24)
		p := plan(m, rs...)
		if ro := planService(p, "web").Rollout; ro == nil || ro.Paused {
			t.Fatalf("rollout %+v paused by a pull for another spec", ro)
		}
	})
}

// TestRolloutSimulation drives whole rollouts step by step: at each step
// the replicas released by the plan restart at the new spec, and become
// ready a random number of steps later; reports reach the planner late
// (each node's report may be some steps old). The available replicas never
// fall below Replicas − maxUnavailable as the up-to-date world has them,
// and the rollout always finishes.
func TestRolloutSimulation(t *testing.T) {
	for seed := range 200 {
		n := 2 + seed%5
		maxUnavail := 1 + seed%2
		rng := uint64(seed)*0x9e3779b97f4a7c15 + 1
		rand := func(k int) int {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			return int(rng % uint64(k))
		}
		m, _ := rolloutWorld(t, n, render.Strategy{MaxUnavailable: maxUnavail}, nil)
		type world struct {
			outdated bool
			readyAt  int // the step from which it is ready
		}
		cur := make([]world, n)
		for i := range cur {
			cur[i] = world{outdated: true, readyAt: -1000}
		}
		var history [][]world
		lag := rand(3)
		for step := 0; ; step++ {
			if step > 100*n {
				t.Fatalf("seed %d: the rollout of %d replicas did not finish in %d steps", seed, n, step)
			}
			history = append(history, slices.Clone(cur))
			seenAt := history[max(0, len(history)-1-lag)]
			reps := map[int]replica{}
			for i, w := range seenAt {
				ready := yes
				if w.readyAt > step-lag {
					ready = no
				}
				reps[i] = replica{outdated: w.outdated, state: report.StateRunning, ready: ready}
			}
			_, rs := rolloutWorld(t, n, render.Strategy{MaxUnavailable: maxUnavail}, reps)
			p := plan(m, rs...)
			done := true
			for i := range cur {
				if cur[i].outdated || cur[i].readyAt > step {
					done = false
				}
			}
			if done {
				break
			}
			for _, name := range released(p) {
				var i int
				fmt.Sscanf(name, "web-%d", &i)
				if cur[i].outdated {
					cur[i] = world{outdated: false, readyAt: step + 1 + rand(3)}
				}
			}
			avail := 0
			for _, w := range cur {
				if w.readyAt <= step {
					avail++
				}
			}
			// A release acts at once here, while the reports seen lag: a
			// stale view releases only replicas it sees outdated, which
			// are no longer, or ones whose predecessors it saw ready.
			if avail < n-maxUnavail {
				t.Fatalf("seed %d step %d: %d of %d replicas available, fewer than %d", seed, step, avail, n, n-maxUnavail)
			}
		}
	}
}

func TestSurge(t *testing.T) {
	m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{{Service: true, Name: "web", Replicas: 3,
		Env: map[string]string{"X": "1"}, Strategy: map[string]any{"maxSurge": 1, "maxUnavailable": 0}}}}.model(t)
	if svc := m.Service("web"); !slices.Equal(svc.Surge, []string{"web-3"}) || svc.Strategy.MaxUnavailable != 0 {
		t.Fatalf("web %+v: want one surge instance web-3 and maxUnavailable 0", svc)
	}
	nodes := []string{"a", "b", "c", "a"}
	reportsOf := func(reps map[string]replica) []report.Report {
		byNode := map[string][]report.Instance{}
		for i, name := range []string{"web-0", "web-1", "web-2", "web-3"} {
			r, ok := reps[name]
			if !ok {
				continue
			}
			hash := hashOf(t, m, name)
			if r.outdated {
				hash = hashAfter(t, m, name, editEnv)
			}
			byNode[nodes[i]] = append(byNode[nodes[i]], report.Instance{Name: name, State: r.state, SpecHash: hash, Ready: r.ready,
				Address: mustAddr(fmt.Sprintf("10.200.%d.%d", i%3+1, 10+i))})
		}
		var rs []report.Report
		for _, n := range []string{"a", "b", "c"} {
			rs = append(rs, reportOf(n, secs(0), byNode[n]...))
		}
		return rs
	}
	steady := map[string]replica{"web-0": running(false, yes), "web-1": running(false, yes), "web-2": running(false, yes)}
	p := plan(m, reportsOf(steady)...)
	if pl := placementOf(p, "web-3"); pl != nil || unschedulableOf(p, "web-3") != nil || planService(p, "web").Rollout != nil {
		t.Fatalf("steady state: web-3 placed %+v, rollout %+v: want no surge", pl, planService(p, "web").Rollout)
	}
	// A crash at steady state is no rollout: no surge either.
	crashed := map[string]replica{"web-0": {state: report.StateCrashLoop, ready: no}, "web-1": running(false, yes), "web-2": running(false, yes)}
	if pl := placementOf(plan(m, reportsOf(crashed)...), "web-3"); pl != nil {
		t.Fatalf("a crashed replica at steady state placed the surge instance on %s", pl.Node)
	}
	// A push: every replica is outdated. The surge instance is placed
	// first, and no replica is released until it is ready (maxUnavailable 0).
	pushed := map[string]replica{"web-0": running(true, yes), "web-1": running(true, yes), "web-2": running(true, yes)}
	p = plan(m, reportsOf(pushed)...)
	if pl := placementOf(p, "web-3"); pl == nil || len(released(p)) != 0 {
		t.Fatalf("after the push: web-3 placed %+v, released %v: want the surge placed and nothing released", pl, released(p))
	}
	pushed["web-3"] = running(false, no)
	if p = plan(m, reportsOf(pushed)...); len(released(p)) != 0 {
		t.Fatalf("released %v while the surge instance is not ready", released(p))
	}
	pushed["web-3"] = running(false, yes)
	p = plan(m, reportsOf(pushed)...)
	if got := released(p); !slices.Equal(got, []string{"web-0"}) {
		t.Fatalf("released %v with the surge ready, want web-0", got)
	}
	if got := endpointNames(planService(p, "web")); !slices.Equal(got, []string{"web-1", "web-2", "web-3"}) {
		t.Fatalf("endpoints %v, want web-1, web-2 and the surge web-3", got)
	}
	// The last replica restarts: the surge stays until it is ready.
	last := map[string]replica{"web-0": running(false, yes), "web-1": running(false, yes), "web-2": running(false, no), "web-3": running(false, yes)}
	if pl := placementOf(plan(m, reportsOf(last)...), "web-3"); pl == nil {
		t.Fatal("the surge instance left before the last replica was ready")
	}
	last["web-2"] = running(false, yes)
	p = plan(m, reportsOf(last)...)
	if pl := placementOf(p, "web-3"); pl != nil {
		t.Fatalf("the rollout is over, the surge instance is still placed on %s", pl.Node)
	}
	if got := endpointNames(planService(p, "web")); !slices.Equal(got, []string{"web-0", "web-1", "web-2"}) {
		t.Fatalf("endpoints %v: the surge instance drains once the rollout is over", got)
	}
}
