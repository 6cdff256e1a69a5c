package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/keel-dev/keel/report"
)

// Issue 8 item 11: a node deleted from nodes/ keeps reporting what it runs
// until its agent has decommissioned it. The plan shows it leaving: a
// node-leaving warning, a pending stop for each instance it still runs
// that no move already covers, and moves off it that name the inventory,
// not a dead node. A stray report (a node that never was in the
// inventory) is treated alike: the planner cannot tell them apart.
func TestNodeLeavingShowsItsStops(t *testing.T) {
	repo := repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{
		svc("web", 2), {Name: "tools"}, {Name: "db", Volumes: []string{"db-data"}},
	}}
	m := repo.model(t)
	h := func(name string) string { return hashOf(t, m, name) }
	a := reportOf("a", secs(0), seen("web-0", report.StateRunning, "10.200.1.2", h("web-0")), seen("web-1", report.StateRunning, "10.200.1.3", h("web-1")))
	b := reportOf("b", secs(0))
	gone := withVolumes(reportOf("gone", secs(-5),
		seen("web-0", report.StateRunning, "10.200.9.2", h("web-0")), // its replacement runs on a
		seen("tools", report.StateCrashLoop, "10.200.9.3", h("tools")),
		seen("retired", report.StateRunning, "10.200.9.4", "old"), // no longer in the specs
		seen("db", report.StateRunning, "10.200.9.5", h("db")),
		seen("done", report.StateStopped, "", "old"), // stopped already: nothing to do
	), "db-data")
	gone.Decommissioned = true
	stray := reportOf("stray", secs(-100), seen("web-1", report.StateRunning, "10.9.9.9", "x"))
	empty := reportOf("empty", secs(-1), seen("done", report.StateStopped, "", "old"))

	for _, order := range [][]report.Report{{a, b, gone, stray, empty}, {empty, stray, gone, b, a}} {
		p := Compute(Input{Model: m, Commit: commitC, Reports: order, Now: t0})
		// Nothing about the inventory changes: both nodes alive, and db is
		// placed anew (a removed node's volumes hold nothing in place) but
		// waits for gone to report it stopped.
		if got := aliveNames(p); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("alive %v", got)
		}
		db := placementOf(p, "db")
		if db == nil || db.Reason != ReasonNew || !slices.Equal(db.WaitsFor, []string{"gone"}) {
			t.Fatalf("db %+v, want placed anew, waiting for gone", db)
		}
		w := warningOf(p, WarnNodeLeaving, "gone")
		if w == nil || !strings.Contains(w.Message, "lists 4 instances not stopped (db, retired, tools, web-0)") || !strings.Contains(w.Message, "decommissioning") {
			t.Fatalf("node-leaving warning for gone: %+v", w)
		}
		if w := warningOf(p, WarnNodeLeaving, "stray"); w == nil || !strings.Contains(w.Message, "1 instance not stopped (web-1)") {
			t.Fatalf("node-leaving warning for stray: %+v", w)
		}
		if warningOf(p, WarnReportIgnored, "empty") == nil || warningOf(p, WarnNodeLeaving, "empty") != nil || warningOf(p, WarnReportIgnored, "gone") != nil {
			t.Fatalf("a report outside the inventory that runs nothing is ignored, one that runs something is leaving: %+v", p.Warnings)
		}

		got := map[string]Change{}
		for _, c := range Pending(m, p, order) {
			if c.Node == "gone" || c.From == "gone" || c.Node == "stray" || c.From == "stray" || c.Node == "empty" || c.From == "empty" {
				got[c.Action+" "+c.Instance+" "+cmpOr(c.From, c.Node)] = c
			}
		}
		want := []string{"move db gone", "move tools gone", "stop retired gone", "stop web-0 gone", "stop web-1 stray"}
		if keys := sortedKeys(got); !slices.Equal(keys, want) {
			t.Fatalf("pending changes of the nodes outside the inventory %v, want %v", keys, want)
		}
		left := "node gone is not in the inventory: its agent stops it (decommission)"
		if c := got["stop retired gone"]; c.Reason != left || c.Service != "" {
			t.Errorf("stop of retired %+v", c)
		}
		if c := got["stop web-0 gone"]; c.Service != "web" {
			t.Errorf("stop of web-0 names its Service: %+v", c)
		}
		if c := got["move tools gone"]; c.Reason != "stopped on gone once it runs on "+c.Node+": node gone is not in the inventory (decommission)" {
			t.Errorf("stateless move off gone %+v", c)
		}
		if c := got["move db gone"]; c.Reason != "started on "+db.Node+" once gone reports it stopped: node gone is not in the inventory (decommission)" {
			t.Errorf("stateful move off gone %+v", c)
		}
	}
}

// Issue 8 items 3 and 11: an unpinned stateful instance whose copy runs on
// a node deleted from the inventory (its report lists it, and its volume)
// is placed on another node at once, but that node must not start it
// until the removed node's newest report says it stopped (or no longer
// lists it): at no poll in between are there two copies.
func TestUnpinnedStatefulWaitsForARemovedNode(t *testing.T) {
	repo := repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{{Name: "db", Volumes: []string{"db-data"}}}}
	m := repo.model(t)
	on := func(st report.State, at int) report.Report {
		r := withVolumes(reportOf("n2", secs(at), seen("db", st, "10.200.9.5", hashOf(t, m, "db"))), "db-data")
		r.Instances[0].Generation = 3
		return r
	}
	polls := []struct {
		name    string
		removed report.Report
		waits   bool
	}{
		{"n2 has not applied the removal yet", on(report.StateRunning, -2), true},
		{"n2's report is a day old", on(report.StateRunning, -86400), true},
		{"n2 decommissioning, stopping it", func() report.Report { r := on(report.StateRunning, 0); r.Decommissioned = true; return r }(), true},
		{"n2 reports it crash-looping", on(report.StateCrashLoop, 0), true},
		{"n2 reports it failed", on(report.StateFailed, 0), true},
		{"n2 reports it starting", on(report.StateStarting, 0), true},
		{"n2 reports it stopped", on(report.StateStopped, 1), false},
		{"n2's newest report no longer lists it", withVolumes(reportOf("n2", secs(2)), "db-data"), false},
	}
	var node string
	for _, poll := range polls {
		// The removed node's older reports may still be around (another
		// remote, a --reports directory): only its newest counts.
		reports := []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), on(report.StateRunning, -3600), poll.removed}
		for _, order := range [][]report.Report{reports, reversed(reports)} {
			p := Compute(Input{Model: m, Commit: commitC, Reports: order, Now: t0})
			pl := placementOf(p, "db")
			if pl == nil || pl.Node == "n2" || pl.Reason != ReasonNew {
				t.Fatalf("%s: db %+v, want placed anew on a or b", poll.name, pl)
			}
			if node == "" {
				node = pl.Node
			} else if pl.Node != node {
				t.Fatalf("%s: db on %s, was on %s", poll.name, pl.Node, node)
			}
			if waits := slices.Equal(pl.WaitsFor, []string{"n2"}); waits != poll.waits || !waits && len(pl.WaitsFor) > 0 {
				t.Fatalf("%s: db waits for %v, want waiting %v", poll.name, pl.WaitsFor, poll.waits)
			}
			// A report outside the inventory moves nothing but the wait:
			// not even the new copy's generation (see
			// TestPropertyHostileClocks).
			if pl.Generation != 1 {
				t.Fatalf("%s: db generation %d, want 1", poll.name, pl.Generation)
			}
		}
	}
}
