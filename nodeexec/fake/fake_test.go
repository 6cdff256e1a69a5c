package fake_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/drivertest"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/render"
)

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) nodeexec.Driver { return fake.New() })
}

func spec(name string) nodeexec.InstanceSpec {
	return nodeexec.InstanceSpec{Name: name, SpecHash: "h1", Spec: render.JailSpec{Command: []string{"run"}}}
}

func TestControls(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := fake.New()
	d.SetClock(func() time.Time { return now })

	boom := errors.New("boom")
	d.FailNextStart("web-0", boom)
	if _, err := d.Start(ctx, spec("web-0")); !errors.Is(err, boom) {
		t.Fatalf("Start after FailNextStart: %v, want boom", err)
	}
	if d.Starts("web-0") != 0 {
		t.Errorf("a failed start counted")
	}
	p, err := d.Start(ctx, spec("web-0"))
	if err != nil {
		t.Fatalf("the start after the failed one: %v", err)
	}
	if !p.Started.Equal(now) {
		t.Errorf("Started = %v, want the injected clock's %v", p.Started, now)
	}

	now = now.Add(time.Minute)
	if err := d.Crash("web-0", 2); err != nil {
		t.Fatal(err)
	}
	if e, ok := d.Exited("web-0"); !ok || e != (nodeexec.Exit{Code: 2, Known: true, At: now}) {
		t.Errorf("Exited = %+v, %v", e, ok)
	}
	if err := d.Crash("web-0", 2); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Crash of a stopped instance: %v, want ErrNotFound", err)
	}

	// Across an agent restart, exits are no longer known.
	p2, _ := d.Start(ctx, spec("web-0"))
	d.AgentRestart()
	if _, ok := d.Exited("web-0"); ok {
		t.Errorf("an exit survived AgentRestart")
	}
	if r, _ := d.Running(ctx); r["web-0"] != p2 {
		t.Errorf("Running after AgentRestart = %+v, want %+v", r, p2)
	}
	if _, err := d.Start(ctx, spec("web-0")); !errors.Is(err, nodeexec.ErrAlreadyRunning) {
		t.Errorf("Start of an adopted instance: %v, want ErrAlreadyRunning", err)
	}
	if err := d.Crash("web-0", 0); err != nil {
		t.Fatal(err)
	}
	if e, ok := d.Exited("web-0"); !ok || e.Known || e.Code != -1 {
		t.Errorf("Exited of an adopted instance = %+v, %v; want unknown, code -1", e, ok)
	}
	if d.Starts("web-0") != 2 {
		t.Errorf("Starts = %d, want 2", d.Starts("web-0"))
	}

	// Stop sends SIGTERM, and SIGKILL to an instance that ignores it.
	d.Start(ctx, spec("web-0"))
	d.Stop(ctx, "web-0", time.Second)
	d.Start(ctx, spec("web-0"))
	if err := d.IgnoreTerm("web-0"); err != nil {
		t.Fatal(err)
	}
	d.Stop(ctx, "web-0", time.Second)
	if got, want := d.Signals("web-0"), []string{fake.SIGTERM, fake.SIGTERM, fake.SIGKILL}; !slices.Equal(got, want) {
		t.Errorf("Signals = %v, want %v", got, want)
	}

	if err := d.WriteLog("web-0", []byte("one\ntwo\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := d.Logs("web-0", 4); string(b) != "two\n" {
		t.Errorf("Logs(4) = %q", b)
	}
	d.Apply(ctx, "web-0", render.Resources{CPU: 250})
	if r, ok := d.Applied("web-0"); !ok || r.CPU != 250 {
		t.Errorf("Applied = %+v, %v", r, ok)
	}
	if got := d.Instances(); !slices.Equal(got, []string{"web-0"}) {
		t.Errorf("Instances = %v", got)
	}

	d.SetCapacity(render.Resources{CPU: 1500, Memory: 1 << 30})
	if c, _ := d.Capacity(ctx); c.CPU != 1500 {
		t.Errorf("Capacity = %+v", c)
	}
	vips := []netip.Addr{netip.MustParseAddr("10.201.0.5")}
	routes := []nodeexec.Route{{Dest: netip.MustParsePrefix("10.200.3.0/24"), Via: netip.MustParseAddr("192.0.2.3")}}
	d.SetVIPs(ctx, vips)
	d.SetRoutes(ctx, routes)
	if !slices.Equal(d.VIPs(), vips) || !slices.Equal(d.Routes(), routes) {
		t.Errorf("VIPs, Routes = %v, %v", d.VIPs(), d.Routes())
	}
}

// The fake's host problems: Check returns what SetProblems set, fails
// while FailChecks says so, and a racct problem makes Start and Apply
// refuse limits (never run unlimited) while an instance without limits
// still starts.
func TestHostProblems(t *testing.T) {
	ctx := context.Background()
	d := fake.New()
	if ps, err := d.Check(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("Check of a fresh fake = %v, %v", ps, err)
	}
	racct := nodeexec.HostProblem{Check: "racct", Problem: "resource accounting is off", Fix: "reboot with it"}
	d.SetProblems([]nodeexec.HostProblem{racct})
	if ps, err := d.Check(ctx); err != nil || !slices.Equal(ps, []nodeexec.HostProblem{racct}) {
		t.Fatalf("Check = %v, %v; want the racct problem", ps, err)
	}
	limited := spec("web-0")
	limited.Spec.Resources = render.Resources{CPU: 500}
	if _, err := d.Start(ctx, limited); !errors.Is(err, nodeexec.ErrLimitsUnenforced) {
		t.Fatalf("Start with limits and racct off: %v, want ErrLimitsUnenforced", err)
	}
	if d.Starts("web-0") != 0 {
		t.Error("the refused start counted")
	}
	if _, err := d.Start(ctx, spec("web-0")); err != nil {
		t.Fatalf("Start without limits: %v", err)
	}
	if err := d.Apply(ctx, "web-0", render.Resources{Memory: 1 << 20}); !errors.Is(err, nodeexec.ErrLimitsUnenforced) {
		t.Errorf("Apply of limits with racct off: %v, want ErrLimitsUnenforced", err)
	}
	if _, ok := d.Applied("web-0"); ok {
		t.Error("the refused limits were recorded as applied")
	}
	boom := errors.New("sysctl: not found")
	d.FailChecks(boom)
	if _, err := d.Check(ctx); !errors.Is(err, boom) {
		t.Errorf("Check after FailChecks: %v", err)
	}
	d.FailChecks(nil)
	d.SetProblems(nil)
	if err := d.Apply(ctx, "web-0", render.Resources{Memory: 1 << 20}); err != nil {
		t.Errorf("Apply once racct is back: %v", err)
	}
	if n := d.Checks(); n != 3 {
		t.Errorf("Checks = %d, want 3", n)
	}
}

// A hook makes operations slow or failing, and the driver counts the
// operations inside it: in all, and two at once on one instance.
func TestHook(t *testing.T) {
	ctx := context.Background()
	d := fake.New()
	entered := make(chan fake.Op, 8)
	release := make(chan struct{})
	d.SetHook(func(ctx context.Context, op fake.Op, name string) error {
		if name == "broken" {
			return errors.New("no such dataset")
		}
		entered <- op
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})

	// A failing hook fails the operation, which changes nothing.
	if _, err := d.Start(ctx, spec("broken")); err == nil || d.Starts("broken") != 0 {
		t.Fatalf("Start through a failing hook: %v, %d starts", err, d.Starts("broken"))
	}
	if now, _ := d.Busy(); now != 0 {
		t.Fatalf("a failed operation is still counted: %d", now)
	}

	// A Start and a Stop of web-0 inside at once, and an EnsureVolume.
	errs := make(chan error, 3)
	go func() { _, err := d.Start(ctx, spec("web-0")); errs <- err }()
	<-entered
	go func() { errs <- d.Stop(ctx, "web-0", time.Second) }()
	<-entered
	go func() { _, err := d.EnsureVolume(ctx, "data", 0); errs <- err }()
	<-entered
	if now, most := d.Busy(); now != 3 || most != 3 {
		t.Errorf("Busy = %d, %d; want 3, 3", now, most)
	}
	if r, _ := d.Running(ctx); len(r) != 0 {
		t.Errorf("a Start still in its hook already runs: %v", r)
	}
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if now, most := d.Busy(); now != 0 || most != 3 {
		t.Errorf("Busy = %d, %d after they returned; want 0, 3", now, most)
	}
	if got := d.Overlaps(); !slices.Equal(got, []string{"web-0"}) {
		t.Errorf("Overlaps = %v, want [web-0]", got)
	}

	// A hook that waits ends with the operation's context.
	d.SetHook(func(ctx context.Context, op fake.Op, name string) error {
		<-ctx.Done()
		return ctx.Err()
	})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.Destroy(cctx, "web-0"); !errors.Is(err, context.Canceled) {
		t.Errorf("Destroy with a cancelled context: %v", err)
	}
}
