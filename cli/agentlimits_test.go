package cli_test

import (
	"strings"
	"testing"
)

// An agent refuses connection limits its descriptor limit cannot hold
// with the reserve for its own work, naming the limits, before it starts.
func TestAgentRefusesLimitsOverTheFDLimit(t *testing.T) {
	state := t.TempDir()
	base := []string{"agent", "--repo", t.TempDir(), "--node", "n1", "--state-dir", state, "--driver", "fake"}
	code, _, stderr := keel(t, append(base, "--proxy-max-conns", "100000000")...)
	if code == 0 || !strings.Contains(stderr, "file descriptors") || !strings.Contains(stderr, "--proxy-max-conns") {
		t.Fatalf("exit %d, stderr %q; want a refusal naming the limits", code, stderr)
	}
	code, _, stderr = keel(t, append(base, "--metrics-max-conns", "0")...)
	if code == 0 || !strings.Contains(stderr, "--metrics-max-conns") {
		t.Fatalf("exit %d, stderr %q; want a refusal of a zero limit", code, stderr)
	}
}

// --max-parallel-ops must let at least one instance operation run.
func TestAgentRefusesNoParallelOps(t *testing.T) {
	base := []string{"agent", "--repo", t.TempDir(), "--node", "n1", "--state-dir", t.TempDir(), "--driver", "fake"}
	code, _, stderr := keel(t, append(base, "--max-parallel-ops", "0")...)
	if code == 0 || !strings.Contains(stderr, "--max-parallel-ops") {
		t.Fatalf("exit %d, stderr %q; want a refusal of --max-parallel-ops 0", code, stderr)
	}
}
