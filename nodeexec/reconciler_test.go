package nodeexec_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// clock is a settable test clock. The fake driver reads it from the
// reconciler's operations, on their goroutines.
type clock struct {
	mu gosync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// world is one node (n1) of a two-node cluster, reconciled with the fake
// driver; n2 is simulated through its report.
type world struct {
	t     *testing.T
	clk   *clock
	drv   *fake.Driver
	rec   *nodeexec.Reconciler
	dir   string
	files fstest.MapFS
	n2    report.Report // n2's report; its Time follows the clock
	n2Age time.Duration // how far n2's report lags the clock (past the TTL: n2 is dead)
	// readySince, when set, is the readySince of every running instance
	// in n1's own report (what its prober says).
	readySince time.Time
	extra      []report.Report // other reports, as they are (a ghost's, say)
	model      *render.Model
	plan       *planner.Plan
	// desired is what the last pass was given.
	desired nodeexec.Desired
	// maxParallel is the reconciler's bound (0: the default).
	maxParallel int
	// puller pulls OCI images (nil: none).
	puller *oci.Puller
}

const base = `apiVersion: keel/v1
kind: Cluster
metadata: {name: t}
spec: {livenessTTL: 30s, reportInterval: 10s}
`

func node(name, addr, cidr string) string {
	return fmt.Sprintf("apiVersion: keel/v1\nkind: Node\nmetadata: {name: %s}\nspec: {address: %s, podCIDR: %s, capacity: {cpu: \"8\", memory: 8G}}\n", name, addr, cidr)
}

func newWorld(t *testing.T, specs map[string]string) *world {
	t.Helper()
	w := &world{t: t, clk: &clock{t: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}, drv: fake.New(), dir: t.TempDir()}
	w.drv.SetClock(w.clk.now)
	w.files = fstest.MapFS{
		"cluster.yaml":  {Data: []byte(base)},
		"nodes/n1.yaml": {Data: []byte(node("n1", "192.0.2.1", "10.200.1.0/24"))},
		"nodes/n2.yaml": {Data: []byte(node("n2", "192.0.2.2", "10.200.2.0/24"))},
	}
	for k, v := range specs {
		w.files[k] = &fstest.MapFile{Data: []byte(v)}
	}
	w.n2 = report.Report{Node: "n2"}
	w.newReconciler()
	return w
}

// newReconciler starts the reconciler afresh (an agent restart), closing
// the previous one.
func (w *world) newReconciler() { w.newReconcilerWith(nil) }

// newReconcilerWith is newReconciler with a change to the configuration.
func (w *world) newReconcilerWith(change func(*nodeexec.Config)) {
	w.t.Helper()
	if w.rec != nil {
		if err := w.rec.Close(); err != nil {
			w.t.Fatal(err)
		}
	}
	cfg := nodeexec.Config{Node: "n1", Driver: w.drv, StateDir: w.dir, Now: w.clk.now, StopGrace: time.Second, MaxParallel: w.maxParallel, Puller: w.puller}
	if change != nil {
		change(&cfg)
	}
	rec, err := nodeexec.NewReconciler(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.rec = rec
	w.t.Cleanup(func() {
		if err := rec.Close(); err != nil {
			w.t.Error(err)
		}
	})
}

func (w *world) set(path, content string) {
	if content == "" {
		delete(w.files, path)
		return
	}
	w.files[path] = &fstest.MapFile{Data: []byte(content)}
}

// pass plans as n1 would (with its own fresh report and n2's) and
// reconciles until no operation is in flight, as the agent's loop does
// when woken by the operations that end; it returns the passes' results
// summed up.
func (w *world) pass() nodeexec.Result {
	w.t.Helper()
	res := w.passOnce()
	for res.InFlight > 0 {
		w.waitWake()
		more, err := w.rec.Pass(context.Background(), w.desired)
		if err != nil {
			w.t.Fatal(err)
		}
		res = sum(res, more)
	}
	return res
}

// passOnce plans and runs one pass, which returns without waiting for the
// operations it starts.
func (w *world) passOnce() nodeexec.Result {
	w.t.Helper()
	m, err := render.Render(w.files)
	if err != nil {
		w.t.Fatal(err)
	}
	w.model = m
	inst, vols, err := w.rec.Status(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	for i := range inst {
		if inst[i].State == report.StateRunning {
			inst[i].ReadySince = w.readySince
		}
	}
	own := report.Report{Node: "n1", Time: w.clk.now(), Instances: inst, Volumes: vols}
	w.n2.Time = w.clk.now().Add(-w.n2Age)
	reports := append([]report.Report{own, w.n2}, w.extra...)
	w.plan = planner.Compute(planner.Input{Model: m, Reports: reports, Now: w.clk.now()})
	w.desired = nodeexec.Desired{Model: m, Plan: w.plan, Reports: reports}
	res, err := w.rec.Pass(context.Background(), w.desired)
	if err != nil {
		w.t.Fatal(err)
	}
	return res
}

// waitWake waits until the reconciler says an operation ended.
func (w *world) waitWake() {
	w.t.Helper()
	select {
	case <-w.rec.Wake():
	case <-time.After(20 * time.Second):
		w.t.Fatal("no operation ended within 20 s")
	}
}

// sum adds b's counts, errors and waits to a's; InFlight is b's.
func sum(a, b nodeexec.Result) nodeexec.Result {
	a.Created += b.Created
	a.Restarted += b.Restarted
	a.Replaced += b.Replaced
	a.Stopped += b.Stopped
	a.Removed += b.Removed
	maps.Copy(a.Errors, b.Errors)
	a.Waiting = b.Waiting
	a.InFlight = b.InFlight
	return a
}

func (w *world) running() map[string]nodeexec.Process {
	r, err := w.drv.Running(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

func (w *world) placedOn(name string) string { return w.placement(name).Node }

func (w *world) placement(name string) planner.Placement {
	for _, pl := range w.plan.Placements {
		if pl.Instance == name {
			return pl
		}
	}
	return planner.Placement{}
}

func jail(name, extra string) string {
	return fmt.Sprintf("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: %s}\nspec:\n  image: base/x\n  command: [/bin/app]\n  node: n1\n%s", name, extra)
}

func TestCreateThenNothingToDo(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("db", "  volumes: [{name: db-data, mountPath: /data}]\n")})
	res := w.pass()
	if res.Created != 1 || len(res.Errors) != 0 {
		t.Fatalf("first pass: %+v", res)
	}
	vols, _ := w.drv.Volumes(context.Background())
	if len(vols) != 1 || vols[0] != "db-data" {
		t.Fatalf("volumes %v", vols)
	}
	env := strings.Join(w.drv.Env("db"), " ")
	if !strings.Contains(env, "KEEL_VOLUME_DB_DATA=") || !strings.Contains(env, "KEEL_ADDRESS=10.200.1.") {
		t.Errorf("environment %s", env)
	}
	if res := w.pass(); res.Created+res.Restarted+res.Stopped != 0 || w.drv.Starts("db") != 1 {
		t.Fatalf("second pass changed something: %+v, %d starts", res, w.drv.Starts("db"))
	}
}

func TestCrashRestartsWithBackoff(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "")})
	w.pass()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for i, delay := range want {
		if err := w.drv.Crash("app", 1); err != nil {
			t.Fatal(err)
		}
		w.pass()
		st := w.rec.Instances()["app"]
		if st.State != report.StateCrashLoop {
			t.Fatalf("crash %d: state %s", i, st.State)
		}
		w.clk.advance(delay - time.Millisecond)
		w.pass()
		if w.drv.Starts("app") != i+1 {
			t.Fatalf("crash %d: restarted before its backoff of %s", i, delay)
		}
		w.clk.advance(time.Millisecond)
		w.pass()
		if w.drv.Starts("app") != i+2 {
			t.Fatalf("crash %d: not restarted after %s", i, delay)
		}
	}
	if st := w.rec.Instances()["app"]; st.Restarts != 4 || st.State != report.StateRunning {
		t.Fatalf("state %+v", st)
	}
	// A minute up resets the backoff to one second.
	w.clk.advance(2 * time.Minute)
	w.drv.Crash("app", 1)
	w.pass()
	w.clk.advance(time.Second)
	w.pass()
	if w.drv.Starts("app") != 6 {
		t.Fatalf("backoff not reset after a minute up: %d starts", w.drv.Starts("app"))
	}
}

func TestBackoffIsCappedAtFiveMinutes(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "")})
	w.pass()
	for range 12 {
		w.drv.Crash("app", 1)
		w.pass()
		w.clk.advance(10 * time.Minute)
		w.pass()
	}
	if st := w.rec.Instances()["app"]; st.Backoff != 5*time.Minute {
		t.Fatalf("backoff %s, want 5m", st.Backoff)
	}
}

func TestRestartPolicies(t *testing.T) {
	cases := []struct {
		policy    string
		code      int
		restarted bool
		state     report.State
	}{
		{"Never", 1, false, report.StateFailed},
		{"Never", 0, false, report.StateStopped},
		{"OnFailure", 0, false, report.StateStopped},
		{"OnFailure", 2, true, report.StateRunning},
		{"Always", 0, true, report.StateRunning},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s exit %d", c.policy, c.code), func(t *testing.T) {
			w := newWorld(t, map[string]string{"a.yaml": jail("app", "  restartPolicy: "+c.policy+"\n")})
			w.pass()
			w.drv.Crash("app", c.code)
			w.pass()
			w.clk.advance(time.Hour)
			w.pass()
			if got := w.drv.Starts("app") == 2; got != c.restarted {
				t.Errorf("restarted = %v", got)
			}
			if st := w.rec.Instances()["app"]; st.State != c.state {
				t.Errorf("state %s, want %s", st.State, c.state)
			}
		})
	}
}

func TestChangesByClass(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "  env: {A: \"1\"}\n  volumes: [{name: app-data, mountPath: /d}]\n")})
	w.pass()
	pid := w.running()["app"].PID

	// Live: resources are applied without a restart.
	w.set("a.yaml", jail("app", "  env: {A: \"1\"}\n  volumes: [{name: app-data, mountPath: /d}]\n  resources: {cpu: \"2\", memory: 1G}\n"))
	w.pass()
	if r, ok := w.drv.Applied("app"); !ok || r.CPU != 2000 {
		t.Fatalf("resources not applied: %v %v", r, ok)
	}
	if w.running()["app"].PID != pid {
		t.Fatal("a live change restarted the instance")
	}
	// Restart: env.
	w.set("a.yaml", jail("app", "  env: {A: \"2\"}\n  volumes: [{name: app-data, mountPath: /d}]\n  resources: {cpu: \"2\", memory: 1G}\n"))
	res := w.pass()
	if res.Restarted != 1 || w.running()["app"].PID == pid {
		t.Fatalf("env change: %+v", res)
	}
	// Replace: image; the volume survives.
	w.set("a.yaml", jail("app", "  env: {A: \"2\"}\n  volumes: [{name: app-data, mountPath: /d}]\n  resources: {cpu: \"2\", memory: 1G}\n")+"")
	w.files["a.yaml"].Data = []byte(strings.Replace(string(w.files["a.yaml"].Data), "base/x", "base/y", 1))
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("image change: %+v", res)
	}
	if vols, _ := w.drv.Volumes(context.Background()); len(vols) != 1 {
		t.Fatalf("replace lost the volume: %v", vols)
	}
	if st := w.rec.Instances()["app"]; st.SpecHash != w.model.Instance("app").SpecHash {
		t.Fatal("state does not record the new spec hash")
	}
}

func TestDeletedInstanceIsRemovedButItsVolumeKept(t *testing.T) {
	w := newWorld(t, map[string]string{
		"a.yaml": jail("app", "  volumes: [{name: app-data, mountPath: /d}]\n"),
		"b.yaml": jail("other", ""),
	})
	w.pass()
	w.set("a.yaml", "")
	res := w.pass()
	if res.Removed != 1 {
		t.Fatalf("%+v", res)
	}
	if _, ok := w.running()["app"]; ok {
		t.Fatal("deleted instance still runs")
	}
	if vols, _ := w.drv.Volumes(context.Background()); len(vols) != 1 {
		t.Fatalf("volume removed with its instance: %v", vols)
	}
	if _, ok := w.rec.Instances()["app"]; ok {
		t.Fatal("deleted instance still in the state")
	}
}

// A stateless instance moved to n2 keeps running on n1 until n2 reports it
// running there (make before break).
func TestMakeBeforeBreak(t *testing.T) {
	svc := "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: web}\nspec: {image: base/x, command: [/bin/web], node: NODE}\n"
	w := newWorld(t, map[string]string{"a.yaml": strings.Replace(svc, "NODE", "n1", 1)})
	w.pass()
	w.set("a.yaml", strings.Replace(svc, "NODE", "n2", 1))
	w.pass()
	if w.placedOn("web") != "n2" {
		t.Fatalf("web placed on %q", w.placedOn("web"))
	}
	if _, ok := w.running()["web"]; !ok {
		t.Fatal("stopped before the new owner runs it")
	}
	w.n2.Instances = []report.Instance{{Name: "web", State: report.StateStarting, Address: netip.MustParseAddr("10.200.2.9"), SpecHash: w.model.Instance("web").SpecHash}}
	w.pass()
	if _, ok := w.running()["web"]; !ok {
		t.Fatal("stopped while the new owner only starts it")
	}
	w.n2.Instances[0].State = report.StateRunning
	w.n2.Instances[0].Ready = new(false)
	w.pass()
	if _, ok := w.running()["web"]; !ok {
		t.Fatal("stopped while the new owner runs it, not ready yet")
	}
	w.n2.Instances[0].Ready = new(true)
	w.pass()
	if _, ok := w.running()["web"]; ok {
		t.Fatal("still running after the new owner reports it running and ready")
	}
}

// A copy moved away that does not run here (it crashed, or this node was
// away) serves nothing: it is removed at once, whether or not the new
// owner's copy is ready yet.
func TestMovedCopyNotRunningGoesAtOnce(t *testing.T) {
	svc := "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: web}\nspec: {image: base/x, command: [/bin/web], node: NODE}\n"
	w := newWorld(t, map[string]string{"a.yaml": strings.Replace(svc, "NODE", "n1", 1)})
	w.pass()
	if err := w.drv.Crash("web", 1); err != nil {
		t.Fatal(err)
	}
	w.clk.advance(time.Millisecond) // before its restart backoff ends
	w.pass()
	w.set("a.yaml", strings.Replace(svc, "NODE", "n2", 1))
	w.n2.Instances = []report.Instance{{Name: "web", State: report.StateRunning, Ready: new(false), Address: netip.MustParseAddr("10.200.2.9"), SpecHash: w.model.Instance("web").SpecHash}}
	w.pass()
	w.pass()
	if _, held := w.rec.Instances()["web"]; held {
		t.Fatalf("a copy that does not run is kept while the new owner's is not ready: %+v", w.rec.Instances()["web"])
	}
}

// A stateful instance pinned to n2 is stopped on n1 at once, and n1 does
// not start a stateful instance while n2 reports it running (break before
// make).
func TestBreakBeforeMake(t *testing.T) {
	db := jail("db", "  volumes: [{name: db-data, mountPath: /d}]\n")
	w := newWorld(t, map[string]string{"a.yaml": db})
	w.pass()
	w.set("a.yaml", strings.Replace(db, "node: n1", "node: n2", 1))
	w.set("keel.lock", "apiVersion: keel/v1\nkind: Lock\npins: {db: n2}\n")
	w.pass()
	if _, ok := w.running()["db"]; ok {
		t.Fatal("a stateful instance moved away keeps running")
	}

	// The other way round: n2 still runs it, the pin now says n1.
	w2 := newWorld(t, map[string]string{"a.yaml": db, "keel.lock": "apiVersion: keel/v1\nkind: Lock\npins: {db: n1}\n"})
	w2.n2.Instances = []report.Instance{{Name: "db", State: report.StateRunning, Address: netip.MustParseAddr("10.200.2.9")}}
	res := w2.pass()
	if _, ok := w2.running()["db"]; ok || !errors.Is(res.Waiting["db"], nodeexec.ErrWaiting) || !strings.Contains(fmt.Sprint(res.Waiting["db"]), "n2") || len(res.Errors) > 0 {
		t.Fatalf("started while n2 runs it: %+v", res)
	}
	w2.n2.Instances[0].State = report.StateStopped
	w2.pass()
	if _, ok := w2.running()["db"]; !ok {
		t.Fatal("not started once n2 reports it stopped")
	}
}

// Issue 8 item 3: the pin moves to n1 while n2's agent is down (its report
// is past the TTL, so n2 is dead) and its last report says db runs there,
// in any state but stopped. n1 waits however old that report is, and so it
// does for a report of a node outside the inventory; only a report that
// no longer lists db running (or no report at all) lets it start.
func TestBreakBeforeMakeWhileTheOldNodeIsDown(t *testing.T) {
	db := jail("db", "  volumes: [{name: db-data, mountPath: /d}]\n")
	lock := "apiVersion: keel/v1\nkind: Lock\npins: {db: n1}\n"
	for _, st := range []report.State{report.StateRunning, report.StateStarting, report.StateCrashLoop, report.StateFailed} {
		t.Run("dead node, "+string(st), func(t *testing.T) {
			w := newWorld(t, map[string]string{"a.yaml": db, "keel.lock": lock})
			w.n2Age = 24 * time.Hour
			w.n2.Instances = []report.Instance{{Name: "db", State: st, Address: netip.MustParseAddr("10.200.2.9")}}
			for range 3 {
				res := w.pass()
				if n2 := w.plan.Nodes[1]; n2.Name != "n2" || n2.Alive {
					t.Fatalf("n2 should be dead: %+v", w.plan.Nodes)
				}
				if _, ok := w.running()["db"]; ok || !errors.Is(res.Waiting["db"], nodeexec.ErrWaiting) {
					t.Fatalf("started while dead n2's last report lists it %s: %+v", st, res)
				}
				w.clk.advance(time.Hour)
			}
			w.n2.Instances = nil // n2 came back and reported it gone
			w.n2Age = 0
			w.pass()
			if _, ok := w.running()["db"]; !ok {
				t.Fatal("not started once n2 no longer lists it")
			}
		})
	}
	t.Run("a node outside the inventory", func(t *testing.T) {
		w := newWorld(t, map[string]string{"a.yaml": db, "keel.lock": lock})
		w.extra = []report.Report{{Node: "gone", Time: w.clk.now().Add(-time.Hour), Instances: []report.Instance{{Name: "db", State: report.StateRunning}}}}
		if res := w.pass(); !errors.Is(res.Waiting["db"], nodeexec.ErrWaiting) || !strings.Contains(res.Waiting["db"].Error(), "gone") {
			t.Fatalf("did not wait for node gone: %+v", res)
		}
		w.extra = nil // the operator deleted its report ref
		w.pass()
		if _, ok := w.running()["db"]; !ok {
			t.Fatal("not started once the report of gone is deleted")
		}
	})
}

// An agent that crashed after starting an instance but before saving its
// state adopts it on restart instead of starting a second copy.
func TestAdoptsAfterLosingItsState(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "")})
	w.pass()
	pid := w.running()["app"].PID
	w.drv.AgentRestart()
	w.dir = t.TempDir() // the state file is gone
	w.newReconciler()
	w.pass()
	if w.drv.Starts("app") != 1 || w.running()["app"].PID != pid {
		t.Fatalf("restarted or duplicated: %d starts", w.drv.Starts("app"))
	}
	// Its exit is not known to the new run: it counts as a failure.
	w.drv.Crash("app", 0)
	w.pass()
	if st := w.rec.Instances()["app"]; st.State != report.StateCrashLoop || st.LastExit == nil || st.LastExit.Known {
		t.Fatalf("state %+v", st)
	}
}

// An instance adopted after a crash between its start and the state's save
// (CrashAfterStart) is reported at its address, like one the agent started
// itself, and still counts as mounting its volume. Found by the freebsd
// driver's end-to-end crash points (TestFreeBSDCrashPoints): the adopted
// instance was reported with no address for good, so its Service would
// never send it traffic, and its volume could be deleted under it.
func TestAdoptedInstanceKeepsItsAddressAndVolumes(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "  volumes: [{name: app-data, mountPath: /d}]\n")})
	w.pass()
	inst, _, err := w.rec.Status(context.Background())
	if err != nil || len(inst) != 1 || !inst[0].Address.IsValid() {
		t.Fatalf("status before the crash: %+v, %v", inst, err)
	}
	want := inst[0]
	w.drv.AgentRestart()
	w.dir = t.TempDir() // the state file was never written
	w.newReconciler()
	w.pass()
	w.pass()
	inst, _, err = w.rec.Status(context.Background())
	if err != nil || len(inst) != 1 || inst[0].Address != want.Address || inst[0].State != report.StateRunning || inst[0].SpecHash != want.SpecHash {
		t.Errorf("status after adopting: %+v, %v; want %+v", inst, err, want)
	}
	if err := w.rec.DeleteVolume(context.Background(), "app-data"); !errors.Is(err, nodeexec.ErrBusy) {
		t.Errorf("deleting the adopted instance's volume: %v; want ErrBusy", err)
	}
	if w.drv.Starts("app") != 1 {
		t.Errorf("%d starts, want 1", w.drv.Starts("app"))
	}
}

func TestOneBrokenInstanceDoesNotBlockOthers(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("a", ""), "b.yaml": jail("b", ""), "c.yaml": jail("c", "")})
	w.drv.FailNextStart("b", errors.New("no such image"))
	res := w.pass()
	if res.Created != 2 || res.Errors["b"] == nil {
		t.Fatalf("%+v", res)
	}
	if st := w.rec.Instances()["b"]; st.State != report.StateCrashLoop || !strings.Contains(st.Error, "no such image") {
		t.Fatalf("state of b: %+v", st)
	}
	w.clk.advance(time.Second)
	w.pass()
	if _, ok := w.running()["b"]; !ok {
		t.Fatal("b not retried after its backoff")
	}
}

func TestDeleteVolumeRefusedWhileMounted(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "  volumes: [{name: app-data, mountPath: /d}]\n")})
	w.pass()
	if err := w.rec.DeleteVolume(context.Background(), "app-data"); !errors.Is(err, nodeexec.ErrBusy) {
		t.Fatalf("deleting a mounted volume: %v", err)
	}
	w.set("a.yaml", "")
	w.pass()
	if err := w.rec.DeleteVolume(context.Background(), "app-data"); err != nil {
		t.Fatal(err)
	}
	if err := w.rec.DeleteVolume(context.Background(), "app-data"); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	w := newWorld(t, map[string]string{"a.yaml": jail("app", "")})
	w.pass()
	w.drv.Crash("app", 1)
	w.pass()
	w.clk.advance(time.Second)
	w.pass()
	w.newReconciler() // same state directory
	if st := w.rec.Instances()["app"]; st.Restarts != 1 || st.SpecHash == "" {
		t.Fatalf("state after restart: %+v", st)
	}
}

// Issue 13: the stop of an instance that serves a Service waits until the
// other alive nodes' newest reports show their proxies without it, or a
// node's report is older than the instance's readiness (it may not have
// published since it began to send it connections); at most DrainTimeout.
func TestDrainWaitsForPeersProxies(t *testing.T) {
	web := "apiVersion: keel/v1\nkind: Service\nmetadata: {name: web}\nspec: {replicas: 1, port: 8080, template: {image: base/x, command: [/bin/web], node: n1}}\n"
	w := newWorld(t, map[string]string{"web.yaml": web})
	w.pass()
	addr := w.rec.Instances()["web-0"].Address
	if _, ok := w.running()["web-0"]; !ok || addr == "" {
		t.Fatalf("web-0 does not run: %+v", w.rec.Instances())
	}
	w.n2.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{addr + ":8080"}}}
	w.set("web.yaml", "") // deleted
	res := w.pass()
	if _, ok := w.running()["web-0"]; !ok || !slices.Contains(res.Draining, "web-0") || !slices.Equal(res.DrainWaits, []string{"n2"}) {
		t.Fatalf("stopped while n2's proxy still sends it connections: draining %v, waiting for %v", res.Draining, res.DrainWaits)
	}
	w.clk.advance(time.Second)
	w.n2.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{}}}
	w.pass()
	if _, ok := w.running()["web-0"]; ok {
		t.Fatal("still running once n2's proxy dropped it")
	}

	// n2's newest report is older than web-0's readiness: it may have
	// begun to proxy to it since, so it is waited for.
	w = newWorld(t, map[string]string{"web.yaml": web})
	w.pass()
	w.readySince = w.clk.now()
	w.n2Age = 5 * time.Second
	w.set("web.yaml", "")
	if res := w.pass(); !slices.Contains(res.Draining, "web-0") {
		t.Fatalf("stopped on a report of n2 older than web-0's readiness: draining %v", res.Draining)
	}
	w.n2Age = 0
	w.clk.advance(time.Second)
	w.pass()
	if _, ok := w.running()["web-0"]; ok {
		t.Fatal("still running once n2 reported after web-0's readiness")
	}

	// A node that never drops it holds the stop DrainTimeout at most.
	w = newWorld(t, map[string]string{"web.yaml": web})
	w.pass()
	w.n2.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{w.rec.Instances()["web-0"].Address + ":8080"}}}
	w.set("web.yaml", "")
	w.pass()
	w.clk.advance(nodeexec.DefaultDrainTimeout - time.Second)
	if w.pass(); len(w.running()) == 0 {
		t.Fatal("stopped before the drain timed out")
	}
	w.clk.advance(time.Second)
	w.pass()
	if _, ok := w.running()["web-0"]; ok {
		t.Fatal("still running after the drain timed out")
	}
}
