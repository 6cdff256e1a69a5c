package freebsd_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/proctest"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
)

// checkDriver is a driver on h whose Runner is the simulator itself (the
// recorder is no CheckRunner).
func checkDriver(t *testing.T, h *host, state string) *freebsd.Driver {
	t.Helper()
	d, err := freebsd.New(t.Context(), freebsd.Options{Runner: h.sim, Root: h.root, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestExecInJail(t *testing.T) {
	h := newHost(t, fbsdsim.Options{StopTimeout: time.Second})
	d := checkDriver(t, h, t.TempDir())
	ctx := t.Context()
	spec := simpleSpec("web-0", "10.0.60.5")
	spec.Spec.Env = map[string]string{"GREETING": "hello"}
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), "web-0", time.Second) })
	jailRoot := filepath.Join(h.root, "zroot/keel/jails/web-0")
	tests := []struct {
		name   string
		argv   []string
		code   int
		output string
	}{
		// Never the agent's environment: HOME is not the test's.
		{"the workload's environment, in the jail's root", []string{"sh", "-c", `echo "$GREETING" "$KEEL_INSTANCE" "$HOME" "${GOPATH:-none}"; pwd`},
			0, "hello web-0 /root none\n" + jailRoot + "\n"},
		{"argv expanded", []string{"echo", "$KEEL_ADDRESS"}, 0, "10.0.60.5\n"},
		{"a failing check", []string{"sh", "-c", "echo down; exit 3"}, 3, "down\n"},
		{"output bounded", []string{"sh", "-c", "head -c 100000 /dev/zero; exit 1"}, 1, strings.Repeat("\x00", 100)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, err := d.Exec(ctx, "web-0", tt.argv, 100)
			if err != nil || code != tt.code || string(out) != tt.output {
				t.Errorf("Exec = %d, %q, %v; want %d, %q", code, out, err, tt.code, tt.output)
			}
		})
	}
	// env(1) inside the jail finds no such program: an error, not a
	// failing check.
	if code, _, err := d.Exec(ctx, "web-0", []string{"no-such-program"}, 100); err == nil || errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec of a missing program = %d, %v; want an error other than not found", code, err)
	}
	if _, _, err := d.Exec(ctx, "db-0", []string{"true"}, 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in an instance never started: %v; want ErrNotFound", err)
	}
	// A jail that lost its /usr/bin/env: jexec's execvp fails.
	if err := os.Remove(filepath.Join(jailRoot, "usr/bin/env")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Exec(ctx, "web-0", []string{"true"}, 100); err == nil || !strings.Contains(err.Error(), "jexec: execvp: /usr/bin/env") {
		t.Errorf("Exec in a jail without env(1): %v", err)
	}

	if err := d.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Exec(ctx, "web-0", []string{"true"}, 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in a stopped instance: %v; want ErrNotFound", err)
	}
}

// A check that hangs is killed, with what it started, when its context
// ends, and Exec returns promptly.
func TestExecInJailTimeout(t *testing.T) {
	h := newHost(t, fbsdsim.Options{StopTimeout: time.Second})
	d := checkDriver(t, h, t.TempDir())
	if _, err := d.Start(t.Context(), simpleSpec("web-0", "10.0.60.5")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), "web-0", time.Second) })
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := d.Exec(ctx, "web-0", []string{"sh", "-c", "sleep 60 & echo $! > " + pidFile + "; exec sleep 60"}, 100)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec = %v; want a deadline error", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Exec returned %v after a 200ms timeout", took)
	}
	waitGone(t, readPidFile(t, pidFile))
}

// A restarted agent runs checks in the jails it adopts with the
// environment recorded at their start; a record of an older agent, without
// one, gives PATH, HOME and KEEL_INSTANCE only.
func TestExecAdopted(t *testing.T) {
	h := newHost(t, fbsdsim.Options{StopTimeout: time.Second})
	state := t.TempDir()
	first := checkDriver(t, h, state)
	spec := simpleSpec("web-0", "10.0.60.5")
	spec.Spec.Env = map[string]string{"GREETING": "hello"}
	if _, err := first.Start(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop(context.Background(), "web-0", time.Second) })
	greet := []string{"sh", "-c", `echo "[$GREETING]" "$KEEL_INSTANCE"`}

	second := checkDriver(t, h, state)
	if _, _, err := second.Exec(t.Context(), "web-0", greet, 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec before Running adopted it: %v; want ErrNotFound", err)
	}
	if _, err := second.Running(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, out, err := second.Exec(t.Context(), "web-0", greet, 100); err != nil || code != 0 || string(out) != "[hello] web-0\n" {
		t.Errorf("Exec in the adopted jail = %d, %q, %v", code, out, err)
	}

	// The record as an older agent wrote it.
	path := filepath.Join(state, "freebsd/instances/web-0/record.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["env"] == nil {
		t.Fatalf("the record holds no environment: %s", b)
	}
	delete(rec, "env")
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	third := checkDriver(t, h, state)
	if _, err := third.Running(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, out, err := third.Exec(t.Context(), "web-0", greet, 100); err != nil || code != 0 || string(out) != "[] web-0\n" {
		t.Errorf("Exec in a jail an older agent started = %d, %q, %v", code, out, err)
	}
}

func TestExecNeedsACheckRunner(t *testing.T) {
	h := newHost(t, fbsdsim.Options{StopTimeout: time.Second})
	d := h.driver(t, "", freebsd.Options{})
	if _, err := d.Start(t.Context(), simpleSpec("web-0", "10.0.60.5")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), "web-0", time.Second) })
	if _, _, err := d.Exec(t.Context(), "web-0", []string{"true"}, 10); err == nil || !strings.Contains(err.Error(), "cannot run checks") {
		t.Errorf("Exec through a plain Runner: %v", err)
	}
}

// TestExecExecutableSimulator runs checks through ExecRunner on the
// simulator's executables, as the agent does on a host: jexec records
// itself as a process of the jail and execs env(1), which execs the check;
// the process group RunCheck kills on a timeout is the check's.
func TestExecExecutableSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the simulator")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "fbsdsim")
	build := exec.Command("go", "build", "-o", exe, "github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim/cmd/fbsdsim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "bin")
	if err := fbsdsim.Install(bin, exe); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	prep := fbsdsim.OnDisk(root, fbsdsim.Options{})
	if err := prep.MakeBaseImage("zroot/keel/base/test", "/usr/bin/env"); err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"zroot/keel/jails", "zroot/keel/volumes"} {
		if res, err := prep.Run(t.Context(), []string{"zfs", "create", ds}); err != nil || res.Code != 0 {
			t.Fatalf("zfs create %s: %v %s", ds, err, res.Stderr)
		}
	}
	prep.SetSysctl("kern.boottime", bootTime)
	runner := freebsd.ExecRunner{BinDir: bin, Env: append(os.Environ(), fbsdsim.RootEnv+"="+root, fbsdsim.StopTimeoutEnv+"=2s", "LC_ALL=C")}
	d, err := freebsd.New(t.Context(), freebsd.Options{Runner: runner, Root: root, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	spec := simpleSpec("web-0", "10.0.60.5")
	spec.Spec.Env = map[string]string{"GREETING": "hello"}
	p, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(p.PID, syscall.SIGKILL) })

	if code, out, err := d.Exec(ctx, "web-0", []string{"sh", "-c", `echo "$GREETING"; exit 4`}, 100); err != nil || code != 4 || string(out) != "hello\n" {
		t.Errorf("Exec = %d, %q, %v; want 4, hello", code, out, err)
	}
	if _, _, err := d.Exec(ctx, "db-0", []string{"true"}, 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in an instance never started: %v; want ErrNotFound", err)
	}

	pidFile := filepath.Join(dir, "pid")
	if _, _, err := d.Exec(cancelOnceWritten(t, pidFile), "web-0", []string{"sh", "-c", "sleep 60 & echo $! > " + pidFile + "; exec sleep 60"}, 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec of a check that hangs = %v; want its context's error", err)
	}
	waitGone(t, readPidFile(t, pidFile))
	// Only the workload is left in the jail.
	eventually(t, func() bool {
		st, err := fbsdsim.Load(root)
		return err == nil && len(st.Procs) == 1 && st.Procs[0].Pid == p.PID
	})
	if err := d.Stop(ctx, "web-0", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// cancelOnceWritten is the context of a check that hangs: it is
// cancelled once the check has written a pid to file, that is once it has
// started its background child and goes on to hang. A fixed timeout could
// not be one: on a busy machine the check (jexec, env, sh) may not even
// reach the write before it ends, and it is then killed, rightly, before
// it started what the test wants to see killed. It is cancelled anyway
// after a minute, and readPidFile fails then.
func cancelOnceWritten(t *testing.T, file string) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() {
		defer cancel()
		for end := time.Now().Add(time.Minute); time.Now().Before(end); {
			if b, err := os.ReadFile(file); err == nil {
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
					return
				}
			}
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx
}

func readPidFile(t *testing.T, file string) int {
	t.Helper()
	var pid int
	eventually(t, func() bool {
		b, err := os.ReadFile(file)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

// waitGone waits until pid is gone or a zombie.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	eventually(t, func() bool { return proctest.Gone(pid) })
}
