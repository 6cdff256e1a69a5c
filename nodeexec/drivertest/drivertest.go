// Package drivertest is the conformance suite of nodeexec.Driver: the
// behaviour the reconciler relies on, checked the same way against every
// driver, real or fake. It is imported from tests only and must not be
// imported by the agent itself.
package drivertest

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// EnvReporter is implemented by drivers that can show the environment they
// computed for an instance's last Start, as NAME=value pairs.
type EnvReporter interface {
	Env(name string) []string
}

// Simulator is implemented by drivers that run no real commands (the fake).
// Where a command would act by itself, the suite asks the driver to act as
// if it had.
type Simulator interface {
	// Crash makes the running instance exit with code.
	Crash(name string, code int) error
	// IgnoreTerm makes the running instance ignore SIGTERM.
	IgnoreTerm(name string) error
}

// The commands the suite runs, for drivers that run them: POSIX sh and
// sleep(1), found in PATH.
var (
	cmdSleep      = []string{"sleep", "300"}
	cmdExit3      = []string{"sh", "-c", "exit 3"}
	cmdIgnoreTerm = []string{"sh", "-c", "trap '' TERM; echo ready; exec sleep 300"}
	// cmdEnv is the command of the brief: a driver that runs it leaves the
	// two values in root/out.
	cmdEnv = []string{"sh", "-c", "echo $KEEL_INSTANCE $KEEL_VOLUME_DATA > out"}
)

// Run runs the suite. newDriver returns a new, empty driver for one subtest;
// it registers with t.Cleanup whatever removes the driver's state, and
// should also stop anything the subtest left running (the suite stops
// what it starts, but a failed test may not get that far). Subtests run in
// parallel, each with its own driver.
func Run(t *testing.T, newDriver func(t *testing.T) nodeexec.Driver) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, d nodeexec.Driver)
	}{
		{"StartListsInstanceWithSpecHash", testStartRunning},
		{"StartIsNeverDuplicated", testStartTwice},
		{"ConcurrentInstances", testConcurrentInstances},
		{"StopGivesKnownExit", testStop},
		{"ExitCodeIsReported", testExitCode},
		{"StopKillsAfterGrace", testStopIgnoringTerm},
		{"RestartAfterExit", testRestart},
		{"UnknownInstance", testUnknown},
		{"Volumes", testVolumes},
		{"DestroyRefusesWhileRunning", testDestroy},
		{"Environment", testEnv},
		{"NamesThatCouldEscapeAreRefused", testBadNames},
		{"Network", testNetwork},
		{"CapacityAndApply", testCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, newDriver(t))
		})
	}
}

// spec returns an instance spec running command.
func spec(name string, command ...string) nodeexec.InstanceSpec {
	return nodeexec.InstanceSpec{
		Name:     name,
		Node:     "n1",
		Address:  netip.MustParseAddr("127.77.0.2"),
		SpecHash: "hash-" + name,
		Spec: render.JailSpec{
			Image:         "base/test",
			Command:       command,
			Resources:     render.Resources{CPU: render.DefaultCPU, Memory: render.DefaultMemory},
			RestartPolicy: render.DefaultRestartPolicy,
		},
	}
}

// start starts the instance and stops it when the test ends.
func start(t *testing.T, d nodeexec.Driver, s nodeexec.InstanceSpec) nodeexec.Process {
	t.Helper()
	p, err := d.Start(t.Context(), s)
	if err != nil {
		t.Fatalf("Start(%s): %v", s.Name, err)
	}
	stopAtEnd(t, d, s.Name)
	return p
}

func stopAtEnd(t *testing.T, d nodeexec.Driver, name string) {
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Stop(ctx, name, 0); err != nil {
			t.Errorf("cleanup: Stop(%s): %v", name, err)
		}
	})
}

// exitBy makes an instance whose command exits by itself with code do so
// on a driver that runs no commands.
func exitBy(t *testing.T, d nodeexec.Driver, name string, code int) {
	t.Helper()
	if sim, ok := d.(Simulator); ok {
		if err := sim.Crash(name, code); err != nil {
			t.Fatal(err)
		}
	}
}

func running(t *testing.T, d nodeexec.Driver) map[string]nodeexec.Process {
	t.Helper()
	r, err := d.Running(t.Context())
	if err != nil {
		t.Fatalf("Running: %v", err)
	}
	return r
}

// eventually polls cond until it holds, failing the test after a while.
// Process exits cannot be waited on through the interface; polling is it.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for interval := time.Millisecond; !cond(); interval = min(2*interval, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		select {
		case <-time.After(interval):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

func waitGone(t *testing.T, d nodeexec.Driver, name string) {
	t.Helper()
	eventually(t, name+" no longer runs", func() bool {
		_, ok := running(t, d)[name]
		return !ok
	})
}

func exited(t *testing.T, d nodeexec.Driver, name string) nodeexec.Exit {
	t.Helper()
	e, ok := d.Exited(name)
	if !ok {
		t.Fatalf("Exited(%s): no exit recorded", name)
	}
	if e.At.IsZero() {
		t.Errorf("Exited(%s).At is zero", name)
	}
	return e
}

func testStartRunning(t *testing.T, d nodeexec.Driver) {
	p := start(t, d, spec("web-0", cmdSleep...))
	if p.PID <= 0 || p.SpecHash != "hash-web-0" || p.Started.IsZero() {
		t.Fatalf("Start returned %+v, want a PID, the spec hash and a start time", p)
	}
	got, ok := running(t, d)["web-0"]
	if !ok {
		t.Fatalf("Running does not list web-0")
	}
	if got != p {
		t.Errorf("Running lists %+v, Start returned %+v", got, p)
	}
	if _, ok := d.Exited("web-0"); ok {
		t.Errorf("Exited(web-0) reports an exit for a running instance")
	}
}

func testStartTwice(t *testing.T, d nodeexec.Driver) {
	s := spec("web-0", cmdSleep...)
	stopAtEnd(t, d, s.Name)
	const n = 4
	var wg gosync.WaitGroup
	procs := make([]nodeexec.Process, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { procs[i], errs[i] = d.Start(t.Context(), s) })
	}
	wg.Wait()
	started := 0
	for i, err := range errs {
		switch {
		case err == nil:
			started++
		case !errors.Is(err, nodeexec.ErrAlreadyRunning):
			t.Fatalf("concurrent Start %d: %v, want nil or ErrAlreadyRunning", i, err)
		}
		if procs[i] != procs[0] {
			t.Errorf("Start %d returned %+v, Start 0 returned %+v: two processes", i, procs[i], procs[0])
		}
	}
	if started != 1 {
		t.Fatalf("%d of %d concurrent Starts started the instance, want exactly 1", started, n)
	}
	p, err := d.Start(t.Context(), s)
	if !errors.Is(err, nodeexec.ErrAlreadyRunning) || p != procs[0] {
		t.Errorf("Start again = %+v, %v; want %+v, ErrAlreadyRunning", p, err, procs[0])
	}
	if got := running(t, d)["web-0"]; got != procs[0] {
		t.Errorf("Running lists %+v, want %+v", got, procs[0])
	}
}

// testConcurrentInstances runs the operations of several instances at once,
// as the reconciler's workers do, while Running is called over and over,
// as its passes do: each instance is started once, with the process Start
// returned, none is taken for an adopted one (its exit stays known), and
// two instances share a volume created by both at once.
func testConcurrentInstances(t *testing.T, d nodeexec.Driver) {
	const n = 6
	names := make([]string, n)
	for i := range names {
		names[i] = "web-" + string(rune('0'+i))
		stopAtEnd(t, d, names[i])
	}
	var listed gosync.WaitGroup
	stop := make(chan struct{})
	listErr := make(chan error, 1)
	listed.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := d.Running(t.Context()); err != nil {
				listErr <- err
				return
			}
		}
	})
	each := func(op func(i int) error) {
		t.Helper()
		var wg gosync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = op(i) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s: %v", names[i], err)
			}
		}
	}

	procs := make([]nodeexec.Process, n)
	each(func(i int) error {
		s := spec(names[i], cmdSleep...)
		path, err := d.EnsureVolume(t.Context(), "shared", 0)
		if err != nil {
			return err
		}
		s.Spec.Volumes = []render.Volume{{Name: "shared", MountPath: "/shared"}}
		s.Volumes = map[string]string{"shared": path}
		procs[i], err = d.Start(t.Context(), s)
		return err
	})
	got := running(t, d)
	for i, name := range names {
		if got[name] != procs[i] {
			t.Errorf("Running lists %s as %+v, Start returned %+v", name, got[name], procs[i])
		}
	}
	if vols, err := d.Volumes(t.Context()); err != nil || !slices.Equal(vols, []string{"shared"}) {
		t.Errorf("Volumes = %q, %v; want [shared]", vols, err)
	}

	each(func(i int) error {
		if err := d.Stop(t.Context(), names[i], 10*time.Second); err != nil {
			return err
		}
		return d.Destroy(t.Context(), names[i])
	})
	close(stop)
	listed.Wait()
	select {
	case err := <-listErr:
		t.Fatalf("Running: %v", err)
	default:
	}
	if got := running(t, d); len(got) != 0 {
		t.Errorf("still running after Stop: %v", got)
	}
	for _, name := range names {
		if e := exited(t, d, name); !e.Known {
			t.Errorf("Exited(%s) = %+v: the driver took its own child for an adopted process", name, e)
		}
	}
}

func testStop(t *testing.T, d nodeexec.Driver) {
	start(t, d, spec("web-0", cmdSleep...))
	if err := d.Stop(t.Context(), "web-0", 10*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, ok := running(t, d)["web-0"]; ok {
		t.Fatalf("web-0 still runs after Stop returned")
	}
	// sleep(1) does not catch SIGTERM, so it dies of it.
	if e := exited(t, d, "web-0"); !e.Known || e.Code != -1 {
		t.Errorf("Exited = %+v, want a known exit by a signal (code -1)", e)
	}
	if err := d.Stop(t.Context(), "web-0", time.Second); err != nil {
		t.Errorf("Stop of a stopped instance: %v, want nil", err)
	}
}

func testExitCode(t *testing.T, d nodeexec.Driver) {
	start(t, d, spec("job", cmdExit3...))
	exitBy(t, d, "job", 3)
	waitGone(t, d, "job")
	e := exited(t, d, "job")
	if !e.Known || e.Code != 3 || !e.Failed() {
		t.Errorf("Exited = %+v, want a known exit with code 3", e)
	}
}

func testStopIgnoringTerm(t *testing.T, d nodeexec.Driver) {
	start(t, d, spec("stubborn", cmdIgnoreTerm...))
	sim, isSim := d.(Simulator)
	if isSim {
		if err := sim.IgnoreTerm("stubborn"); err != nil {
			t.Fatal(err)
		}
	} else {
		// The trap must be set before SIGTERM comes.
		eventually(t, "the command says it is ready", func() bool {
			b, err := d.Logs("stubborn", 4096)
			return err == nil && bytes.Contains(b, []byte("ready"))
		})
	}
	const grace = 200 * time.Millisecond
	began := time.Now()
	if err := d.Stop(t.Context(), "stubborn", grace); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if took := time.Since(began); !isSim && took < grace {
		t.Errorf("Stop returned after %v, before the grace of %v, though the command ignores SIGTERM", took, grace)
	}
	if _, ok := running(t, d)["stubborn"]; ok {
		t.Fatalf("stubborn still runs after Stop returned")
	}
	if e := exited(t, d, "stubborn"); !e.Known || e.Code != -1 {
		t.Errorf("Exited = %+v, want a known exit by a signal (code -1)", e)
	}
}

func testRestart(t *testing.T, d nodeexec.Driver) {
	first := start(t, d, spec("job", cmdExit3...))
	exitBy(t, d, "job", 3)
	waitGone(t, d, "job")
	second, err := d.Start(t.Context(), spec("job", cmdSleep...))
	if err != nil {
		t.Fatalf("Start after the exit: %v", err)
	}
	if second.PID == first.PID && second.StartTime == first.StartTime {
		t.Errorf("the new process has the identity of the old one: %+v", second)
	}
	if got := running(t, d)["job"]; got != second {
		t.Errorf("Running lists %+v, want %+v", got, second)
	}
}

func testUnknown(t *testing.T, d nodeexec.Driver) {
	if e, ok := d.Exited("nope"); ok {
		t.Errorf("Exited(nope) = %+v, want none", e)
	}
	if err := d.Stop(t.Context(), "nope", time.Second); err != nil {
		t.Errorf("Stop(nope): %v, want nil", err)
	}
	if err := d.Destroy(t.Context(), "nope"); err != nil {
		t.Errorf("Destroy(nope): %v, want nil", err)
	}
	if _, err := d.Logs("nope", 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Logs(nope): %v, want ErrNotFound", err)
	}
	if len(running(t, d)) != 0 {
		t.Errorf("a new driver lists running instances")
	}
}

func testVolumes(t *testing.T, d nodeexec.Driver) {
	ctx := t.Context()
	path, err := d.EnsureVolume(ctx, "db-0-data", 1<<30)
	if err != nil || path == "" {
		t.Fatalf("EnsureVolume = %q, %v", path, err)
	}
	if again, err := d.EnsureVolume(ctx, "db-0-data", 1<<30); err != nil || again != path {
		t.Errorf("EnsureVolume again = %q, %v; want %q", again, err, path)
	}
	if _, err := d.EnsureVolume(ctx, "other", 0); err != nil {
		t.Fatal(err)
	}
	if vols, err := d.Volumes(ctx); err != nil || !slices.Equal(vols, []string{"db-0-data", "other"}) {
		t.Errorf("Volumes = %q, %v; want [db-0-data other]", vols, err)
	}
	if err := d.DeleteVolume(ctx, "missing"); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("DeleteVolume(missing): %v, want ErrNotFound", err)
	}

	s := spec("db-0", cmdSleep...)
	s.Service = "db"
	s.Spec.Volumes = []render.Volume{{Name: "db-0-data", MountPath: "/var/db"}}
	s.Volumes = map[string]string{"db-0-data": path}
	start(t, d, s)
	if err := d.DeleteVolume(ctx, "db-0-data"); !errors.Is(err, nodeexec.ErrBusy) {
		t.Errorf("DeleteVolume while db-0 runs with it: %v, want ErrBusy", err)
	}
	if err := d.DeleteVolume(ctx, "other"); err != nil {
		t.Errorf("DeleteVolume(other), which no instance uses: %v", err)
	}
	if err := d.Stop(ctx, "db-0", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx, "db-0"); err != nil {
		t.Fatal(err)
	}
	if vols, err := d.Volumes(ctx); err != nil || !slices.Equal(vols, []string{"db-0-data"}) {
		t.Errorf("Volumes after Destroy of its instance = %q, %v; want [db-0-data]: volumes outlive instances", vols, err)
	}
	if err := d.DeleteVolume(ctx, "db-0-data"); err != nil {
		t.Errorf("DeleteVolume once stopped: %v", err)
	}
	if vols, err := d.Volumes(ctx); err != nil || len(vols) != 0 {
		t.Errorf("Volumes after deleting all = %q, %v", vols, err)
	}
	if err := d.DeleteVolume(ctx, "db-0-data"); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("DeleteVolume twice: %v, want ErrNotFound", err)
	}

	// A volume must exist before an instance starts with it.
	gone := spec("db-1", cmdSleep...)
	gone.Spec.Volumes = []render.Volume{{Name: "db-1-data", MountPath: "/var/db"}}
	gone.Volumes = map[string]string{"db-1-data": path}
	stopAtEnd(t, d, gone.Name)
	if _, err := d.Start(ctx, gone); err == nil {
		t.Errorf("Start with a deleted volume succeeded")
	}
	unmapped := spec("db-2", cmdSleep...)
	unmapped.Spec.Volumes = []render.Volume{{Name: "db-2-data", MountPath: "/var/db"}}
	stopAtEnd(t, d, unmapped.Name)
	if _, err := d.Start(ctx, unmapped); err == nil {
		t.Errorf("Start with a volume that has no host path succeeded")
	}
}

func testDestroy(t *testing.T, d nodeexec.Driver) {
	ctx := t.Context()
	start(t, d, spec("web-0", cmdSleep...))
	if err := d.Destroy(ctx, "web-0"); !errors.Is(err, nodeexec.ErrBusy) {
		t.Fatalf("Destroy while running: %v, want ErrBusy", err)
	}
	if _, ok := running(t, d)["web-0"]; !ok {
		t.Fatalf("web-0 stopped running after a refused Destroy")
	}
	if _, err := d.Logs("web-0", 100); err != nil {
		t.Errorf("Logs of a running instance: %v", err)
	}
	if err := d.Stop(ctx, "web-0", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx, "web-0"); err != nil {
		t.Fatalf("Destroy once stopped: %v", err)
	}
	if _, err := d.Logs("web-0", 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Logs after Destroy: %v, want ErrNotFound", err)
	}
	if err := d.Destroy(ctx, "web-0"); err != nil {
		t.Errorf("Destroy twice: %v, want nil", err)
	}
}

func testEnv(t *testing.T, d nodeexec.Driver) {
	er, ok := d.(EnvReporter)
	if !ok {
		t.Skipf("%s driver does not report environments", d.Name())
	}
	path, err := d.EnsureVolume(t.Context(), "data", 0)
	if err != nil {
		t.Fatal(err)
	}
	s := spec("tools", cmdEnv...)
	s.Spec.Env = map[string]string{"GREETING": "hello", "KEEL_INSTANCE": "spoofed"}
	s.Spec.Volumes = []render.Volume{{Name: "data", MountPath: "/data"}}
	s.Volumes = map[string]string{"data": path}
	start(t, d, s)
	exitBy(t, d, "tools", 0)

	env := er.Env("tools")
	for _, want := range []string{
		"KEEL_INSTANCE=tools",
		"KEEL_NODE=n1",
		"KEEL_ADDRESS=127.77.0.2",
		"KEEL_SERVICE=",
		"KEEL_VOLUME_DATA=" + path,
		"KEEL_SPEC_HASH=hash-tools",
		"GREETING=hello",
	} {
		if !slices.Contains(env, want) {
			t.Errorf("environment lacks %s; it is:\n%s", want, strings.Join(env, "\n"))
		}
	}
	roots := 0
	for _, kv := range env {
		if strings.HasPrefix(kv, "KEEL_DRIVER_ROOT=") {
			roots++
		}
		if kv == "KEEL_INSTANCE=spoofed" {
			t.Errorf("the spec's env overrode KEEL_INSTANCE")
		}
	}
	if roots != 1 {
		t.Errorf("environment has %d KEEL_DRIVER_ROOT, want 1", roots)
	}
	if !slices.IsSorted(env) {
		t.Errorf("environment is not sorted")
	}
}

func testBadNames(t *testing.T, d nodeexec.Driver) {
	ctx := t.Context()
	for _, name := range []string{"", ".", "..", "../x", "a/b", "/etc", ".hidden", "Upper", "a\x00b", strings.Repeat("a", 64)} {
		if _, err := d.Start(ctx, spec(name, cmdSleep...)); err == nil {
			stopAtEnd(t, d, name)
			t.Errorf("Start(%q) succeeded", name)
		}
		if err := d.Stop(ctx, name, 0); err == nil {
			t.Errorf("Stop(%q) succeeded", name)
		}
		if err := d.Destroy(ctx, name); err == nil {
			t.Errorf("Destroy(%q) succeeded", name)
		}
		if _, err := d.Logs(name, 10); err == nil {
			t.Errorf("Logs(%q) succeeded", name)
		}
		if _, err := d.EnsureVolume(ctx, name, 0); err == nil {
			t.Errorf("EnsureVolume(%q) succeeded", name)
		}
		if err := d.DeleteVolume(ctx, name); err == nil {
			t.Errorf("DeleteVolume(%q) succeeded", name)
		}
	}
	if vols, err := d.Volumes(ctx); err != nil || len(vols) != 0 {
		t.Errorf("Volumes = %q, %v after refused names", vols, err)
	}
}

func testNetwork(t *testing.T, d nodeexec.Driver) {
	ctx := t.Context()
	vips := []netip.Addr{netip.MustParseAddr("127.78.0.1"), netip.MustParseAddr("127.78.0.2")}
	if err := d.SetVIPs(ctx, vips); err != nil {
		t.Errorf("SetVIPs(loopback): %v", err)
	}
	if err := d.SetVIPs(ctx, nil); err != nil {
		t.Errorf("SetVIPs(none): %v", err)
	}
	if err := d.SetVIPs(ctx, []netip.Addr{{}}); err == nil {
		t.Errorf("SetVIPs accepted the zero address")
	}
	routes := []nodeexec.Route{{Dest: netip.MustParsePrefix("127.77.12.0/24"), Via: netip.MustParseAddr("127.0.0.1")}}
	if err := d.SetRoutes(ctx, routes); err != nil {
		t.Errorf("SetRoutes(loopback): %v", err)
	}
	if err := d.SetRoutes(ctx, []nodeexec.Route{{Dest: netip.MustParsePrefix("127.77.12.0/24")}}); err == nil {
		t.Errorf("SetRoutes accepted a route without a gateway")
	}
}

func testCapacity(t *testing.T, d nodeexec.Driver) {
	c, err := d.Capacity(t.Context())
	if err != nil || c.CPU <= 0 || c.Memory <= 0 {
		t.Errorf("Capacity = %+v, %v; want some CPU and memory", c, err)
	}
	if d.Name() == "" {
		t.Errorf("Name is empty")
	}
	start(t, d, spec("web-0", cmdSleep...))
	if err := d.Apply(t.Context(), "web-0", render.Resources{CPU: 500, Memory: 64 << 20}); err != nil {
		t.Errorf("Apply: %v", err)
	}
}
