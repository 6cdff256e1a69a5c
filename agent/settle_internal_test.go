package agent

import (
	"testing"
	"time"

	"github.com/keel-dev/keel/report"
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

// TestKeepUpKeepsThisNodeAlive: a slow fetch is dated by its start, but the
// peers' reports it brings may be newer by more than the TTL; the node's
// own report is dated up to the newest of them (within the clock lead), so
// the node never judges itself dead and hands its instances back.
func TestKeepUpKeepsThisNodeAlive(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	own := report.Report{Node: "n3", Time: t0, Since: t0.Add(-30 * time.Second)}
	peers := []report.Report{
		{Node: "n1", Time: t0.Add(4 * time.Second)},
		{Node: "n2", Time: t0.Add(10 * time.Second)},  // pushed while the fetch ran
		{Node: "n4", Time: t0.Add(900 * time.Second)}, // far ahead: not followed
	}
	keepUp(&own, peers, t0.Add(13*time.Second))
	if want := t0.Add(10 * time.Second); !own.Time.Equal(want) {
		t.Errorf("own report dated %s, want %s (the newest peer report within the limit)", own.Time, want)
	}
	if want := t0.Add(-20 * time.Second); !own.Since.Equal(want) {
		t.Errorf("since %s, want %s (moved with the time: settled for 30s still)", own.Since, want)
	}
	older := report.Report{Node: "n3", Time: t0.Add(20 * time.Second)}
	keepUp(&older, peers, t0.Add(30*time.Second))
	if !older.Time.Equal(t0.Add(20 * time.Second)) {
		t.Errorf("a report newer than every peer's moved to %s", older.Time)
	}
}
