// Package proctest tells the tests whether a process has ended, from
// Linux's /proc, and runs the test binary again as a helper process (a
// stand-in for an agent or a demo that a test kills outright).
package proctest

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Gone reports whether pid has ended: it is gone, or a zombie waiting for
// its parent (init reaps an orphan when it likes).
func Gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name, which may hold
	// anything, ')' and spaces included.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// WaitGone waits up to d for pid to end (Gone), and reports whether it did.
func WaitGone(pid int, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if Gone(pid) {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// StartSelf runs the test binary again, running no test, with env
// ("NAME=value") added to its environment: the package's TestMain sees it
// and plays its part. The helper is killed and reaped at the test's end.
func StartSelf(t testing.TB, env string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// WaitPIDFile waits up to d for file to appear (written whole: written
// aside and renamed) and returns the pid it holds.
func WaitPIDFile(t testing.TB, file string, d time.Duration) int {
	t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(file)
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			return pid
		}
		if time.Now().After(end) {
			t.Fatalf("%s did not appear within %s", file, d)
		}
	}
}
