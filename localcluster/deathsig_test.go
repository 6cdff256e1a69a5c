//go:build linux

package localcluster

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/proctest"
)

// helperEnv makes the test binary, run again, start one agent and wait to
// be killed (TestAgentDiesWithItsStarter).
const helperEnv = "KEEL_LOCALCLUSTER_STARTER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		c := &Cluster{Options: Options{Dir: dir, Keel: filepath.Join(dir, "keel"), Poll: time.Second}, Bare: dir, agents: map[string]*agentProc{}}
		if err := c.Start("n1"); err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(2)
		}
		select {}
	}
	os.Exit(m.Run())
}

// TestAgentDiesWithItsStarter: a process that started an agent and is
// killed outright (as go test kills a test binary at its timeout) takes the
// agent with it, rather than leave it running unowned.
func TestAgentDiesWithItsStarter(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "agent.pid")
	// A stand-in for keel: it records its pid and waits, as an agent does.
	script := "#!/bin/sh\necho $$ > " + pidFile + ".tmp && mv " + pidFile + ".tmp " + pidFile + "\nexec sleep 1000\n"
	if err := os.WriteFile(filepath.Join(dir, "keel"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	starter := proctest.StartSelf(t, helperEnv+"="+dir)
	pid := proctest.WaitPIDFile(t, pidFile, time.Minute)
	t.Cleanup(func() {
		if !proctest.Gone(pid) { // else the pid may be another process's by now
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := starter.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	starter.Wait()
	// The agent was the starter's child: it is reparented, then signalled.
	if !proctest.WaitGone(pid, time.Minute) {
		t.Fatalf("the agent (pid %d) still runs a minute after its starter was killed", pid)
	}
}
