//go:build linux

package probe

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/process"
	"github.com/keel-dev/keel/render"
)

// Exec checks through the process driver: real processes in the
// instance's root and environment, a check that hangs killed at its
// timeout, and nothing of the checks left once the Prober is closed.
func TestProcessDriverExec(t *testing.T) {
	state := t.TempDir()
	d, err := process.New(process.Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	spec := nodeexec.InstanceSpec{Name: "web", Node: "n1", Address: netip.MustParseAddr("127.77.0.9"), SpecHash: "h1",
		Spec: render.JailSpec{Command: []string{"sleep", "60"}, Env: map[string]string{"MARK": "ready-file"}}}
	proc, err := d.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), "web", 0) })

	p := New(Options{Exec: d})
	defer p.Close()
	readiness := execCheck("sh", "-c", `test -f "$MARK"`)
	liveness := execCheck("sleep", "60")
	liveness.Timeout, liveness.FailureThreshold = render.Duration(200*time.Millisecond), 2
	liveness.Period = render.Duration(300 * time.Millisecond)
	checks := render.Checks{Readiness: readiness, Liveness: liveness}
	if err := p.Set([]Target{{Name: "web", Identity: strconv.Itoa(proc.PID), Checks: checks}}); err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, p, "web", "the readiness check fails", func(s Status) bool { return s.Failure != "" })
	if s.Ready || s.Failure != "readiness: exec sh: exit status 1" {
		t.Errorf("before the file: %+v", s)
	}
	root, _ := d.RootDir("web")
	if err := os.WriteFile(filepath.Join(root, "ready-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, p, "web", "ready", isReady)
	s = waitFor(t, p, "web", "liveness failed", func(s Status) bool { return s.LivenessFailed })
	if s.Failure != "liveness: exec sleep: timed out after 200ms" {
		t.Errorf("liveness: %+v", s)
	}
	if all := instanceProcesses(t, state, -1); !slices.Contains(all, proc.PID) {
		t.Fatalf("the scan finds %v, not even the instance %d", all, proc.PID)
	}
	p.Close()
	if others := instanceProcesses(t, state, proc.PID); len(others) > 0 {
		t.Errorf("processes of the checks left: %v", others)
	}
}

// instanceProcesses lists the processes, other than except, that carry
// the driver's state directory in their environment.
func instanceProcesses(t *testing.T, state string, except int) []int {
	t.Helper()
	root, err := filepath.EvalSymlinks(state)
	if err != nil {
		t.Fatal(err)
	}
	marker := []byte(nodeexec.EnvDriverRoot + "=" + root + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == except {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, marker) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}
