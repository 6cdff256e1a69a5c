package agent

import (
	"context"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/nodeexec/probe"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// TestReadyOnceIsNoFailedRollout: a replica that has been ready at its
// spec and crashes (or turns unready) later is a crash, not a replica
// that never became ready: its report stops carrying specSince, so that
// the planner neither pauses a rollout on it (a false keel_rollout_paused
// at steady state, once progressDeadline has passed since its start) nor,
// with failureAction continue, counts it as available and releases one
// more replica. The reconciler's state keeps it across agent restarts; a
// new spec starts the clock again.
func TestReadyOnceIsNoFailedRollout(t *testing.T) {
	dir := t.TempDir()
	drv := fake.New()
	newRec := func() *nodeexec.Reconciler {
		rec, err := nodeexec.NewReconciler(nodeexec.Config{Node: "n1", Driver: drv, StateDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	m, err := render.RenderFiles([]render.File{
		{Path: "cluster.yaml", Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n")},
		{Path: "nodes/n1.yaml", Data: []byte("apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1, podCIDR: 10.200.1.0/24}\n")},
		{Path: "j.yaml", Data: []byte("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: j}\nspec: {image: base/x, command: [/bin/j], node: n1}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := probe.New(probe.Options{})
	defer p.Close()
	a := &Agent{prober: p, rec: newRec()}
	pass := func() []report.Instance {
		t.Helper()
		a.rec.Collect()
		ctx := context.Background()
		for range 50 {
			res, err := a.rec.Pass(ctx, nodeexec.Desired{Model: m, Plan: planFor(m)})
			if err != nil {
				t.Fatal(err)
			}
			if res.InFlight == 0 {
				break
			}
			<-a.rec.Wake()
		}
		a.syncChecks(time.Now())
		insts, _, err := a.rec.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a.checked(insts)
		return insts
	}
	got := pass()
	for range 100 {
		if got[0].Ready != nil && *got[0].Ready {
			break
		}
		time.Sleep(10 * time.Millisecond)
		got = pass()
	}
	if got[0].Ready == nil || !*got[0].Ready || !got[0].SpecSince.IsZero() {
		t.Fatalf("a Jail without checks, running: %+v, want ready and no specSince", got[0])
	}
	// It crashes; the agent restarts: no specSince at the spec it was
	// ready at.
	if err := drv.Crash("j", 1); err != nil {
		t.Fatal(err)
	}
	if err := a.rec.Close(); err != nil {
		t.Fatal(err)
	}
	a.rec = newRec()
	if got := pass(); !got[0].SpecSince.IsZero() {
		t.Errorf("a replica that was ready at its spec and crashed reports specSince %s: the planner takes it for a failed rollout once progressDeadline has passed", got[0].SpecSince)
	}
	_ = a.rec.Close()
}

func planFor(m *render.Model) *planner.Plan {
	return planner.Compute(planner.Input{Model: m, AssumeAlive: true, Now: time.Now()})
}
