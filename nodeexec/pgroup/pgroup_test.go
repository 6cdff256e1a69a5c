//go:build linux

package pgroup

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/proctest"
)

func sh(script string) *exec.Cmd { return exec.Command("/bin/sh", "-c", script) }

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name   string
		script string
		code   int
		output string
	}{
		{"success", "echo ok", 0, "ok\n"},
		{"failure", "echo no >&2; exit 3", 3, "no\n"},
		{"stdout and stderr together", "echo a; echo b >&2", 0, "a\nb\n"},
		{"killed by a signal", "kill -TERM $$", 128 + 15, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, err := Run(t.Context(), sh(tt.script), 1024)
			if err != nil || code != tt.code || string(out) != tt.output {
				t.Errorf("Run = %d, %q, %v; want %d, %q", code, out, err, tt.code, tt.output)
			}
		})
	}
}

func TestRunMissingProgram(t *testing.T) {
	cmd := exec.Command(filepath.Join(t.TempDir(), "missing"))
	if code, _, err := Run(t.Context(), cmd, 10); err == nil {
		t.Errorf("Run of a missing program = %d, nil; want an error", code)
	}
}

// The output is cut at the limit, and the command still runs to its end
// (what it writes beyond the limit is read and dropped, so it never blocks
// on a full pipe).
func TestRunOutputBound(t *testing.T) {
	code, out, err := Run(t.Context(), sh("head -c 1000000 /dev/zero; echo done >&2; exit 4"), 100)
	if err != nil || code != 4 {
		t.Fatalf("Run = %d, %v; want exit 4", code, err)
	}
	if !bytes.Equal(out, make([]byte, 100)) {
		t.Errorf("output is %d bytes, want the first 100", len(out))
	}
}

// A command that hangs, with a descendant holding its output open, is
// killed with that descendant when ctx ends, and Run returns promptly.
func TestRunTimeoutKillsTheGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	code, _, err := Run(ctx, sh("sleep 60 & echo $! > "+pidFile+"; sleep 60"), 100)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %d, %v; want a deadline error", code, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run took %v after a 200ms timeout", d)
	}
	waitGone(t, readPid(t, pidFile))
}

// What the command leaves behind in its group when it ends is killed.
func TestRunKillsLeftovers(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	code, _, err := Run(t.Context(), sh("sleep 60 >/dev/null 2>&1 & echo $! > "+pidFile), 100)
	if err != nil || code != 0 {
		t.Fatalf("Run = %d, %v", code, err)
	}
	waitGone(t, readPid(t, pidFile))
}

// A descendant that left the group (setsid) and holds the output open
// does not hold Run: it returns within waitDelay of the leader's end.
func TestRunEscapedDescendant(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid(1)")
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	code, out, err := Run(t.Context(), sh("setsid sh -c 'echo $$ > "+pidFile+"; exec sleep 60' & while [ ! -s "+pidFile+" ]; do sleep 0.01; done; echo bye"), 100)
	pid := readPid(t, pidFile)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err != nil || code != 0 || string(out) != "bye\n" {
		t.Errorf("Run = %d, %q, %v", code, out, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run took %v", d)
	}
}

func TestRunContextAlreadyDone(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cmd := sh("exit 0")
	if _, _, err := Run(ctx, cmd, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v; want context.Canceled", err)
	}
	if cmd.Process != nil {
		t.Errorf("the command was started")
	}
}

// readPid reads the pid a command wrote into file (written aside and
// renamed, or before the command ended).
func readPid(t *testing.T, file string) int {
	t.Helper()
	return proctest.WaitPIDFile(t, file, 10*time.Second)
}

// waitGone waits until pid is gone or a zombie (init reaps the orphan
// when it likes).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	if !proctest.WaitGone(pid, 10*time.Second) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("process %d still runs 10 s later", pid)
	}
}
