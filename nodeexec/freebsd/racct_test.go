package freebsd_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// Issue 9: on a host booted without resource accounting, the reconciler
// with the freebsd driver never runs an instance (every instance has
// limits): the start is refused before anything is created, the refusal
// is the instance's error in the node's report, with its fix, and stays so
// at each retry. Once the node's report carries its host problems (the
// agent's checks), the planner places nothing there and the node tries no
// more; the host is left as it was.
func TestRacctOffRefusedByTheReconciler(t *testing.T) {
	ctx := context.Background()
	h := newHost(t, fbsdsim.Options{})
	h.sim.SetSysctl("kern.racct.enable", "0")
	d := h.driver(t, "", freebsd.Options{})
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	rec, err := nodeexec.NewReconciler(nodeexec.Config{Node: "n1", Driver: d, StateDir: t.TempDir(), Now: func() time.Time { return now }, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rec.Close(); err != nil {
			t.Error(err)
		}
	})
	m, err := render.Render(fstest.MapFS{
		"cluster.yaml":  {Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n")},
		"nodes/n1.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1, capacity: {cpu: \"8\", memory: 8G}}\n")},
		"apps/web.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: web}\nspec: {image: base/test, command: [/bin/sleep, \"300\"], node: n1, network: {vnet: true}}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	pass := func(problems []report.Problem) (nodeexec.Result, *planner.Plan, []report.Instance) {
		t.Helper()
		insts, vols, err := rec.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		own := report.Report{Node: "n1", Time: now, Instances: insts, Volumes: vols, Problems: problems}
		plan := planner.Compute(planner.Input{Model: m, Reports: []report.Report{own}, Now: now})
		desired := nodeexec.Desired{Model: m, Plan: plan, Reports: []report.Report{own}}
		res, err := rec.Pass(ctx, desired)
		if err != nil {
			t.Fatal(err)
		}
		// Operations run off the pass: pass again when they end, as the
		// agent's loop does, until none is in flight.
		for res.InFlight > 0 {
			select {
			case <-rec.Wake():
			case <-time.After(20 * time.Second):
				t.Fatal("no operation ended within 20 s")
			}
			more, err := rec.Pass(ctx, desired)
			if err != nil {
				t.Fatal(err)
			}
			maps.Copy(more.Errors, res.Errors)
			res = more
		}
		insts, _, err = rec.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res, plan, insts
	}
	const want = "resource limits cannot be enforced on this node: resource accounting is off on this host (kern.racct.enable is not 1): add kern.racct.enable=1 to /boot/loader.conf and reboot"

	// Before the node's report says so (the agent's first checks run
	// before its first pass; a peer's plan may be older), web is placed
	// here: the driver refuses it, at every retry.
	for i := range 3 {
		h.rec.take()
		res, plan, insts := pass(nil)
		if len(plan.Placements) != 1 {
			t.Fatalf("pass %d: placements %+v", i, plan.Placements)
		}
		err := res.Errors["web"]
		if !errors.Is(err, freebsd.ErrRacctDisabled) || !errors.Is(err, nodeexec.ErrLimitsUnenforced) {
			t.Fatalf("pass %d: error %v, want ErrRacctDisabled", i, err)
		}
		if len(insts) != 1 || insts[0].State != report.StateCrashLoop || !strings.Contains(insts[0].Error, want) {
			t.Fatalf("pass %d: the report lists %+v, want web in crashloop with %q", i, insts, want)
		}
		if c := changing(h.rec.take()); len(c) > 0 {
			t.Errorf("pass %d: a refused start ran %q", i, c)
		}
		if running, err := d.Running(ctx); err != nil || len(running) != 0 {
			t.Fatalf("pass %d: running %v, %v", i, running, err)
		}
		h.leaks(t, fbsdsim.Expect{})
		now = now.Add(10 * time.Minute) // past any backoff
	}

	// The node's report now carries what the driver's checks found.
	found, err := d.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var problems []report.Problem
	for _, p := range found {
		problems = append(problems, report.Problem(p))
	}
	problems, _ = report.TrimProblems(problems)
	own := report.Report{Node: "n1", Time: now, Problems: problems}
	if !own.LimitsOff() {
		t.Fatalf("the checks found %v, no racct problem", found)
	}
	h.rec.take()
	res, plan, insts := pass(problems)
	if len(plan.Unschedulable) != 1 || !strings.Contains(plan.Unschedulable[0].Reason, "cannot enforce them (resource accounting is off on node n1)") {
		t.Fatalf("unschedulable %+v, want web with the reason", plan.Unschedulable)
	}
	// Unschedulable, it is no longer tried here; the report keeps the
	// refusal as its last error.
	if len(res.Errors) != 0 || len(insts) != 1 || !strings.Contains(insts[0].Error, want) {
		t.Fatalf("errors %v, report lists %+v; want no new attempt and web's last error kept", res.Errors, insts)
	}
	if c := changing(h.rec.take()); len(c) > 0 {
		t.Errorf("the pass with web unschedulable ran %q", c)
	}
	h.leaks(t, fbsdsim.Expect{})
}
