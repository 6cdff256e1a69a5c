//go:build linux

package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestStarveBurstsMoveNothingBack: liveness hysteresis around the TTL
// (issue 8 item 8). n2's agent is starved (SIGSTOP, its instances keep
// running) in bursts of about the TTL (±20%), running between them only
// until it has published one report: its reports arrive around the TTL.
// An instance moves at most once, off n2, and never back; at the end each
// instance runs once. The evidence is the agents' logs, as in
// TestStarvedAgentMovesNothingBack.
func TestStarveBurstsMoveNothingBack(t *testing.T) {
	t.Parallel()
	started := time.Now()
	opts := localcluster.Options{Files: map[string]string{
		"jails/anchor.yaml": jail("anchor", "n1", 9900, false),
		"apps/api.yaml":     strings.Replace(webService(6, "base/demo", "api"), "name: web", "name: api", 1),
	}}
	c := newCluster(t, 8*time.Minute, opts)
	const starved = "n2"
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	placed := c.checkOneEach(m)
	var onStarved []string
	for _, inst := range m.Instances {
		if placed[inst.Name].Node == starved {
			onStarved = append(onStarved, inst.Name)
		}
	}
	if len(onStarved) == 0 {
		t.Fatalf("%s runs no replica: %v", starved, placed)
	}
	// Starve n2 only once every node's reports show it settled.
	if wait := ttl + 2*reportInterval - time.Since(started); wait > 0 {
		t.Logf("waiting %s for every node to settle", wait.Round(time.Millisecond))
		time.Sleep(wait)
	}
	pid := c.PID(starved)
	if pid == 0 {
		t.Fatalf("no agent process for %s", starved)
	}
	signal := func(sig syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("%s to %s's agent (pid %d): %v", sig, starved, pid, err)
		}
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	type burst struct{ from, to time.Time }
	var bursts []burst
	for i, f := range []float64{1.2, 0.8, 1.0, 1.2, 0.8, 1.2} {
		d := time.Duration(f * float64(ttl))
		from := time.Now()
		signal(syscall.SIGSTOP)
		time.Sleep(d) // the length of the starvation, not a wait on a condition
		to := time.Now()
		signal(syscall.SIGCONT)
		bursts = append(bursts, burst{from, to})
		// n2 runs until it has published a report made after it resumed.
		c.waitFor(fmt.Sprintf("%s publishes a report after burst %d", starved, i+1), func() (bool, string) {
			pub, err := c.published()
			if err != nil {
				return false, err.Error()
			}
			if r, ok := pub[starved]; !ok || r.Time.Before(to.Truncate(time.Millisecond)) {
				return false, fmt.Sprintf("%s's published report is dated %s, before it resumed", starved, r.Time.Format(time.RFC3339Nano))
			}
			return true, ""
		})
		t.Logf("burst %d: %s stopped for %s, published again %s after", i+1, starved, to.Sub(from).Round(100*time.Millisecond), time.Since(to).Round(100*time.Millisecond))
	}
	last := bursts[len(bursts)-1].to
	c.settle("after the bursts", last, 2*ttl, m)
	final := c.checkOneEach(m)
	for name, p := range final {
		if placed[name].Node != starved && p != placed[name] {
			t.Errorf("%s, on %s, was not starved but moved or restarted: %+v, then %+v", name, placed[name].Node, placed[name], p)
		}
		if placed[name].Node == starved && p.Node == starved && p.PID != placed[name].PID {
			t.Errorf("%s left %s and came back: %+v, then %+v", name, starved, placed[name], p)
		}
	}
	moves := c.checkMoves(starved, placed)
	for _, name := range onStarved {
		for _, at := range moves[name] {
			which := "no burst"
			for i, b := range bursts {
				if !at.Before(b.from) && at.Before(b.to.Add(ttl)) {
					which = fmt.Sprintf("burst %d", i+1)
				}
			}
			t.Logf("%s moved off %s at %s (%s)", name, starved, at.Format("15:04:05.000"), which)
		}
	}
}
