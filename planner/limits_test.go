package planner

import (
	"strings"
	"testing"

	"github.com/keel-dev/keel/report"
)

// racctOff returns r saying its node cannot enforce resource limits, as
// the freebsd driver's host checks report it.
func racctOff(r report.Report) report.Report {
	r.Problems = append(r.Problems, report.Problem{Check: report.CheckRacct,
		Problem: "resource accounting is off: instances with limits are refused", Fix: "echo kern.racct.enable=1 >> /boot/loader.conf, then reboot"})
	return r
}

// Issue 9: a node whose report says racct is off (it cannot enforce
// resource limits, and every instance has some) gets no new instance and
// keeps none by stickiness: they go to nodes that can. A pinned stateful
// instance stays, with a warning. The plan says why (the node, the
// warning, the pending move).
func TestLimitsOffNodeTakesNoLimitedInstance(t *testing.T) {
	repo := repoDef{
		Nodes:     tableNodes("a", "b", "c"),
		Workloads: []workloadDef{svc("web", 6), {Name: "tools"}, {Name: "db", Volumes: []string{"db-data"}}},
		Pins:      map[string]string{"db": "b"},
	}
	m := repo.model(t)
	h := func(name string) string { return hashOf(t, m, name) }
	a, c := reportOf("a", secs(0)), reportOf("c", secs(0))
	b := withVolumes(reportOf("b", secs(0),
		seen("tools", report.StateCrashLoop, "10.200.2.2", h("tools")),
		seen("db", report.StateCrashLoop, "10.200.2.3", h("db"))), "db-data")

	// Without the problem, b takes its share and keeps tools.
	control := plan(m, a, b, c)
	onB := 0
	for _, pl := range control.Placements {
		if pl.Node == "b" {
			onB++
		}
	}
	if nodeOfInstance(control, "tools") != "b" || onB < 3 {
		t.Fatalf("control: tools on %q, %d instances on b; want tools sticky on b and web spread over it", nodeOfInstance(control, "tools"), onB)
	}

	b = racctOff(b)
	for _, order := range [][]report.Report{{a, b, c}, {c, b, a}} {
		p := plan(m, order...)
		for _, pl := range p.Placements {
			if pl.Node == "b" && pl.Instance != "db" {
				t.Errorf("%s placed on b, which cannot enforce its limits", pl.Instance)
			}
		}
		if n := nodeOfInstance(p, "tools"); n != "a" && n != "c" {
			t.Errorf("tools is on %q, want it moved off b", n)
		}
		if len(p.Placements) != 8 || len(p.Unschedulable) != 0 {
			t.Errorf("placements %d, unschedulable %v: want all 8 placed", len(p.Placements), p.Unschedulable)
		}
		if pl := placementOf(p, "db"); pl == nil || pl.Node != "b" || pl.Reason != ReasonPinned {
			t.Errorf("pinned db: %+v, want it kept on b", pl)
		}
		if w := warningOf(p, WarnHostProblem, "db"); w == nil || !strings.Contains(w.Message, "stateful db is pinned to node b, which reports that it cannot enforce resource limits") {
			t.Errorf("no warning about db on b: %v", p.Warnings)
		}
		if w := warningOf(p, WarnHostProblem, "b"); w == nil || w.Message != "node b reports a host problem: racct: resource accounting is off: instances with limits are refused (fix: echo kern.racct.enable=1 >> /boot/loader.conf, then reboot)" {
			t.Errorf("no warning with b's problem and fix: %v", p.Warnings)
		}
		if n := planNode(p, "b"); n == nil || !n.LimitsOff || !n.Alive {
			t.Errorf("node b: %+v, want alive with LimitsOff", n)
		}
		if planNode(p, "a").LimitsOff {
			t.Error("node a has LimitsOff")
		}
		var move *Change
		for _, c := range Pending(m, p, order) {
			if c.Instance == "tools" {
				move = &c
			}
		}
		if move == nil || move.Action != ActionMove || move.From != "b" || !strings.Contains(move.Reason, "node b cannot enforce its resource limits (racct)") {
			t.Errorf("pending change of tools: %+v, want a move off b saying why", move)
		}
	}
}

// Issue 9: with no eligible node able to enforce limits, an instance is
// unschedulable and says so, naming the nodes; when some nodes lack
// capacity and the others cannot enforce limits, the capacity message
// names those too.
func TestLimitsOffUnschedulable(t *testing.T) {
	repo := repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{{Name: "tools"}}}
	m := repo.model(t)
	p := plan(m, racctOff(reportOf("a", secs(0))), racctOff(reportOf("b", secs(0))))
	u := unschedulableOf(p, "tools")
	if u == nil || u.Reason != "it has resource limits, and every eligible node reports that it cannot enforce them (resource accounting is off on nodes a, b)" {
		t.Fatalf("tools: %+v, placed on %q", u, nodeOfInstance(p, "tools"))
	}

	repo = repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{{Name: "big", CPU: "4"}}}
	repo.Nodes[1].CPU, repo.Nodes[1].Memory = "2", "8G"
	m = repo.model(t)
	p = plan(m, racctOff(reportOf("a", secs(0))), reportOf("b", secs(0)))
	u = unschedulableOf(p, "big")
	if u == nil || !strings.HasPrefix(u.Reason, "not enough capacity") || !strings.HasSuffix(u.Reason, "; node a cannot enforce resource limits") {
		t.Fatalf("big: %+v", u)
	}
}
