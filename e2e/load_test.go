//go:build linux

package e2e

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// slowdown is how much slower than an idle machine this one runs the
// tests, measured once at start (see measureSlowdown); the clusters'
// liveness settings and the tests' deadlines are scaled by it.
var slowdown = 1.0

// maxSlowdown bounds the scaling: beyond it the tests would wait for
// minutes, and a machine that slow fails them honestly.
const maxSlowdown = 4.0

// measureSlowdown estimates the CPU contention of the machine: the share
// of the wall time a spinning thread gets on a CPU (other runnable work
// takes the rest), and the load average per CPU. It returns the larger
// factor, at least 1.
func measureSlowdown() (factor float64, why string) {
	share := spinShare(300 * time.Millisecond)
	byShare := 1.0
	if share > 0 {
		byShare = 1 / share
	}
	byLoad := 1.0
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if l, err := strconv.ParseFloat(f[0], 64); err == nil {
				byLoad = l / float64(runtime.NumCPU())
			}
		}
	}
	factor = min(max(1, byShare, byLoad), maxSlowdown)
	return factor, fmt.Sprintf("a spinning thread got %.0f%% of a CPU, the load average is %.1f per CPU", 100*share, byLoad)
}

// spinShare spins on one thread for wall and returns the CPU time the
// thread got over the wall time.
func spinShare(wall time.Duration) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			return 0
		}
		return time.Duration(ts.Nano())
	}
	start, c0 := time.Now(), cpu()
	for time.Since(start) < wall {
	}
	took, used := time.Since(start), cpu()-c0
	if used <= 0 || took <= 0 {
		return 0
	}
	return min(1, float64(used)/float64(took))
}

// scaled is d stretched by the measured slowdown.
func scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * slowdown).Round(100 * time.Millisecond)
}
