package agent

import (
	"testing"
	"time"
)

// TestSettledForIsWhatPeersSee: a node judges itself settling by the run
// of reports it has pushed, as its peers do, never by its own clock alone:
// before its first push it is settling; after, its run is the last pushed
// report's Time minus its Since; after a gap of more than the TTL since
// that push, its next push starts a new run, so it is settling again.
// (Without this, two nodes that had just started each held the other
// settling and both started the same moved replica.)
func TestSettledForIsWhatPeersSee(t *testing.T) {
	const ttl = 12 * time.Second
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	p := &publisher{}
	if d := p.settledFor(t0, ttl); d != 0 {
		t.Errorf("before any push: settled for %s, want 0", d)
	}
	p.pushedRun.since, p.pushedRun.at = t0, t0.Add(20*time.Second)
	if d := p.settledFor(t0.Add(22*time.Second), ttl); d != 20*time.Second {
		t.Errorf("2s after a push 20s into the run: settled for %s, want 20s (what the peers see)", d)
	}
	if d := p.settledFor(t0.Add(33*time.Second), ttl); d != 0 {
		t.Errorf("13s after the last push (TTL 12s): settled for %s, want 0 (a new run starts)", d)
	}
}
