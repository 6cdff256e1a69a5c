package process

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/drivertest"
	"github.com/keel-dev/keel/render"
)

// logWriter sends the driver's log lines to the test's log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// newDriver returns a driver over a new state directory, and kills every
// instance it runs when the test ends.
func newDriver(t testing.TB, opts Options) *Driver {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logWriter{t}, nil))
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after TempDir's cleanup, so it runs before it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		running, err := d.Running(ctx)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for name := range running {
			if err := d.Stop(ctx, name, 0); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return d
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) nodeexec.Driver { return newDriver(t, Options{}) })
}

func spec(name string, command ...string) nodeexec.InstanceSpec {
	return nodeexec.InstanceSpec{
		Name:     name,
		Node:     "n1",
		Address:  netip.MustParseAddr("127.77.0.9"),
		SpecHash: "hash-1",
		Spec:     render.JailSpec{Image: "base/test", Command: command},
	}
}

// eventually polls cond until it holds: processes cannot be waited on from
// outside, so polling with a deadline is the way.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for interval := time.Millisecond; !cond(); interval = min(2*interval, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(interval)
	}
}

// runToExit starts an instance whose command ends by itself and returns
// its exit.
func runToExit(t *testing.T, d *Driver, s nodeexec.InstanceSpec) nodeexec.Exit {
	t.Helper()
	if _, err := d.Start(t.Context(), s); err != nil {
		t.Fatalf("Start: %v", err)
	}
	eventually(t, s.Name+" exits", func() bool {
		r, err := d.Running(t.Context())
		_, ok := r[s.Name]
		return err == nil && !ok
	})
	e, ok := d.Exited(s.Name)
	if !ok {
		t.Fatalf("no exit recorded for %s", s.Name)
	}
	return e
}

func readRootFile(t *testing.T, d *Driver, name, file string) string {
	t.Helper()
	root, err := d.RootDir(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEnvironmentReachesTheCommand(t *testing.T) {
	d := newDriver(t, Options{})
	path, err := d.EnsureVolume(t.Context(), "data", 0)
	if err != nil {
		t.Fatal(err)
	}
	s := spec("tools", "sh", "-c", "echo $KEEL_INSTANCE $KEEL_VOLUME_DATA > out; pwd > pwd; echo $HOME > home")
	s.Spec.Volumes = []render.Volume{{Name: "data", MountPath: "/data"}}
	s.Volumes = map[string]string{"data": path}
	if e := runToExit(t, d, s); e != (nodeexec.Exit{Code: 0, Known: true, At: e.At}) {
		t.Fatalf("exit %+v", e)
	}
	root, _ := d.RootDir("tools")
	if got, want := readRootFile(t, d, "tools", "out"), "tools "+path+"\n"; got != want {
		t.Errorf("out = %q, want %q", got, want)
	}
	for _, f := range []string{"pwd", "home"} {
		if got := readRootFile(t, d, "tools", f); got != root+"\n" {
			t.Errorf("%s = %q, want the root %q", f, got, root)
		}
	}
}

func TestReplicaVolumeVariable(t *testing.T) {
	s := spec("db-1")
	s.Service = "db"
	s.Spec.Volumes = []render.Volume{{Name: "db-1-pg-data", MountPath: "/var/db"}}
	s.Volumes = map[string]string{"db-1-pg-data": "/state/volumes/db-1-pg-data"}
	env, err := instanceEnv(s, "/root", "/state", "/bin")
	if err != nil {
		t.Fatal(err)
	}
	if got := env["KEEL_VOLUME_PG_DATA"]; got != "/state/volumes/db-1-pg-data" {
		t.Errorf("KEEL_VOLUME_PG_DATA = %q; environment %v", got, env)
	}
}

func TestExpansionReachesTheCommand(t *testing.T) {
	d := newDriver(t, Options{})
	s := spec("web-0", "sh", "-c", "echo $GREETING-${KEEL_INSTANCE}-[$NOPE]-${x:-dflt}-$$0 > out")
	s.Spec.Env = map[string]string{"GREETING": "hi"}
	runToExit(t, d, s)
	// $$0 reached sh as $0, which sh expands to its own name.
	if got := readRootFile(t, d, "web-0", "out"); got != "hi-web-0-[]-dflt-sh\n" {
		t.Errorf("out = %q", got)
	}
}

func TestImageSeedsRootOnce(t *testing.T) {
	state := t.TempDir()
	img := filepath.Join(state, "images", "base", "14.2-web")
	os.MkdirAll(filepath.Join(img, "bin"), 0o755)
	os.MkdirAll(filepath.Join(img, "etc"), 0o755)
	os.WriteFile(filepath.Join(img, "bin", "hello"), []byte("#!/bin/sh\necho \"hello from $1\" > greeting\n"), 0o755)
	os.WriteFile(filepath.Join(img, "etc", "motd"), []byte("welcome\n"), 0o644)
	os.Symlink("motd", filepath.Join(img, "etc", "motd.link"))
	d := newDriver(t, Options{StateDir: state})

	s := spec("web-0", "bin/hello", "${KEEL_INSTANCE}") // relative with a slash: inside root/
	s.Spec.Image = "base/14.2-web"
	if e := runToExit(t, d, s); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	if got := readRootFile(t, d, "web-0", "greeting"); got != "hello from web-0\n" {
		t.Errorf("greeting = %q", got)
	}
	if got := readRootFile(t, d, "web-0", "etc/motd.link"); got != "welcome\n" {
		t.Errorf("etc/motd.link = %q", got)
	}
	// A restart keeps what the instance changed: the image is copied once.
	root, _ := d.RootDir("web-0")
	os.WriteFile(filepath.Join(root, "etc", "motd"), []byte("changed\n"), 0o644)
	runToExit(t, d, s)
	if got := readRootFile(t, d, "web-0", "etc/motd"); got != "changed\n" {
		t.Errorf("etc/motd after a restart = %q, want the instance's change", got)
	}

	// An image the node does not have gives an empty root.
	other := spec("web-1", "sh", "-c", "ls -A > ../listing")
	other.Spec.Image = "base/missing"
	runToExit(t, d, other)
	if b, err := os.ReadFile(filepath.Join(d.instanceDir("web-1"), "listing")); err != nil || len(b) != 0 {
		t.Errorf("root of an instance without an image holds %q, %v", b, err)
	}
	bad := spec("web-2", "true")
	bad.Spec.Image = "base/../../etc"
	if _, err := d.Start(t.Context(), bad); err == nil {
		t.Errorf("Start with image %q succeeded", bad.Spec.Image)
	}
}

func TestStartErrors(t *testing.T) {
	d := newDriver(t, Options{})
	for _, cmd := range [][]string{nil, {"no-such-command-anywhere"}, {"./missing"}, {""}} {
		if _, err := d.Start(t.Context(), spec("web-0", cmd...)); err == nil {
			t.Errorf("Start(%q) succeeded", cmd)
		}
	}
	if r, _ := d.Running(t.Context()); len(r) != 0 {
		t.Errorf("Running = %v after failed starts", r)
	}
}

func TestAdoption(t *testing.T) {
	state := t.TempDir()
	first := newDriver(t, Options{StateDir: state})
	p, err := first.Start(t.Context(), spec("web-0", "sleep", "300"))
	if err != nil {
		t.Fatal(err)
	}

	second := newDriver(t, Options{StateDir: state})
	r, err := second.Running(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got, ok := r["web-0"]
	if !ok || got.PID != p.PID || got.StartTime != p.StartTime || got.SpecHash != p.SpecHash {
		t.Fatalf("the second driver sees %+v (listed: %v), want %+v", got, ok, p)
	}
	if again, err := second.Start(t.Context(), spec("web-0", "sleep", "300")); !errors.Is(err, nodeexec.ErrAlreadyRunning) || again.PID != p.PID {
		t.Errorf("Start on the second driver = %+v, %v; want pid %d, ErrAlreadyRunning", again, err, p.PID)
	}
	if r, _ := newDriver(t, Options{}).Running(t.Context()); len(r) != 0 {
		t.Errorf("a driver over another state directory lists %v", r)
	}

	// Killed behind the drivers' backs: the parent knows how it ended, the
	// adopter does not.
	if err := syscall.Kill(-p.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the adopter sees web-0 gone", func() bool {
		_, ok := second.Exited("web-0")
		return ok
	})
	if e, _ := second.Exited("web-0"); e.Known || e.Code != -1 {
		t.Errorf("adopter's Exited = %+v, want unknown", e)
	}
	if r, _ := second.Running(t.Context()); len(r) != 0 {
		t.Errorf("adopter still lists %v", r)
	}
	if e, ok := first.Exited("web-0"); !ok || !e.Known || e.Code != -1 {
		t.Errorf("parent's Exited = %+v, %v; want known, killed by a signal", e, ok)
	}
}

func TestStopAdopted(t *testing.T) {
	state := t.TempDir()
	first := newDriver(t, Options{StateDir: state})
	// Ignores SIGTERM, so Stop must escalate without being its parent.
	if _, err := first.Start(t.Context(), spec("web-0", "sh", "-c", "trap '' TERM; echo ready; exec sleep 300")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the trap is set", func() bool {
		b, _ := first.Logs("web-0", 100)
		return bytes.Contains(b, []byte("ready"))
	})
	second := newDriver(t, Options{StateDir: state})
	if err := second.Stop(t.Context(), "web-0", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if r, _ := second.Running(t.Context()); len(r) != 0 {
		t.Errorf("still running: %v", r)
	}
	// Each driver records the end as it sees it (the parent when its
	// wait returns): a busy machine may take a moment.
	eventually(t, "the adopter records web-0's end", func() bool { _, ok := second.Exited("web-0"); return ok })
	if e, _ := second.Exited("web-0"); e.Known {
		t.Errorf("adopter's Exited = %+v; want unknown", e)
	}
	eventually(t, "the parent records web-0's end", func() bool { _, ok := first.Exited("web-0"); return ok })
	if e, _ := first.Exited("web-0"); !e.Known || e.Code != -1 {
		t.Errorf("parent's Exited = %+v; want killed by a signal", e)
	}
}

func TestLeaderExitKillsItsGroup(t *testing.T) {
	d := newDriver(t, Options{})
	// The leader leaves a child behind that ignores SIGTERM, and exits.
	s := spec("web-0", "sh", "-c", "(trap '' TERM; exec sleep 300) & echo $$! > pid")
	if e := runToExit(t, d, s); e.Code != 0 || !e.Known {
		t.Fatalf("exit %+v", e)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(readRootFile(t, d, "web-0", "pid")))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the leftover is killed", func() bool {
		st, err := readStat(pid)
		return err != nil || !st.alive()
	})
}

func TestStopEndsDetachedProcesses(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1)")
	}
	d := newDriver(t, Options{})
	// A daemon that leaves the instance's process group, as a
	// double-forking server would, and keeps the instance's environment.
	s := spec("web-0", "sh", "-c", "setsid sh -c 'echo $$$$ > daemon; exec sleep 300' & exec sleep 300")
	p, err := d.Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := d.RootDir("web-0")
	var daemon int
	eventually(t, "the daemon says its pid", func() bool {
		b, err := os.ReadFile(filepath.Join(root, "daemon"))
		daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && daemon > 0
	})
	if r, _ := d.Running(t.Context()); r["web-0"] != p {
		t.Errorf("Running lists %+v, want the process it started, %+v", r["web-0"], p)
	}
	if err := d.Stop(t.Context(), "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := readStat(daemon); err == nil && st.alive() {
		t.Errorf("the detached daemon %d survived Stop", daemon)
	}
	if r, _ := d.Running(t.Context()); len(r) != 0 {
		t.Errorf("Running = %v after Stop", r)
	}
}

func TestLogsAndCap(t *testing.T) {
	const limit = 8 << 10
	d := newDriver(t, Options{LogMax: limit})
	s := spec("chatty", "sh", "-c", `echo to-stderr >&2
i=0; while [ $$i -lt 2000 ]; do echo "line $$i"; i=$$((i+1)); done
echo done; while :; do echo tick; sleep 0.01; done`)
	if _, err := d.Start(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(d.instanceDir("chatty"), "stdout.log")
	eventually(t, "the command wrote its lines", func() bool {
		b, _ := os.ReadFile(logPath)
		return bytes.Contains(b, []byte("done\ntick\n"))
	})
	b, err := d.Logs("chatty", 1<<20)
	if err != nil || !bytes.HasPrefix(b, []byte("==> stdout <==\nline 0\n")) || !bytes.HasSuffix(b, []byte("==> stderr <==\nto-stderr\n")) {
		t.Errorf("Logs before the cap = %.100q...%q, %v", b, b[max(0, len(b)-100):], err)
	}

	if _, err := d.Running(t.Context()); err != nil { // caps the logs
		t.Fatal(err)
	}
	capped, _ := os.ReadFile(logPath)
	if len(capped) > limit || bytes.Contains(capped, []byte("line 0\n")) || !bytes.HasSuffix(capped, []byte("tick\n")) {
		t.Errorf("after the cap the log has %d bytes (limit %d), starting %.40q", len(capped), limit, capped)
	}
	if !bytes.HasPrefix(capped, []byte("line ")) && !bytes.HasPrefix(capped, []byte("done\n")) && !bytes.HasPrefix(capped, []byte("tick\n")) {
		t.Errorf("the capped log starts mid-line: %.40q", capped)
	}
	// The instance keeps appending at the new end: no hole of NULs where
	// the old end was.
	eventually(t, "the instance writes after the cap", func() bool {
		b, _ := os.ReadFile(logPath)
		return len(b) > len(capped)+50
	})
	if after, _ := os.ReadFile(logPath); bytes.IndexByte(after, 0) >= 0 || len(after) > limit {
		t.Errorf("after more output the log has %d bytes, NUL at %d", len(after), bytes.IndexByte(after, 0))
	}
}

func TestRunningReadsEachEnvironOnce(t *testing.T) {
	d := newDriver(t, Options{})
	for _, name := range []string{"a", "b", "c"} {
		if _, err := d.Start(t.Context(), spec(name, "sleep", "300")); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := d.Running(t.Context()); err != nil || len(r) != 3 {
		t.Fatalf("Running = %v, %v", r, err)
	}
	// Processes that other tests start meanwhile are read once each: on a
	// busy machine, one of a few passes must read (almost) nothing again.
	var n int64
	for range 5 {
		before := d.environReads.Load()
		if r, err := d.Running(t.Context()); err != nil || len(r) != 3 {
			t.Fatalf("Running = %v, %v", r, err)
		}
		if n = d.environReads.Load() - before; n <= 1 {
			break
		}
	}
	if n > 1 {
		t.Errorf("every later Running read %d or more environments again", n)
	}
}

func TestNetworkIsLoopbackOnly(t *testing.T) {
	d := newDriver(t, Options{})
	ctx := t.Context()
	vips := []netip.Addr{netip.MustParseAddr("127.201.0.7")}
	if err := d.SetVIPs(ctx, vips); err != nil || len(d.VIPs()) != 1 || d.VIPs()[0] != vips[0] {
		t.Errorf("SetVIPs = %v, VIPs = %v", err, d.VIPs())
	}
	err := d.SetVIPs(ctx, []netip.Addr{netip.MustParseAddr("10.201.0.7")})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.0/8") {
		t.Errorf("SetVIPs(10.201.0.7) = %v, want an error naming 127.0.0.0/8", err)
	}
	if len(d.VIPs()) != 1 {
		t.Errorf("a refused SetVIPs changed the VIPs to %v", d.VIPs())
	}
	if err := d.SetVIPs(ctx, []netip.Addr{netip.MustParseAddr("::1")}); err == nil {
		t.Errorf("SetVIPs(::1) succeeded")
	}
	routes := []nodeexec.Route{{Dest: netip.MustParsePrefix("127.200.3.0/24"), Via: netip.MustParseAddr("127.0.0.1")}}
	if err := d.SetRoutes(ctx, routes); err != nil || len(d.Routes()) != 1 {
		t.Errorf("SetRoutes = %v, Routes = %v", err, d.Routes())
	}
	for _, dest := range []string{"10.200.3.0/24", "0.0.0.0/0"} {
		if err := d.SetRoutes(ctx, []nodeexec.Route{{Dest: netip.MustParsePrefix(dest), Via: netip.MustParseAddr("127.0.0.1")}}); err == nil {
			t.Errorf("SetRoutes(%s) succeeded", dest)
		}
	}
}

func TestCapacity(t *testing.T) {
	c, err := newDriver(t, Options{}).Capacity(t.Context())
	if err != nil || c.CPU != render.CPU(runtime.NumCPU()*1000) || c.Memory < 64<<20 {
		t.Errorf("Capacity = %+v, %v", c, err)
	}
	override := render.Resources{CPU: 2500, Memory: 3 << 30}
	if c, err := newDriver(t, Options{Capacity: &override}).Capacity(t.Context()); err != nil || c != override {
		t.Errorf("Capacity with an override = %+v, %v", c, err)
	}
}

func TestVolumesAreDirectories(t *testing.T) {
	state := t.TempDir()
	d := newDriver(t, Options{StateDir: state})
	path, err := d.EnsureVolume(t.Context(), "data", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || path != filepath.Join(state, "volumes", "data") {
		t.Errorf("volume %s: %v, %v", path, fi, err)
	}
	os.WriteFile(filepath.Join(path, "f"), []byte("x"), 0o600)
	// A deletion interrupted by a crash is finished by the next driver.
	os.Mkdir(filepath.Join(state, "volumes", deletingPrefix+"old-1"), 0o700)
	d2 := newDriver(t, Options{StateDir: state})
	if vols, _ := d2.Volumes(t.Context()); len(vols) != 1 || vols[0] != "data" {
		t.Errorf("Volumes = %v", vols)
	}
	if _, err := os.Stat(filepath.Join(state, "volumes", deletingPrefix+"old-1")); !os.IsNotExist(err) {
		t.Errorf("the interrupted deletion is still there")
	}
}

func TestStateDirRequired(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Errorf("New without a state directory succeeded")
	}
}

// The helper agent of TestInstancesSurviveAgentDeath: a test binary run
// with keelHelperAgent set starts an instance, says its PID and waits to be
// killed.
const keelHelperAgent = "KEEL_PROCESS_TEST_HELPER_AGENT"

func TestHelperAgent(t *testing.T) {
	state := os.Getenv(keelHelperAgent)
	if state == "" {
		t.Skip("only run as the helper agent of TestInstancesSurviveAgentDeath")
	}
	d, err := New(Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.Start(context.Background(), spec("ticker", "sh", "-c", "while :; do echo tick; sleep 0.01; done"))
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("started " + strconv.Itoa(p.PID) + "\n")
	select {} // until killed
}

func TestInstancesSurviveAgentDeath(t *testing.T) {
	state := t.TempDir()
	agent := exec.Command(os.Args[0], "-test.run=^TestHelperAgent$")
	agent.Env = append(os.Environ(), keelHelperAgent+"="+state)
	out, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Kill()
		agent.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, convErr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "started "))
	if err != nil || convErr != nil {
		t.Fatalf("helper agent said %q: %v", line, err)
	}
	// Watch the instance's pid before anything else: newDriver's cleanup
	// kills it however the test ends.
	d := newDriver(t, Options{StateDir: state})

	// The agent dies at once, as in a crash: no shutdown code runs.
	agent.Process.Kill()
	agent.Wait()

	r, err := d.Running(t.Context())
	if err != nil || r["ticker"].PID != pid {
		t.Fatalf("after the agent died, Running = %v, %v; want ticker with pid %d", r, err, pid)
	}
	logPath := filepath.Join(state, "instances", "ticker", "stdout.log")
	fi, err := os.Stat(logPath)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the orphaned instance keeps writing its log", func() bool {
		now, err := os.Stat(logPath)
		return err == nil && now.Size() > fi.Size()+20
	})
	if st, err := readStat(pid); err != nil || !st.alive() || st.PGID != pid {
		t.Errorf("instance stat = %+v, %v", st, err)
	}
}

// BenchmarkRunning measures a reconcile pass's view of a node running 100
// instances.
func BenchmarkRunning(b *testing.B) {
	d := newDriver(b, Options{})
	ctx := context.Background()
	began := time.Now()
	for i := range 100 {
		if _, err := d.Start(ctx, spec("web-"+strconv.Itoa(i), "sleep", "300")); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("100 starts took %v", time.Since(began))
	for b.Loop() {
		if r, err := d.Running(ctx); err != nil || len(r) != 100 {
			b.Fatalf("Running = %d instances, %v", len(r), err)
		}
	}
}

// TestScanRereadsAnEmptyEnviron: a process in the middle of execve shows
// an empty environment for a moment. An agent whose scan caught an
// instance then still adopts it (the scan reads it again a little later),
// and one that never saw it filled in does not remember it as a stranger.
func TestScanRereadsAnEmptyEnviron(t *testing.T) {
	state := t.TempDir()
	first := newDriver(t, Options{StateDir: state})
	p, err := first.Start(t.Context(), spec("web-0", "sleep", "300"))
	if err != nil {
		t.Fatal(err)
	}
	// emptyFor makes the web-0 leader's environment read empty n times.
	emptyFor := func(d *Driver, n int) {
		read := d.readEnviron
		var mu sync.Mutex
		d.readEnviron = func(pid int) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			if pid == p.PID && n > 0 {
				n--
				return nil, nil
			}
			return read(pid)
		}
	}

	second := newDriver(t, Options{StateDir: state})
	emptyFor(second, 2)
	if r, err := second.Running(t.Context()); err != nil || r["web-0"].PID != p.PID {
		t.Fatalf("Running after two empty reads = %v, %v; want web-0 (pid %d)", r, err, p.PID)
	}

	// Empty at the scan's first read and at each of its re-reads (1, 2, 4
	// and 8 ms later): not found this time, found at the next scan.
	third := newDriver(t, Options{StateDir: state})
	emptyFor(third, 5)
	if r, err := third.Running(t.Context()); err != nil || len(r) != 0 {
		t.Fatalf("Running while the environment reads empty = %v, %v; want nothing", r, err)
	}
	if r, err := third.Running(t.Context()); err != nil || r["web-0"].PID != p.PID {
		t.Fatalf("Running once the environment reads = %v, %v; want web-0 (pid %d)", r, err, p.PID)
	}
}
