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
