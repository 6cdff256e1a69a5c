package planner

// A replay of several agents planning from their own views, for liveness
// hysteresis (issue 8 item 8): each node passes at its own moments
// (starved nodes skip passes, so their reports arrive around the TTL),
// plans from the reports published so far and its own, acts on its plan as
// the reconciler does (make before break for stateless copies, break
// before make for stateful ones), and publishes its report with since
// kept by the agent's rule. Every start is checked against what really
// runs and what was really published.

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// simNode is one agent and what really runs on its node.
type simNode struct {
	name   string
	offset time.Duration // its clock minus true time
	passes map[int]bool  // the seconds at which it passes
	diesAt int           // the second it dies for good (everything on it stops); -1 never
	holds  map[string]report.Instance
	// Its published reports, oldest first, and the agent's run bookkeeping.
	pushed        []report.Report
	since, lastAt time.Time
	// arrived is when each instance's copy started here, in seconds.
	arrived map[string]int
}

func (n *simNode) dead(s int) bool { return n.diesAt >= 0 && s >= n.diesAt }

// runSince is agent.runSince: the first report, or the first after a gap
// of more than ttl since the last one published.
func (n *simNode) runSince(t time.Time, ttl time.Duration) time.Time {
	last := n.lastAt
	if last.IsZero() {
		last = n.since
	}
	if n.since.IsZero() || t.Sub(last) > ttl {
		n.since = t
	}
	return n.since
}

type simMove struct {
	inst, from, to string
	at             int
}

type sim struct {
	t     fataler
	model func(s int) *render.Model
	ttl   time.Duration
	nodes []*simNode
	// last is the node that last started each instance.
	last  map[string]string
	moves []simMove
	// settleChecks counts the moves checked against a settling target.
	settleChecks int
}

func (c *sim) node(name string) *simNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// view is what node n has at second s: the newest report every other
// node published so far.
func (c *sim) view(n *simNode) []report.Report {
	var out []report.Report
	for _, o := range c.nodes {
		if o != n && len(o.pushed) > 0 {
			out = append(out, o.pushed[len(o.pushed)-1])
		}
	}
	return out
}

func (c *sim) own(n *simNode, at, clock, since time.Time) report.Report {
	r := reportOf(n.name, at)
	r.Clock, r.Since = clock, since
	for _, name := range slices.Sorted(maps.Keys(n.holds)) {
		r.Instances = append(r.Instances, n.holds[name])
	}
	return r
}

// run replays seconds 0 to end.
func (c *sim) run(end int) {
	t := c.t
	t.Helper()
	for s := 0; s <= end; s++ {
		for _, n := range c.nodes {
			if n.diesAt == s {
				clear(n.holds)
			}
		}
		for _, n := range c.nodes {
			if n.dead(s) || !n.passes[s] {
				continue
			}
			c.pass(n, s)
		}
	}
}

func (c *sim) pass(n *simNode, s int) {
	t := c.t
	t.Helper()
	m := c.model(s)
	local := t0.Add(time.Duration(s)*time.Second + n.offset)
	view := c.view(n)
	lead := MaxClockLead(m)
	at := PeerClock(m, view, local)
	if at.After(local.Add(lead)) || at.Before(local) {
		t.Fatalf("s=%d %s: report time %s outside [local %s, +%s]", s, n.name, at, local, lead)
	}
	since := n.runSince(at, c.ttl)
	reports := append(slices.Clone(view), c.own(n, at, local, since))
	p := Compute(Input{Model: m, Commit: commitC, Reports: reports, Now: local})
	if p.ClusterTime.After(local.Add(lead)) {
		t.Fatalf("s=%d %s: cluster time %s more than %s ahead of local %s", s, n.name, p.ClusterTime, lead, local)
	}
	mine := map[string]Placement{}
	elsewhere := map[string]Placement{}
	for _, pl := range p.Placements {
		if pl.Node == n.name {
			mine[pl.Instance] = pl
		} else {
			elsewhere[pl.Instance] = pl
		}
	}
	for _, name := range slices.Sorted(maps.Keys(mine)) {
		pl := mine[name]
		if _, ok := n.holds[name]; ok || len(pl.WaitsFor) > 0 {
			continue
		}
		c.start(n, s, m.Instance(name), pl, p, reports)
	}
	for _, name := range slices.Sorted(maps.Keys(n.holds)) {
		if _, ok := mine[name]; ok {
			continue
		}
		pl, placed := elsewhere[name]
		inst := m.Instance(name)
		switch {
		case !placed:
			continue // unschedulable anywhere: keep what runs
		case inst.Stateful:
		case !reportedRunning(reports, name, pl.Node):
			continue // make before break
		}
		delete(n.holds, name)
	}
	r := c.own(n, at, local, since)
	n.pushed = append(n.pushed, r)
	n.lastAt = at
}

func reportedRunning(reports []report.Report, inst, node string) bool {
	for i := range reports {
		if r := &reports[i]; r.Node == node {
			if ri := r.Instance(inst); ri != nil && ri.State == report.StateRunning {
				return true
			}
		}
	}
	return false
}

// start runs inst on n and checks the start.
func (c *sim) start(n *simNode, s int, inst *render.Instance, pl Placement, p *Plan, reports []report.Report) {
	t := c.t
	t.Helper()
	// (a) Break before make, against the truth and the starter's reports.
	if inst.Stateful {
		for _, o := range c.nodes {
			if _, ok := o.holds[inst.Name]; ok && o != n {
				t.Fatalf("s=%d: %s starts stateful %s while %s runs it", s, n.name, inst.Name, o.name)
			}
		}
		for _, r := range reports {
			if ri := r.Instance(inst.Name); r.Node != n.name && ri != nil && ri.State != report.StateStopped {
				t.Fatalf("s=%d: %s starts stateful %s while %s's report lists it %s", s, n.name, inst.Name, r.Node, ri.State)
			}
		}
	}
	if from, ok := c.last[inst.Name]; ok && from != n.name {
		c.moves = append(c.moves, simMove{inst.Name, from, n.name, s})
		// (b) A move leaves a node that is dead for good or whose newest
		// report is older than the TTL at the mover's cluster time, ...
		src := c.node(from)
		if !src.dead(s) && !inst.Stateful {
			newest := src.pushed[len(src.pushed)-1].Time
			if p.ClusterTime.Sub(newest) <= c.ttl {
				t.Fatalf("s=%d: %s moved from %s to %s, whose report is only %s old", s, inst.Name, from, n.name, p.ClusterTime.Sub(newest))
			}
		}
		// ... and goes to a node whose reports have run unbroken (no two
		// published more than the TTL apart) for the settle period.
		if !inst.Stateful {
			c.settleChecks++
			if run := p.ClusterTime.Sub(n.since); run < SettlePeriod(c.model(s)) {
				t.Fatalf("s=%d: %s moved from %s to %s, whose reports resumed after a gap %s ago (settle period %s)", s, inst.Name, from, n.name, run, SettlePeriod(c.model(s)))
			}
		}
	}
	if pl.Generation <= 0 {
		t.Fatalf("s=%d: %s started on %s with generation %d", s, inst.Name, n.name, pl.Generation)
	}
	for _, o := range c.nodes {
		if ri, ok := o.holds[inst.Name]; ok && ri.Generation >= pl.Generation {
			t.Fatalf("s=%d: %s starts %s at generation %d while %s runs generation %d", s, n.name, inst.Name, pl.Generation, o.name, ri.Generation)
		}
	}
	c.last[inst.Name] = n.name
	n.arrived[inst.Name] = s
	n.holds[inst.Name] = report.Instance{Name: inst.Name, State: report.StateRunning, SpecHash: inst.SpecHash, Generation: pl.Generation}
}

// newSim starts every node as long settled, with the instances of the
// first plan (everybody alive) running where it puts them.
func newSim(t fataler, model func(int) *render.Model, nodes []*simNode) *sim {
	m := model(0)
	c := &sim{t: t, model: model, ttl: time.Duration(m.Cluster.LivenessTTL), nodes: nodes, last: map[string]string{}}
	var rs []report.Report
	for _, n := range nodes {
		n.holds, n.arrived = map[string]report.Instance{}, map[string]int{}
		n.since = t0.Add(-time.Hour)
		rs = append(rs, reportOf(n.name, t0))
	}
	for _, pl := range Compute(Input{Model: m, Commit: commitC, Reports: rs, Now: t0}).Placements {
		n := c.node(pl.Node)
		n.holds[pl.Instance] = report.Instance{Name: pl.Instance, State: report.StateRunning, SpecHash: m.Instance(pl.Instance).SpecHash, Generation: 1}
		c.last[pl.Instance] = pl.Node
	}
	// Each node has published a report just before the replay begins.
	for _, n := range nodes {
		at := t0.Add(-time.Second + n.offset)
		n.pushed, n.lastAt = []report.Report{c.own(n, at, at, n.since)}, at
	}
	return c
}

// passSchedule returns the pass seconds of a node passing every interval
// seconds, with the given starvation gaps: {at, length} skips the passes
// in [at, at+length).
func passSchedule(end, interval int, gaps ...[2]int) map[int]bool {
	out := map[int]bool{}
	for s := 0; s <= end; s += interval {
		out[s] = true
	}
	for _, g := range gaps {
		for s := g[0]; s < g[0]+g[1]; s++ {
			delete(out, s)
		}
		out[g[0]+g[1]] = true
	}
	return out
}

func (c *sim) movesOf(inst string) []simMove {
	var out []simMove
	for _, mv := range c.moves {
		if mv.inst == inst {
			out = append(out, mv)
		}
	}
	return out
}

func (mv simMove) String() string {
	return fmt.Sprintf("%s %s→%s at %ds", mv.inst, mv.from, mv.to, mv.at)
}

// Issue 8 item 8, regression: two starved nodes whose reports arrive
// around the TTL (gaps of 31 to 33 s for a TTL of 30 s, overlapping). The
// first gap of a moves web-0 to b, once. On the old rule, b's gap, which
// begins before a has reported again, then moved web-0 back to a, which
// had reported again for less than a TTL: a second move, and back. Now a
// is settling and takes nothing; b returns and keeps web-0.
func TestStarvedNodesDoNotBounce(t *testing.T) {
	m := repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{svc("web", 1)}}.model(t)
	first := Compute(Input{Model: m, Commit: commitC, Reports: []report.Report{reportOf("a", t0), reportOf("b", t0)}, Now: t0})
	on := nodeOfInstance(first, "web-0")
	other := map[string]string{"a": "b", "b": "a"}[on]
	const end = 300
	nodes := []*simNode{
		// The node that runs web-0 starves from 2 s to 35 s, and again
		// from 70 s to 103 s; the other from 33 s to 64 s and from 100 s
		// to 132 s: each gap is longer than the TTL, and each begins just
		// before the other node's ends.
		{name: on, diesAt: -1, passes: passSchedule(end, 1, [2]int{2, 33}, [2]int{70, 33})},
		{name: other, diesAt: -1, passes: passSchedule(end, 1, [2]int{33, 31}, [2]int{100, 32})},
	}
	c := newSim(t, func(int) *render.Model { return m }, nodes)
	c.run(end)
	moves := c.movesOf("web-0")
	t.Logf("web-0 moves: %v", moves)
	if len(moves) != 1 || moves[0].from != on || moves[0].to != other {
		t.Fatalf("web-0 moved %v, want once, from %s to %s", moves, on, other)
	}
}
