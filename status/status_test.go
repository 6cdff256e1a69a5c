package status_test

import (
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// TestEveryAgentStopped: the nodes judge liveness against the newest
// report, so a cluster whose agents all stopped still looks alive to
// them; the status reads the clock and calls them dead.
func TestEveryAgentStopped(t *testing.T) {
	snap, now := statustest.Snapshot(t, "converged")
	st := status.Compute(status.Input{Snapshot: snap, Now: now.Add(10 * time.Minute)})
	if st.Converged || st.Counts.NodesAlive != 0 {
		t.Fatalf("10 minutes without a report: converged %v, %d alive", st.Converged, st.Counts.NodesAlive)
	}
	for _, n := range st.Nodes {
		if n.State != status.NodeDead {
			t.Errorf("node %s is %s", n.Name, n.State)
		}
	}
	if !strings.Contains(st.Headline, "is dead") {
		t.Errorf("headline %q", st.Headline)
	}
}

// TestFixturesSayWhatIsMissing: a status is converged exactly when
// nothing is missing, and the headline names the first thing missing.
func TestFixturesSayWhatIsMissing(t *testing.T) {
	want := map[string]string{
		"converged":     "",
		"dead-node":     "node n3 is dead",
		"old-commit":    "node n2 runs 9b1d44e0a2c3, not the tip 3f2a9c1e04b7",
		"refused":       "node n2 refused 3f2a9c1e04b7: minAgentVersion is 9.9.9",
		"unschedulable": "instance batch: not enough capacity",
		"crashloop":     "crash-looping (7 restarts)",
		"expiring-cert": "",
	}
	for _, name := range statustest.Names() {
		snap, now := statustest.Snapshot(t, name)
		st := status.Compute(status.Input{Snapshot: snap, Now: now})
		if st.Converged != (len(st.Missing) == 0) {
			t.Errorf("%s: converged %v with %d missing", name, st.Converged, len(st.Missing))
		}
		w, ok := want[name]
		if !ok {
			t.Fatalf("fixture %s has no expectation here", name)
		}
		if w == "" && !st.Converged {
			t.Errorf("%s: not converged: %s", name, st.Headline)
		}
		if w != "" && !strings.Contains(strings.Join(st.Missing, "\n"), w) {
			t.Errorf("%s: %q not in what is missing:\n%s", name, w, strings.Join(st.Missing, "\n"))
		}
	}
}

// TestInvalidTip: specs that do not render give the errors and no plan,
// and the nodes that report are still listed.
func TestInvalidTip(t *testing.T) {
	snap, now := statustest.Snapshot(t, "converged")
	snap.Tree.Invalid = true
	st := status.Compute(status.Input{Snapshot: snap, Now: now})
	if st.Valid || st.Converged || len(st.Nodes) != 3 || !strings.Contains(st.Headline, "invalid") {
		t.Fatalf("%+v", st)
	}
}

// TestInvalidTipDeadNode: with the tip invalid there is no plan to judge
// liveness, and a node whose agent stopped an hour ago is dead by the
// reader's clock, not alive.
func TestInvalidTipDeadNode(t *testing.T) {
	snap, now := statustest.Snapshot(t, "dead-node")
	snap.Tree.Invalid = true
	snap.Reports[2].Time = now.Add(-time.Hour)
	st := status.Compute(status.Input{Snapshot: snap, Now: now})
	for _, n := range st.Nodes {
		if want := map[bool]string{true: status.NodeDead, false: status.NodeAlive}[n.Name == snap.Reports[2].Node]; n.State != want {
			t.Errorf("node %s is %s, want %s", n.Name, n.State, want)
		}
	}
}

// TestHistoryCountsInventoryNodes: a leaving node (reporting, no longer
// in the inventory) at the tip does not count as one more node that
// applied it: applied never passes nodes.
func TestHistoryCountsInventoryNodes(t *testing.T) {
	snap, now := statustest.Snapshot(t, "converged")
	gone := snap.Reports[0]
	gone.Node, gone.Instances, gone.Volumes = "n9", nil, nil
	snap.Reports = append(snap.Reports, gone)
	st := status.Compute(status.Input{Snapshot: snap, Now: now})
	if h := st.History[0]; h.Applied != 3 || h.Nodes != 3 {
		t.Errorf("tip: %d of %d nodes applied it, want 3 of 3", h.Applied, h.Nodes)
	}
}

// TestReportFromTheFuture: a second report of a node dated two hours
// ahead (a stale ref with a broken clock, or a forged one) is set aside
// by the planner, and by the status's node rows too: the rows do not
// show the node on another commit than the plan reads.
func TestReportFromTheFuture(t *testing.T) {
	snap, now := statustest.Snapshot(t, "converged")
	future := snap.Reports[1]
	future.Time, future.Clock, future.Commit = now.Add(2*time.Hour), now.Add(2*time.Hour), statustest.Prev.Hash
	snap.Reports = append(snap.Reports, future)
	st := status.Compute(status.Input{Snapshot: snap, Now: now})
	if n := st.Nodes[1]; n.Commit != statustest.Tip.Hash || !n.AtTip || n.State != status.NodeAlive {
		t.Errorf("node %s: %s at %s (at tip %v)", n.Name, n.State, n.Commit, n.AtTip)
	}
	if !st.Converged {
		t.Errorf("not converged: %s", st.Headline)
	}
}
