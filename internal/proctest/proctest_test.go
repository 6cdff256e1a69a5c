//go:build linux

package proctest

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestGone: a running child is not gone, its zombie is, and so is a
// reaped one; a command name with ") Z " in it fools nothing.
func TestGone(t *testing.T) {
	dir := t.TempDir()
	// A copy of sleep named to look like a zombie's stat line.
	name := dir + "/x) Z (y"
	b, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Skip(err)
	}
	if err := os.WriteFile(name, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if Gone(pid) {
		t.Fatalf("running %d taken for gone", pid)
	}
	if WaitGone(pid, 50*time.Millisecond) {
		t.Fatalf("WaitGone: running %d taken for gone", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie.
	if !WaitGone(pid, 10*time.Second) {
		t.Fatalf("killed %d not gone within 10 s", pid)
	}
	cmd.Wait()
	if !Gone(pid) {
		t.Fatalf("reaped %d not gone", pid)
	}
}
