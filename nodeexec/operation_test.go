package nodeexec_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/report"
)

// gate makes the fake driver's operations of one kind slow: each waits
// for a token (or for its context to end).
type gate chan struct{}

func (g gate) hook(kind fake.Op) fake.Hook {
	return func(ctx context.Context, op fake.Op, name string) error {
		if op != kind {
			return nil
		}
		select {
		case <-g:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// let lets one operation through, failing the test when none comes.
func (g gate) let(t *testing.T) {
	t.Helper()
	select {
	case g <- struct{}{}:
	case <-time.After(20 * time.Second):
		t.Fatal("no operation waits at the gate")
	}
}

// eventually polls cond until it holds, for up to 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (w *world) busy() int {
	now, _ := w.drv.Busy()
	return now
}

func (w *world) shown(name string) (report.Instance, bool) {
	w.t.Helper()
	inst, _, err := w.rec.Status(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	for _, ri := range inst {
		if ri.Name == name {
			return ri, true
		}
	}
	return report.Instance{}, false
}

// reconcilerGoroutines counts the goroutines running an operation of a
// Reconciler, from the stacks of all goroutines (as goleak does).
func reconcilerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("nodeexec.(*Reconciler).dispatch")) {
			count++
		}
	}
	return count
}

func jails(n int) map[string]string {
	files := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("j%02d", i)
		files[name+".yaml"] = jail(name, "  resources: {cpu: 100m, memory: 64M}\n")
	}
	return files
}

// Twenty slow starts: the pass that decides them returns while they run,
// at most MaxParallel (4) run at once, and each one that ends wakes a pass
// that folds it and starts the next.
func TestPassNeverWaitsAndBoundsOperations(t *testing.T) {
	w := newWorld(t, jails(20))
	g := make(gate)
	w.drv.SetHook(g.hook(fake.OpStart))

	res := w.passOnce() // every start blocks in the driver: the pass does not
	if res.InFlight != nodeexec.DefaultMaxParallel || res.Created != 0 {
		t.Fatalf("first pass: %+v, want %d in flight and nothing created yet", res, nodeexec.DefaultMaxParallel)
	}
	eventually(t, "four starts inside the driver", func() bool { return w.busy() == 4 })
	starting := 0
	for _, st := range w.rec.Instances() {
		if st.State == report.StateStarting {
			starting++
		}
	}
	if starting != 4 || len(w.rec.Instances()) != 4 {
		t.Fatalf("instances shown: %+v, want the 4 in flight, starting", w.rec.Instances())
	}
	// Passes meanwhile start nothing more.
	if res := w.passOnce(); res.InFlight != 4 {
		t.Fatalf("a pass with every worker busy: %+v", res)
	}

	created := 0
	for created < 20 {
		g.let(t) // one start goes through
		w.waitWake()
		res, err := w.rec.Pass(context.Background(), w.desired)
		if err != nil {
			t.Fatal(err)
		}
		if res.Created != 1 || len(res.Errors) > 0 || res.InFlight > 4 {
			t.Fatalf("after %d starts: %+v", created, res)
		}
		created += res.Created
	}
	if _, most := w.drv.Busy(); most != 4 {
		t.Errorf("at most %d operations ran at once, want 4", most)
	}
	if got := len(w.running()); got != 20 {
		t.Errorf("%d instances run, want 20", got)
	}
	for name, st := range w.rec.Instances() {
		if st.State != report.StateRunning {
			t.Errorf("%s is %s", name, st.State)
		}
	}
	if o := w.drv.Overlaps(); len(o) > 0 {
		t.Errorf("two operations at once on %v", o)
	}
}

// The bound is configurable.
func TestMaxParallel(t *testing.T) {
	w := newWorld(t, jails(5))
	w.maxParallel = 2
	w.newReconciler()
	g := make(gate)
	w.drv.SetHook(g.hook(fake.OpStart))
	if res := w.passOnce(); res.InFlight != 2 {
		t.Fatalf("%+v, want 2 in flight", res)
	}
	// Both are in flight; wait until both are inside the driver (a busy
	// machine may not have run the second goroutine yet) before letting
	// them go.
	eventually(t, "two operations inside the driver", func() bool { now, _ := w.drv.Busy(); return now == 2 })
	close(g)
	if res := w.pass(); res.Created != 5 {
		t.Fatalf("%+v", res)
	}
	if _, most := w.drv.Busy(); most != 2 {
		t.Errorf("at most %d at once, want 2", most)
	}
}

// An instance never has two operations in flight: a new spec, then its
// deletion, arrive while its start is in flight; each is done only once
// the operation before has ended and been folded.
func TestOneOperationPerInstance(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "")})
	g := make(gate)
	w.drv.SetHook(g.hook(fake.OpStart))
	w.passOnce()
	eventually(t, "the start inside the driver", func() bool { return w.busy() == 1 })

	w.set("a.yaml", jail("app", "  env: {A: \"2\"}\n")) // a restart-class change
	if res := w.passOnce(); res.InFlight != 1 || res.Restarted != 0 {
		t.Fatalf("a new spec during the start: %+v", res)
	}
	w.set("a.yaml", "") // deleted
	if res := w.passOnce(); res.InFlight != 1 || res.Removed != 0 {
		t.Fatalf("deleted during the start: %+v", res)
	}
	if w.busy() != 1 {
		t.Fatalf("%d operations inside the driver, want the start alone", w.busy())
	}
	if ri, ok := w.shown("app"); !ok || ri.State != report.StateStarting {
		t.Fatalf("app shown as %+v, %v while it starts", ri, ok)
	}

	close(g)
	res := w.pass() // folds the start, then removes it
	if res.Created != 1 || res.Removed != 1 || len(res.Errors) > 0 {
		t.Fatalf("%+v", res)
	}
	if _, ok := w.rec.Instances()["app"]; ok || len(w.drv.Instances()) != 0 {
		t.Fatalf("app still held: %v, %v", w.rec.Instances(), w.drv.Instances())
	}
	if o := w.drv.Overlaps(); len(o) > 0 {
		t.Errorf("two operations at once on %v", o)
	}
}

// A start in flight is reported starting, with the address and spec hash it
// is started with; once it has ended, the next pass records it running and
// saves it.
func TestReportShowsStartingThenRunning(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("db", "  volumes: [{name: db-data, mountPath: /data}]\n")})
	g := make(gate)
	w.drv.SetHook(g.hook(fake.OpStart))
	w.passOnce()
	ri, ok := w.shown("db")
	var addr string
	for _, pl := range w.plan.Placements {
		if pl.Instance == "db" {
			addr = pl.Address.String()
		}
	}
	if !ok || ri.State != report.StateStarting || ri.Address.String() != addr || ri.SpecHash != w.model.Instance("db").SpecHash {
		t.Fatalf("db shown as %+v, %v; want starting at %s", ri, ok, addr)
	}
	if saved, _ := nodeexec.LoadState(w.dir); saved.Instances["db"] != nil {
		t.Fatalf("state.json records db before its start ended: %+v", saved.Instances["db"])
	}
	// The volume, created by the operation, is not deleted under it.
	eventually(t, "the start inside the driver", func() bool { return w.busy() == 1 })
	if err := w.rec.DeleteVolume(context.Background(), "db-data"); !errors.Is(err, nodeexec.ErrBusy) {
		t.Fatalf("deleting the volume of an instance being started: %v", err)
	}

	g.let(t)
	w.waitWake()
	// The agent collects before it builds the report it plans with.
	w.rec.Collect()
	if ri, _ := w.shown("db"); ri.State != report.StateRunning || ri.Address.String() != addr {
		t.Fatalf("db shown as %+v after its start", ri)
	}
	res, err := w.rec.Pass(context.Background(), w.desired)
	if err != nil || res.Created != 1 || res.InFlight != 0 {
		t.Fatalf("the pass after the start: %+v, %v", res, err)
	}
	saved, err := nodeexec.LoadState(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := saved.Instances["db"]; st == nil || st.State != report.StateRunning || st.PID != w.running()["db"].PID {
		t.Fatalf("state.json: %+v", st)
	}
}

// Break before make: a stateful instance whose stop is in flight is still
// reported as it was, so that its new node keeps waiting, until the stop
// has ended; then it is gone from the report.
func TestStoppingInstanceIsReportedUntilGone(t *testing.T) {
	db := jail("db", "  volumes: [{name: db-data, mountPath: /d}]\n")
	w := newWorld(t, map[string]string{"a.yaml": db})
	w.pass()
	g := make(gate)
	w.drv.SetHook(g.hook(fake.OpStop))
	w.set("a.yaml", strings.Replace(db, "node: n1", "node: n2", 1))
	w.set("keel.lock", "apiVersion: keel/v1\nkind: Lock\npins: {db: n2}\n")
	if res := w.passOnce(); res.InFlight != 1 {
		t.Fatalf("%+v", res)
	}
	eventually(t, "the stop inside the driver", func() bool { return w.busy() == 1 })
	for range 2 {
		if ri, ok := w.shown("db"); !ok || ri.State != report.StateRunning {
			t.Fatalf("db shown as %+v, %v while it stops", ri, ok)
		}
		w.passOnce() // plans with that report
		if pl := w.placement("db"); pl.Node != "n2" || !slices.Equal(pl.WaitsFor, []string{"n1"}) {
			t.Fatalf("db placed %+v while n1 stops it, want on n2 waiting for n1", pl)
		}
	}
	close(g)
	if res := w.pass(); res.Stopped != 1 || res.Removed != 1 {
		t.Fatalf("%+v", res)
	}
	if _, ok := w.shown("db"); ok {
		t.Fatal("db still reported once stopped and removed")
	}
	w.passOnce()
	if pl := w.placement("db"); len(pl.WaitsFor) > 0 {
		t.Fatalf("n2 still waits: %+v", pl)
	}
}

// Close cancels the operations in flight and waits for them: afterwards no
// goroutine of the reconciler runs, what the operations did is saved, and
// the next run starts what they left.
func TestCloseCancelsAndWaits(t *testing.T) {
	w := newWorld(t, jails(6))
	w.drv.SetHook(make(gate).hook(fake.OpStart)) // starts end only when cancelled
	if res := w.passOnce(); res.InFlight != 4 {
		t.Fatalf("%+v", res)
	}
	eventually(t, "four starts inside the driver", func() bool { return w.busy() == 4 })
	if n := reconcilerGoroutines(); n != 4 {
		t.Fatalf("%d operation goroutines, want 4", n)
	}
	if err := w.rec.Close(); err != nil {
		t.Fatal(err)
	}
	if n := reconcilerGoroutines(); n != 0 {
		t.Fatalf("%d operation goroutines after Close", n)
	}
	if w.busy() != 0 {
		t.Fatalf("%d operations still inside the driver after Close", w.busy())
	}
	if _, err := w.rec.Pass(context.Background(), w.desired); !errors.Is(err, nodeexec.ErrClosed) {
		t.Fatalf("Pass after Close: %v", err)
	}
	saved, err := nodeexec.LoadState(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for name, st := range saved.Instances {
		if st.State != report.StateCrashLoop || !strings.Contains(st.Error, context.Canceled.Error()) {
			t.Errorf("%s saved as %+v", name, st)
		}
		cancelled++
	}
	if cancelled != 4 {
		t.Fatalf("%d cancelled starts saved, want 4", cancelled)
	}

	// The next run: two of them were deleted meanwhile.
	w.drv.SetHook(nil)
	delete(w.files, "j00.yaml")
	delete(w.files, "j01.yaml")
	w.newReconciler()
	w.clk.advance(time.Second) // their backoff
	res := w.pass()
	if res.Removed != 2 || len(w.running()) != 4 || len(w.rec.Instances()) != 4 {
		t.Fatalf("the next run: %+v, running %v, holding %v", res, w.running(), w.rec.Instances())
	}
}

// Issue 9 (slow operations): a fresh instance whose first start fails
// waits for its backoff like any crashed instance, rather than being
// started again at the next pass (which, with a pass woken by every
// operation that ends, would retry it without pause).
func TestFailedFirstStartBacksOff(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "")})
	w.drv.FailNextStart("app", errors.New("no such image"))
	w.pass()
	w.pass()
	if w.drv.Starts("app") != 0 {
		t.Fatalf("started again before its backoff: %d starts", w.drv.Starts("app"))
	}
	if st := w.rec.Instances()["app"]; st.State != report.StateCrashLoop || st.Backoff != time.Second {
		t.Fatalf("state %+v", st)
	}
	w.clk.advance(time.Second)
	if res := w.pass(); res.Created != 1 || w.drv.Starts("app") != 1 {
		t.Fatalf("not started after its backoff: %+v", res)
	}
}

// An operation that fails is tried again after a delay (1 s, doubling),
// not by the pass its failure wakes.
func TestFailedOperationWaitsBeforeRetry(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("db", "  volumes: [{name: db-data, mountPath: /d}]\n")})
	var mu gosync.Mutex
	tries, fail := 0, true
	w.drv.SetHook(func(ctx context.Context, op fake.Op, name string) error {
		if op != fake.OpEnsureVolume {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		tries++
		if fail {
			return errors.New("out of space")
		}
		return nil
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return tries
	}
	prev := 0
	for i, step := range []struct {
		advance time.Duration
		tries   int
	}{{0, 1}, {0, 1}, {999 * time.Millisecond, 1}, {time.Millisecond, 2}, {time.Second, 2}, {time.Second, 3}} {
		w.clk.advance(step.advance)
		res := w.pass()
		if count() != step.tries {
			t.Fatalf("step %d: %d tries, want %d (%+v)", i, count(), step.tries, res)
		}
		if tried := count() > prev; tried != (res.Errors["db"] != nil) {
			t.Fatalf("step %d: tried %v, errors %v", i, tried, res.Errors)
		}
		prev = count()
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	w.clk.advance(4 * time.Second)
	if res := w.pass(); res.Created != 1 || count() != 4 {
		t.Fatalf("after the failures: %+v, %d tries", res, count())
	}
}
