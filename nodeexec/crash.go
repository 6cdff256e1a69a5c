package nodeexec

import (
	"os"
	"strings"
	"syscall"
)

// Crash points are named steps of a reconcile pass at which an agent can be
// told to kill itself, to prove that a restart after a crash at that very
// moment neither duplicates nor loses anything. They are set with the
// environment variable KEEL_CRASH_AT (a comma-separated list of names) and
// only ever used by tests.
const (
	CrashAfterVolume      = "after-volume-create"
	CrashAfterStart       = "after-process-start"
	CrashBeforeStateWrite = "before-state-write"
	CrashBeforeReportPush = "before-report-push"
)

// CrashEnv is the environment variable that arms crash points.
const CrashEnv = "KEEL_CRASH_AT"

// CrashPoint kills the process with SIGKILL, as abruptly as a power cut
// allows from user space, when the named point is armed.
func CrashPoint(name string) {
	armed := os.Getenv(CrashEnv)
	if armed == "" {
		return
	}
	for p := range strings.SplitSeq(armed, ",") {
		if p == name {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
