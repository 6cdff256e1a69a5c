//go:build linux

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// gossipTTL is the liveness TTL of the clusters with a gossip ring here:
// long enough that no move within a test can come from a report's age.
const gossipTTL = 10 * time.Minute

// TestGossipFailover: with a gossip ring, a killed node's stateless
// replicas move within the ring's detection time plus a reconcile, with a
// poll of ten minutes and a liveness TTL of ten minutes: neither the poll
// nor the reports' ages play a part.
func TestGossipFailover(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4*time.Minute, localcluster.Options{
		Gossip: true, LivenessTTL: gossipTTL, ReportInterval: gossipTTL / 3, Poll: 10 * time.Minute,
		Files: map[string]string{"apps/web.yaml": webService(6, "base/demo", "hello")},
	})
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	placed := c.checkOneEach(m)
	lost := placed["web-0"].Node
	var moving []string
	for _, inst := range m.Instances {
		if placed[inst.Name].Node == lost {
			moving = append(moving, inst.Name)
		}
	}
	// The nodes settle (planner.SettlePeriod, 30 s with a ring) before
	// they may take an instance from another.
	time.Sleep(31 * time.Second) // the settle period must pass: nothing to poll for
	c.killAgent(lost)
	died := time.Now()
	c.stopInstances(lost)
	others := slices.DeleteFunc(slices.Clone(c.Nodes), func(n string) bool { return n == lost })
	c.waitFor("the lost node's replicas run elsewhere, once each", func() (bool, string) {
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			if ps := procs[inst.Name]; len(ps) != 1 {
				return false, fmt.Sprintf("%s runs as %v", inst.Name, ps)
			}
		}
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range moving {
			on := runningOn(sts)[name]
			if len(on) != 1 || !slices.Contains(others, on[0]) {
				return false, fmt.Sprintf("%s is reported running on %v", name, on)
			}
		}
		return true, ""
	})
	moved := time.Since(died)
	t.Logf("%v moved off %s %s after it died (poll 10 min, livenessTTL %s)", moving, lost, moved.Round(100*time.Millisecond), gossipTTL)
	if moved > gossipTTL/2 {
		t.Errorf("the replicas took %s to move: that is the reports' ages, not the ring", moved)
	}
	for _, n := range others {
		if ok, line := c.logContains(n, "joined the gossip ring"); !ok {
			t.Errorf("%s never joined the ring: %s", n, line)
		}
	}
}
