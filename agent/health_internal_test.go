package agent

import (
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec/probe"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// probeNever is a readiness check that does not pass (the prober has no
// exec driver).
var probeNever = render.Checks{Readiness: &render.Check{Exec: &render.ExecCheck{Command: []string{"/bin/false"}}, Period: render.Duration(time.Hour), Timeout: render.Duration(time.Second)}}

// TestReadyOnceIsNoFailedRollout: a replica that has been ready at its
// spec and crashes (or turns unready) later is a crash, not a replica
// that never became ready: its report stops carrying specSince, so that
// the planner neither pauses a rollout on it (a false keel_rollout_paused
// at steady state, once progressDeadline has passed since its start) nor,
// with failureAction continue, counts it as available and releases one
// more replica. A new spec starts the clock again.
func TestReadyOnceIsNoFailedRollout(t *testing.T) {
	p := probe.New(probe.Options{})
	defer p.Close()
	a := &Agent{prober: p}
	since := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	inst := func(state report.State, hash string) []report.Instance {
		return []report.Instance{{Name: "web-0", State: state, SpecHash: hash, SpecSince: since}}
	}
	// Not ready yet (its checks have not run): specSince times it.
	got := inst(report.StateRunning, "h1")
	if a.checked(got); got[0].SpecSince.IsZero() {
		t.Fatal("a replica not yet ready at its spec reports no specSince")
	}
	// A target without checks is ready at once.
	if err := p.Set([]probe.Target{{Name: "web-0", Identity: "1/1"}}); err != nil {
		t.Fatal(err)
	}
	got = inst(report.StateRunning, "h1")
	if a.checked(got); got[0].Ready == nil || !*got[0].Ready {
		t.Fatalf("ready: %v, want true", got[0].Ready)
	}
	// It crashes: its process is gone, it is no target any more.
	if err := p.Set(nil); err != nil {
		t.Fatal(err)
	}
	got = inst(report.StateCrashLoop, "h1")
	if a.checked(got); !got[0].SpecSince.IsZero() {
		t.Errorf("a replica that was ready at its spec and crashed reports specSince %s: the planner takes it for a failed rollout once progressDeadline has passed", got[0].SpecSince)
	}
	// Restarted at the same spec, not ready yet: still no specSince.
	if err := p.Set([]probe.Target{{Name: "web-0", Identity: "2/2", Checks: probeNever}}); err != nil {
		t.Fatal(err)
	}
	got = inst(report.StateRunning, "h1")
	if a.checked(got); !got[0].SpecSince.IsZero() {
		t.Errorf("restarted after a crash at the same spec: specSince %s, want none", got[0].SpecSince)
	}
	// A new spec: it must become ready again within progressDeadline.
	got = inst(report.StateRunning, "h2")
	if a.checked(got); got[0].SpecSince.IsZero() {
		t.Error("at a new spec, not ready: no specSince, want it (a replica that never becomes ready fails the rollout)")
	}
}
