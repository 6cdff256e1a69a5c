package process

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
)

func TestExec(t *testing.T) {
	d := newDriver(t, Options{})
	s := spec("web", "sleep", "60")
	s.Spec.Env = map[string]string{"GREETING": "hello"}
	if _, err := d.Start(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	root, _ := d.RootDir("web")
	tests := []struct {
		name   string
		argv   []string
		code   int
		output string
	}{
		{"environment and root", []string{"sh", "-c", `echo "$GREETING" "$KEEL_INSTANCE"; pwd`}, 0, "hello web\n" + root + "\n"},
		{"argv expanded as the command's", []string{"echo", "${GREETING}", "$$"}, 0, "hello $\n"},
		{"a failing check", []string{"sh", "-c", "echo down >&2; exit 3"}, 3, "down\n"},
		{"output bounded", []string{"sh", "-c", "head -c 100000 /dev/zero; exit 1"}, 1, strings.Repeat("\x00", 64)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, err := d.Exec(t.Context(), "web", tt.argv, 64)
			if err != nil || code != tt.code || string(out) != tt.output {
				t.Errorf("Exec = %d, %q, %v; want %d, %q", code, out, err, tt.code, tt.output)
			}
		})
	}
	if _, _, err := d.Exec(t.Context(), "web", []string{"no-such-program"}, 64); err == nil || errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec of a missing program: %v; want an error other than not found", err)
	}
}

// A check that hangs is killed, with what it started, when its context
// ends; Exec returns promptly and the instance runs on.
func TestExecTimeout(t *testing.T) {
	d := newDriver(t, Options{})
	p, err := d.Start(t.Context(), spec("web", "sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = d.Exec(ctx, "web", []string{"sh", "-c", "sleep 60 & echo $! > " + pidFile + "; exec sleep 60"}, 64)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec = %v; want a deadline error", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Exec returned %v after a 200ms timeout", took)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	eventually(t, "the check's background sleep is gone", func() bool {
		st, err := readStat(child)
		return err != nil || !st.alive()
	})
	if r, err := d.Running(t.Context()); err != nil || r["web"] != p {
		t.Errorf("after the check: Running = %v, %v; want web still %+v", r, err, p)
	}
}

func TestExecNotRunning(t *testing.T) {
	d := newDriver(t, Options{})
	if _, _, err := d.Exec(t.Context(), "web", []string{"true"}, 64); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in an instance never started: %v; want ErrNotFound", err)
	}
	if _, err := d.Start(t.Context(), spec("web", "sleep", "60")); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(t.Context(), "web", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Exec(t.Context(), "web", []string{"true"}, 64); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in a stopped instance: %v; want ErrNotFound", err)
	}
}

// A restarted agent runs checks in the instances it adopts with the
// environment they were started with.
func TestExecAdopted(t *testing.T) {
	state := t.TempDir()
	first := newDriver(t, Options{StateDir: state})
	s := spec("web", "sleep", "60")
	s.Spec.Env = map[string]string{"GREETING": "hello"}
	if _, err := first.Start(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	second := newDriver(t, Options{StateDir: state})
	if _, _, err := second.Exec(t.Context(), "web", []string{"true"}, 64); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec before Running found it: %v; want ErrNotFound", err)
	}
	if _, err := second.Running(t.Context()); err != nil {
		t.Fatal(err)
	}
	code, out, err := second.Exec(t.Context(), "web", []string{"sh", "-c", `echo "$GREETING $KEEL_SPEC_HASH"`}, 64)
	if err != nil || code != 0 || !bytes.Equal(out, []byte("hello hash-1\n")) {
		t.Errorf("Exec in the adopted instance = %d, %q, %v", code, out, err)
	}
}
