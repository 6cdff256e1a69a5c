package planner

import (
	"testing"
	"time"

	"github.com/keel-dev/keel/report"
)

// TestPresumeAlive: a node without any report that the caller presumes
// alive (an agent's warm-up) takes its share; one with a stale report is
// still judged by it.
func TestPresumeAlive(t *testing.T) {
	m := repoDef{Nodes: tableNodes("n1", "n2", "n3"), Workloads: []workloadDef{svc("web", 6)}}.model(t)
	for _, pl := range plan(m, reportOf("n1", t0)).Placements {
		if pl.Node != "n1" {
			t.Fatalf("without presumption everything goes to n1: %+v", pl)
		}
	}
	p := Compute(Input{Model: m, Commit: commitC, Now: t0, PresumeAlive: []string{"n2", "n3"},
		Reports: []report.Report{reportOf("n1", t0), reportOf("n3", t0.Add(-10*time.Minute))}})
	count := map[string]int{}
	for _, pl := range p.Placements {
		count[pl.Node]++
	}
	if count["n2"] == 0 || count["n3"] != 0 {
		t.Fatalf("placements per node %v: n2 (no report, presumed) must get work, n3 (stale report) none", count)
	}
	var presumed []string
	for _, w := range p.Warnings {
		if w.Code == WarnPresumedAlive {
			presumed = append(presumed, w.Subject)
		}
	}
	if len(presumed) != 1 || presumed[0] != "n2" {
		t.Errorf("presumed-alive warnings for %v, want n2", presumed)
	}
}
