package agent

import (
	"log/slog"
	"testing"
	"time"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/report"
)

// TestPeersSavedBeforeAMove: the peers' reports an agent keeps for a
// restart while git is unreachable are written before a pass acts on a
// plan whose placements differ from those of the reports written last
// (a stateful instance that moved, stopped here, must not come back from
// older reports), and otherwise at most once a second after the pass, off
// the path of each rollout step.
func TestPeersSavedBeforeAMove(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{opts: Options{StateDir: dir}, log: slog.New(slog.DiscardHandler)}
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	saved := func() []report.Report {
		t.Helper()
		b := &Agent{opts: Options{StateDir: dir}}
		if err := b.loadPeers(); err != nil {
			t.Fatal(err)
		}
		return b.peers
	}
	fetched := func(at time.Time) {
		a.peers = []report.Report{{Node: "n2", Time: at}}
		a.peersDirty = true
	}

	fetched(t0)
	a.savePeersBefore(&planner.Plan{PlacementID: "p1"})
	if got := saved(); len(got) != 1 || !got[0].Time.Equal(t0) {
		t.Fatalf("first reports not written before the pass acts: %v", got)
	}

	// Reports that move nothing: not before the pass, and after it only
	// once a second has passed since the last write.
	fetched(t0.Add(time.Second))
	a.savePeersBefore(&planner.Plan{PlacementID: "p1"})
	a.savePeersLater(false, "p1")
	if got := saved(); !got[0].Time.Equal(t0) {
		t.Fatalf("reports that move nothing written within a second of the last write: %v", got)
	}
	a.peersSavedAt = a.peersSavedAt.Add(-peersSaveGap)
	a.savePeersLater(false, "p1")
	if got := saved(); !got[0].Time.Equal(t0.Add(time.Second)) {
		t.Fatalf("reports that move nothing not written after a second: %v", got)
	}

	// Reports that move an instance: written at once, however recent the
	// last write.
	fetched(t0.Add(2 * time.Second))
	a.savePeersBefore(&planner.Plan{PlacementID: "p2"})
	if got := saved(); !got[0].Time.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("reports that move an instance not written before the pass acts: %v", got)
	}
	if a.peersDirty || a.peersSavedPlaces != "p2" {
		t.Fatalf("after the write: dirty %v, placements %q", a.peersDirty, a.peersSavedPlaces)
	}
	// The same placements again (a pass with no new reports): no write.
	before := a.peersSavedAt
	a.savePeersBefore(&planner.Plan{PlacementID: "p2"})
	if !a.peersSavedAt.Equal(before) {
		t.Fatalf("clean reports written again")
	}
}
