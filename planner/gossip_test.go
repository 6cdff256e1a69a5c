package planner

import (
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/report"
)

// TestGossipLiveness: with a gossip ring, the ring decides who is alive
// while this node sees a majority of the inventory in it; a node the ring
// lost is alive again once it reports after the loss; a minority view, or
// a node the ring has not seen, falls back to the reports' ages, counting
// when the ring last saw each node.
func TestGossipLiveness(t *testing.T) {
	repo := repoDef{TTL: "60s", Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 3)}}
	m := repo.model(t)
	alive := func(p *Plan) string { return strings.Join(aliveNames(p), ",") }
	up := func(since int) Member { return Member{Alive: true, Since: secs(since)} }
	down := func(since int) Member { return Member{Since: secs(since)} }
	withSince := func(r report.Report, since int) report.Report { r.Since = secs(since); return r }

	cases := []struct {
		name      string
		reports   []report.Report
		members   map[string]Member
		wantAlive string
		settling  string
		warnings  map[string][]string
	}{
		{
			name: "the ring decides: a node it lost is dead at once, though its report is fresh",
			// c's last report is 5 s old, far within the TTL: only the ring knows it is gone.
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", secs(-300)), reportOf("c", secs(-5))},
			members:   map[string]Member{"a": up(-900), "b": up(-900), "c": down(-2)},
			wantAlive: "a,b",
			warnings:  map[string][]string{WarnNodeDead: {"c"}},
		},
		{
			name:      "a node alive in the ring is alive however old its report (reports change only on news)",
			reports:   []report.Report{withSince(reportOf("a", secs(0)), -900), withSince(reportOf("b", secs(-3000)), -4000), withSince(reportOf("c", secs(-3000)), -4000)},
			members:   map[string]Member{"a": up(-900), "b": up(-900), "c": up(-900)},
			wantAlive: "a,b,c",
		},
		{
			name:      "cut off from the ring but reporting after the loss: alive by its report",
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(-5))},
			members:   map[string]Member{"a": up(-900), "b": up(-900), "c": down(-20)},
			wantAlive: "a,b,c",
			warnings:  map[string][]string{WarnGossipCutOff: {"c"}},
		},
		{
			name:      "cut off and reporting after the loss, but longer ago than the TTL: dead",
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(-61))},
			members:   map[string]Member{"a": up(-900), "b": up(-900), "c": down(-200)},
			wantAlive: "a,b",
			warnings:  map[string][]string{WarnNodeDead: {"c"}},
		},
		{
			name: "a minority view falls back to the reports' ages, counting when the ring last saw each node",
			// a sees b and c die (a is the one cut off): b's report is old
			// but the ring saw it 10 s ago; c was lost 100 s ago.
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", secs(-500)), reportOf("c", secs(-500))},
			members:   map[string]Member{"a": up(-900), "b": down(-10), "c": down(-100)},
			wantAlive: "a,b",
			warnings:  map[string][]string{WarnGossipMinority: {""}, WarnNodeDead: {"c"}},
		},
		{
			name:      "a node the ring has not seen is judged by its report's age",
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", secs(-30)), reportOf("c", secs(-61))},
			members:   map[string]Member{"a": up(-900), "b": up(-900)},
			wantAlive: "a,b",
			warnings:  map[string][]string{WarnNodeDead: {"c"}},
		},
		{
			name:      "back in the ring after it had it dead: settling for the settle period",
			reports:   []report.Report{withSince(reportOf("a", secs(0)), -900), withSince(reportOf("b", secs(-300)), -900), withSince(reportOf("c", secs(-300)), -900)},
			members:   map[string]Member{"a": up(-900), "b": up(-900), "c": {Alive: true, Since: secs(-30), Rejoined: secs(-30)}},
			wantAlive: "a,b,c", settling: "c",
			warnings: map[string][]string{WarnSettling: {"c"}},
		},
		{
			name:      "settled once back for longer than the settle period",
			reports:   []report.Report{withSince(reportOf("a", secs(0)), -900), withSince(reportOf("b", secs(-300)), -900), withSince(reportOf("c", secs(-300)), -900)},
			members:   map[string]Member{"a": up(-900), "b": up(-900), "c": {Alive: true, Since: secs(-61), Rejoined: secs(-61)}},
			wantAlive: "a,b,c",
		},
		{
			name:      "a new run of reports settles by the run's start, not by the (old) report's time",
			reports:   []report.Report{withSince(reportOf("a", secs(0)), -900), withSince(reportOf("b", secs(-50)), -55), withSince(reportOf("c", secs(-300)), -900)},
			members:   map[string]Member{"a": up(-900), "b": up(-55), "c": up(-900)},
			wantAlive: "a,b,c", settling: "b",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Compute(Input{Model: m, Commit: commitC, Reports: tc.reports, Now: t0, Gossip: &Gossip{Members: tc.members}})
			if got := alive(p); got != tc.wantAlive {
				t.Errorf("alive %q, want %q; warnings %v", got, tc.wantAlive, p.Warnings)
			}
			var settling []string
			for _, n := range p.Nodes {
				if n.Settling {
					settling = append(settling, n.Name)
				}
			}
			if got := strings.Join(settling, ","); got != tc.settling {
				t.Errorf("settling %q, want %q; warnings %v", got, tc.settling, p.Warnings)
			}
			for code, subjects := range tc.warnings {
				for _, s := range subjects {
					if warningOf(p, code, s) == nil {
						t.Errorf("no %s warning for %q: %v", code, s, p.Warnings)
					}
				}
			}
		})
	}
}

// TestGossipMovesOnlyOffTheLostNode: the ring losing a node moves its
// stateless replicas to the others at once; nothing else moves.
func TestGossipMovesOnlyOffTheLostNode(t *testing.T) {
	repo := repoDef{TTL: "60s", Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 6)}}
	m := repo.model(t)
	first := Compute(Input{Model: m, Commit: commitC, Reports: []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0))}, Now: t0})
	var rs []report.Report
	for _, n := range []string{"a", "b", "c"} {
		var insts []report.Instance
		for _, pl := range first.Placements {
			if pl.Node == n {
				insts = append(insts, seen(pl.Instance, report.StateRunning, pl.Address.String(), hashOf(t, m, pl.Instance)))
			}
		}
		rs = append(rs, reportOf(n, secs(-1), insts...))
	}
	g := &Gossip{Members: map[string]Member{"a": {Alive: true}, "b": {Alive: true}, "c": {Since: secs(-1)}}}
	p := Compute(Input{Model: m, Commit: commitC, Reports: rs, Now: t0, Gossip: g})
	for _, pl := range p.Placements {
		before := placementOf(first, pl.Instance)
		switch {
		case pl.Node == "c":
			t.Errorf("%s stays on the lost node c", pl.Instance)
		case before.Node != "c" && before.Node != pl.Node:
			t.Errorf("%s moved from %s to %s, though only c was lost", pl.Instance, before.Node, pl.Node)
		}
	}
}

// TestGossipSeenByAnEarlierRing: a node the current ring does not know
// (the ring just moved, or gossip was turned off) is judged by the later
// of its report's time and when an earlier ring last saw it alive: the
// ring's vouching left its report unfetched. Without a ring now, no
// gossip-minority warning.
func TestGossipSeenByAnEarlierRing(t *testing.T) {
	repo := repoDef{TTL: "60s", Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 3)}}
	m := repo.model(t)
	reports := []report.Report{reportOf("a", secs(0)), reportOf("b", secs(-600)), reportOf("c", secs(-600))}
	seen := map[string]time.Time{"b": secs(-5), "c": secs(-61)}
	for _, tc := range []struct {
		name    string
		members map[string]Member
		minor   bool
	}{
		{"a new ring that knows only this node", map[string]Member{"a": {Alive: true, Since: secs(-1)}}, true},
		{"no ring now", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Compute(Input{Model: m, Commit: commitC, Reports: reports, Now: t0, Gossip: &Gossip{Members: tc.members, Seen: seen}})
			if got := strings.Join(aliveNames(p), ","); got != "a,b" {
				t.Errorf("alive %q, want a,b (c last seen longer than the TTL ago); warnings %v", got, p.Warnings)
			}
			if got := warningOf(p, WarnGossipMinority, "") != nil; got != tc.minor {
				t.Errorf("gossip-minority warning %v, want %v: %v", got, tc.minor, p.Warnings)
			}
		})
	}
}
