//go:build linux

package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestNodeLost: a node that dies with its workloads has its stateless
// replicas started elsewhere after the liveness TTL, while its stateful,
// pinned instance waits for it; when it comes back, each instance runs
// once, and then nothing moves.
func TestNodeLost(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"jails/anchor.yaml": jail("anchor", "n1", 9900, false),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	c.commit("web and db", map[string]string{
		"apps/web.yaml": webService(4, "base/demo", "hello"),
		"apps/db.yaml":  dbService(1),
	})
	c.converge("web and db")
	m := c.model()
	lost := m.Lock.Pins["db-0"]
	if lost == "" {
		t.Fatalf("db-0 is not pinned: lock %+v", m.Lock.Pins)
	}
	placed := c.checkOneEach(m)
	var moving []string
	for _, inst := range m.Instances {
		if !inst.Stateful && placed[inst.Name].Node == lost {
			moving = append(moving, inst.Name)
		}
	}
	if len(moving) == 0 {
		t.Fatalf("node %s runs no stateless replica: %v", lost, placed)
	}
	t.Logf("losing node %s, with db-0 and %v", lost, moving)

	// The node dies for good: its agent, then its instances.
	c.killAgent(lost)
	died := time.Now() // its last report is at most a report interval older
	c.stopInstances(lost)
	t.Logf("%s's instances stopped %s after its agent", lost, time.Since(died).Round(10*time.Millisecond))
	others := slices.DeleteFunc(slices.Clone(c.Nodes), func(n string) bool { return n == lost })

	// Meanwhile no other node may start db-0: its data is on the lost node.
	stop := make(chan struct{})
	done := make(chan string)
	go func() {
		done <- c.watchNotStarted("db-0", c.stateDirs(others...), stop)
	}()
	c.waitFor("the lost node's stateless replicas run elsewhere, once each", func() (bool, string) {
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			ps := procs[inst.Name]
			switch {
			case inst.Stateful && len(ps) > 0:
				return false, fmt.Sprintf("%s runs: %v", inst.Name, ps)
			case !inst.Stateful && len(ps) != 1:
				return false, fmt.Sprintf("%s runs as %v", inst.Name, ps)
			}
		}
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range moving {
			if on := runningOn(sts)[name]; len(on) != 1 {
				return false, fmt.Sprintf("%s is reported running on %v", name, on)
			}
		}
		return true, ""
	})
	moved := time.Since(died)
	t.Logf("stateless replicas of %s ran elsewhere %s after it died (livenessTTL %s)", lost, moved.Round(100*time.Millisecond), ttl)
	// Reports go out at least every report interval, give or take a pass
	// and a push: the others cannot have found the node dead much sooner
	// than the TTL minus that interval.
	if moved < ttl-reportInterval-2*time.Second {
		t.Errorf("the replicas moved %s after the node died, before its report could be %s old", moved, ttl)
	}
	// The others agree that the lost node is dead, and keep db-0 pinned to
	// it for a while longer.
	time.Sleep(ttl) // nothing may change during this wait
	close(stop)
	if problem := <-done; problem != "" {
		t.Error(problem)
	}
	sts := c.mustStatuses()
	for n, st := range sts {
		if ri := reported(st, "db-0"); ri != nil {
			t.Errorf("%s reports db-0: %+v", n, ri)
		}
	}

	// The node comes back, its workloads gone but its volume there.
	if err := c.Start(lost); err != nil {
		t.Fatal(err)
	}
	c.converge("the lost node is back")
	back := c.checkOneEach(m)
	if back["db-0"].Node != lost {
		t.Errorf("db-0 runs on %s, pinned to %s", back["db-0"].Node, lost)
	}

	// Then nothing moves or restarts for three TTLs.
	time.Sleep(3 * ttl) // nothing may change during this wait
	c.converge("three TTLs later")
	if later := c.checkOneEach(m); !maps.Equal(back, later) {
		var diff []string
		for name, p := range back {
			if later[name] != p {
				diff = append(diff, fmt.Sprintf("%s %+v → %+v", name, p, later[name]))
			}
		}
		t.Errorf("instances moved or restarted after the node came back: %s", strings.Join(diff, "; "))
	}
}

// watchNotStarted samples /proc until stop closes, and says whether the
// instance ever ran from one of the state directories roots.
func (c *cluster) watchNotStarted(name string, roots []string, stop <-chan struct{}) string {
	for {
		select {
		case <-stop:
			return ""
		default:
		}
		for _, p := range instanceProcs(roots...) {
			if p.Instance == name {
				return fmt.Sprintf("%s was started on %s (pid %d)", name, c.nodeOf(p.Root), p.PID)
			}
		}
		time.Sleep(50 * time.Millisecond) // a sampling period
	}
}
