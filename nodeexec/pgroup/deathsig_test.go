//go:build linux

package pgroup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/proctest"
)

// helperEnv makes the test binary, run again, run one check that hangs,
// as an agent would, until it is killed (TestCheckDiesWithItsAgent).
const helperEnv = "KEEL_PGROUP_HANGING_CHECK"

func TestMain(m *testing.M) {
	if pidFile := os.Getenv(helperEnv); pidFile != "" {
		code, _, err := Run(context.Background(), sh("echo $$ > "+pidFile+".tmp && mv "+pidFile+".tmp "+pidFile+" && exec sleep 1000"), 100)
		fmt.Fprintf(os.Stderr, "the hanging check ended: %d, %v\n", code, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// TestCheckDiesWithItsAgent: an agent killed outright (a crash, SIGKILL)
// while a check of its hangs takes the check with it: no one would time it
// out any more.
func TestCheckDiesWithItsAgent(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "check.pid")
	agent := proctest.StartSelf(t, helperEnv+"="+pidFile)
	pid := proctest.WaitPIDFile(t, pidFile, time.Minute)
	t.Cleanup(func() {
		if !proctest.Gone(pid) { // else the pid may be another process's by now
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = agent.Wait()
	// The check was the agent's child: it is reparented, then killed.
	if !proctest.WaitGone(pid, time.Minute) {
		t.Fatalf("the check (pid %d) still runs a minute after its agent was killed", pid)
	}
}
