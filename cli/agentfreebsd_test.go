package cli_test

import (
	"runtime"
	"strings"
	"testing"
)

// The freebsd driver's flags are refused with another driver, a bridge
// that is not keel<N> is refused before any command runs, and the driver
// refuses to run on another OS unless pointed at the simulator.
func TestAgentFreeBSDFlags(t *testing.T) {
	base := func(driver string) []string {
		return []string{"agent", "--repo", t.TempDir(), "--node", "n1", "--state-dir", t.TempDir(), "--driver", driver}
	}
	for _, flag := range []string{"--pool", "--bridge", "--public-iface"} {
		code, _, stderr := keel(t, append(base("fake"), flag, "x")...)
		if code == 0 || !strings.Contains(stderr, flag+" is for --driver freebsd") {
			t.Errorf("%s with --driver fake: exit %d, stderr %q", flag, code, stderr)
		}
	}
	if runtime.GOOS != "freebsd" {
		code, _, stderr := keel(t, base("freebsd")...)
		if code == 0 || !strings.Contains(stderr, "runs on FreeBSD only") {
			t.Errorf("--driver freebsd on %s: exit %d, stderr %q", runtime.GOOS, code, stderr)
		}
	}
	t.Setenv("KEEL_FREEBSD_BINDIR", t.TempDir()) // no command is run before the refusal
	code, _, stderr := keel(t, append(base("freebsd"), "--bridge", "em0")...)
	if code == 0 || !strings.Contains(stderr, `"em0" is not a Keel bridge name`) {
		t.Errorf("--bridge em0: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = keel(t, append(base("freebsd"), "--public-iface", "keel0")...)
	if code == 0 || !strings.Contains(stderr, "public interface") {
		t.Errorf("--public-iface keel0: exit %d, stderr %q", code, stderr)
	}
}
