//go:build linux

package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/planner"
)

// TestGossipCutOffNodeStaysAlive: a node whose gossip traffic does not get
// through but whose git pushes flow (here: a botched key rotation, its
// agent restarted with a key the others do not hold) is held alive by the
// others once a report of it dated after the ring lost it arrives
// (planner's gossip-cut-off rule), for as long as it stays cut off; its
// pinned stateful instance never runs anywhere else meanwhile; and once
// its key is fixed the cluster converges with each instance once.
func TestGossipCutOffNodeStaysAlive(t *testing.T) {
	t.Parallel()
	// A TTL the test could not outwait by accident, and a report interval
	// short enough that the others' safety poll (max(--poll,
	// reportInterval)) brings the cut-off node's reports within the test.
	const (
		cutTTL      = time.Minute
		cutInterval = 15 * time.Second
	)
	c := newCluster(t, 5*time.Minute, localcluster.Options{
		Gossip: true, LivenessTTL: cutTTL, ReportInterval: cutInterval, Poll: 2 * time.Second,
		Files: map[string]string{"jails/anchor.yaml": jail("anchor", "n1", 9900, false)},
	})
	c.converge("first commit")
	c.waitAllAlive()
	c.commit("web and db", map[string]string{
		"apps/web.yaml": webService(4, "base/demo", "hello"),
		"apps/db.yaml":  dbService(1),
	})
	c.converge("web and db")
	m := c.model()
	cut := m.Lock.Pins["db-0"]
	if cut == "" {
		t.Fatalf("db-0 is not pinned: lock %+v", m.Lock.Pins)
	}
	first := c.checkOneEach(m)
	others := slices.DeleteFunc(slices.Clone(c.Nodes), func(n string) bool { return n == cut })

	// The others settle (planner.SettlePeriod, 30 s with a ring) before
	// they may take an instance from another node: the test must give
	// them the chance to take db-0 wrongly.
	c.waitSettled()

	// No other node may ever start db-0: its volume is on the cut node.
	stop := make(chan struct{})
	done := make(chan string)
	go func() { done <- c.watchNotStarted("db-0", c.stateDirs(others...), stop) }()
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			<-done
		}
	}()

	// The botched rotation: the cut node's agent restarts with a key of
	// its own (a second --gossip-key overrides localcluster's).
	bad := filepath.Join(c.Dir, "gossip-wrong.key")
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(cut, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.NodeArgs = map[string][]string{cut: {"--gossip-key", bad}}
	if err := c.Start(cut); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	t.Logf("%s (db-0's node) restarted with a gossip key the others do not hold", cut)

	// The others see it die in the ring, then hold it alive by its
	// reports while the ring still holds it dead.
	var firstDead, lastDead time.Time
	cutOff := func() (bool, string) {
		for _, n := range others {
			alive, err := c.metric(n, "keel_nodes_alive")
			if err != nil {
				return false, err.Error()
			}
			dead, err := c.metric(n, `keel_gossip_members{state="dead"}`)
			if err != nil {
				return false, err.Error()
			}
			if int(alive) < len(c.Nodes) {
				if firstDead.IsZero() {
					firstDead = time.Now()
				}
				lastDead = time.Now()
				return false, fmt.Sprintf("%s holds %d nodes alive", n, int(alive))
			}
			if int(dead) != 1 {
				return false, fmt.Sprintf("%s's ring holds %d nodes dead, not %s", n, int(dead), cut)
			}
		}
		return true, ""
	}
	c.waitFor("the others hold "+cut+" alive while their ring holds it dead", cutOff)
	held := time.Since(cutAt)
	if firstDead.IsZero() {
		t.Logf("the others held %s alive all along (never sampled dead); cut-off rule in force %s after the restart", cut, held.Round(100*time.Millisecond))
	} else {
		t.Logf("the others held %s dead from %s to %s after the restart (about %s), alive by its reports from %s", cut,
			firstDead.Sub(cutAt).Round(100*time.Millisecond), lastDead.Sub(cutAt).Round(100*time.Millisecond),
			lastDead.Sub(firstDead).Round(100*time.Millisecond), held.Round(100*time.Millisecond))
	}
	if ok, line := c.logContains(cut, "joined the gossip ring"); !ok {
		t.Errorf("%s never started its ring: %s", cut, line)
	}

	// It stays alive in their plans for two more report intervals (every
	// report of it is fetched by the safety poll), still cut off.
	for end := time.Now().Add(2*cutInterval + 5*time.Second); time.Now().Before(end); {
		if ok, why := cutOff(); !ok {
			t.Errorf("%s after the restart, while %s stays cut off: %s", time.Since(cutAt).Round(100*time.Millisecond), cut, why)
			break
		}
		time.Sleep(time.Second) // a sampling period over a window that is the point of the test
	}
	for _, n := range others {
		t.Logf("%s's log has %d lines of the gossip component (the cut node's undecryptable traffic among them)", n, c.logCount(n, "component=gossip"))
	}
	if !c.cutOffView(cut) {
		t.Errorf("%s's agent does not see itself in a minority of the ring", cut)
	}
	procs := c.procsByInstance()
	if ps := procs["db-0"]; len(ps) != 1 || ps[0].Node != cut {
		t.Errorf("db-0 runs as %v while %s is cut off, not once on it", ps, cut)
	}

	// The key is fixed: the node rejoins the ring, and every instance runs
	// once.
	if err := c.Stop(cut, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.NodeArgs = nil
	if err := c.Start(cut); err != nil {
		t.Fatal(err)
	}
	fixedAt := time.Now()
	c.waitFor("the ring holds every node alive again", func() (bool, string) {
		for _, n := range c.Nodes {
			v, err := c.metric(n, `keel_gossip_members{state="alive"}`)
			if err != nil {
				return false, err.Error()
			}
			if int(v) != len(c.Nodes) {
				return false, fmt.Sprintf("%s's ring holds %d nodes alive", n, int(v))
			}
		}
		return true, ""
	})
	t.Logf("the key fixed, %s is back in every ring %s later", cut, time.Since(fixedAt).Round(100*time.Millisecond))
	c.converge("the key is fixed")
	c.waitAllAlive()
	back := c.checkOneEach(m)
	if back["db-0"].Node != cut {
		t.Errorf("db-0 runs on %s, pinned to %s", back["db-0"].Node, cut)
	}
	close(stop)
	stopped = true
	if problem := <-done; problem != "" {
		t.Error(problem)
	}
	// While it was held dead its stateless replicas may have moved: once
	// each, never back (and db-0 not at all).
	moves := c.checkMoves(cut, first)
	var moved []string
	for _, name := range slices.Sorted(mapKeys(moves)) {
		if len(moves[name]) > 0 {
			moved = append(moved, fmt.Sprintf("%s→%s", name, back[name].Node))
		}
	}
	if len(moves["db-0"]) > 0 {
		t.Errorf("db-0 moved: %v", moves["db-0"])
	}
	t.Logf("instances moved off %s while it was held dead: %v", cut, moved)
}

// cutOffView reports whether node's agent logs that its view of the ring
// is a minority (planner.WarnGossipMinority), which makes it judge the
// others by their reports.
func (c *cluster) cutOffView(node string) bool {
	alive, err := c.metric(node, `keel_gossip_members{state="alive"}`)
	if err != nil {
		c.t.Logf("%s: %v", node, err)
		return false
	}
	plan, err := c.metric(node, "keel_nodes_alive")
	if err != nil {
		c.t.Logf("%s: %v", node, err)
		return false
	}
	c.t.Logf("%s's ring holds %d nodes alive, its plan %d", node, int(alive), int(plan))
	return 2*int(alive) <= len(c.Nodes) && int(plan) == len(c.Nodes)
}

// TestGossipFlappingNodeMovesOnce: a node's agent stopped (SIGSTOP; its
// instances keep running) again and again around the ring's suspicion
// timeout: a pause shorter than the suspicion moves nothing, and over all
// the pauses no instance moves twice, none moves back, and each ends up
// running once.
func TestGossipFlappingNodeMovesOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 5*time.Minute, localcluster.Options{
		Gossip: true, LivenessTTL: gossipTTL, ReportInterval: gossipTTL / 3, Poll: 10 * time.Minute,
		Files: map[string]string{"apps/web.yaml": webService(6, "base/demo", "hello")},
	})
	started := time.Now()
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	before := c.checkOneEach(m)
	const flapper = "n2"
	var onFlapper []string
	for _, inst := range m.Instances {
		if before[inst.Name].Node == flapper {
			onFlapper = append(onFlapper, inst.Name)
		}
	}
	if len(onFlapper) == 0 {
		t.Fatalf("%s runs no replica: %v", flapper, before)
	}
	pid := c.PID(flapper)
	signal := func(sig syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("%s to %s's agent (pid %d): %v", sig, flapper, pid, err)
		}
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	// The others settle (30 s with a ring) before they may take an
	// instance: until then no pause could move anything.
	time.Sleep(time.Until(started.Add(planner.SettlePeriod(m) + time.Second))) // nothing to poll for

	// pause stops the flapper's agent for d (the pause is the point),
	// sampling the others' rings meanwhile, then waits until every agent
	// answers. It returns how long after the stop a peer's ring first held
	// the flapper dead, 0 if none did.
	peers := []string{"n1", "n3"}
	pause := func(d time.Duration) time.Duration {
		t.Helper()
		var dead time.Duration
		stopAt := time.Now()
		signal(syscall.SIGSTOP)
		for end := stopAt.Add(d); time.Now().Before(end); {
			for _, n := range peers {
				if v, err := c.metric(n, `keel_gossip_members{state="dead"}`); err == nil && v > 0 && dead == 0 {
					dead = time.Since(stopAt)
				}
			}
			time.Sleep(100 * time.Millisecond) // a sampling period within the pause, which is the test
		}
		signal(syscall.SIGCONT)
		c.waitFor("every agent answers after a pause", func() (bool, string) {
			_, err := c.statuses()
			if err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		if dead > 0 {
			t.Logf("paused %s for %s: a peer's ring held it dead %s after the stop", flapper, d, dead.Round(100*time.Millisecond))
		} else {
			t.Logf("paused %s for %s: no peer's ring held it dead", flapper, d)
		}
		return dead
	}

	// Short pauses, well within memberlist's suspicion (4 s for three
	// members, after a failed probe): no peer holds the flapper dead (a
	// suspect counts as alive), and nothing moves or restarts.
	for _, d := range []time.Duration{1500 * time.Millisecond, 3 * time.Second} {
		if dead := pause(d); dead > 0 {
			t.Errorf("a pause of %s, shorter than the suspicion, was taken for a death %s after the stop", d, dead.Round(100*time.Millisecond))
		}
	}
	// Reports and plans catch up: a move, had there been one, would show
	// within a reconcile or two.
	c.converge("after the short pauses")
	if now := c.checkOneEach(m); !maps.Equal(before, now) {
		t.Errorf("a pause shorter than the suspicion moved or restarted instances: %s", placementDiff(before, now))
	}
	if evs := c.instanceEvents(); len(evs) != len(m.Instances) {
		t.Errorf("the agents started or removed instances during the short pauses: %d events for %d instances", len(evs), len(m.Instances))
	}

	// Pauses around and beyond the suspicion timeout, each followed by a
	// short run: whatever moves must move once.
	for _, d := range []time.Duration{4 * time.Second, 7 * time.Second, 5 * time.Second, 10 * time.Second, 6 * time.Second} {
		pause(d)
		time.Sleep(2 * time.Second) // the run between two pauses is the test
	}
	lastAt := time.Now()
	// Long enough that the flapper has settled again (30 s after it came
	// back) and would take back what it could.
	c.settle("the flapper", lastAt, planner.SettlePeriod(m)+5*time.Second, m)
	after := c.checkOneEach(m)
	moves := c.checkMoves(flapper, before)
	var moved []string
	for _, name := range slices.Sorted(mapKeys(moves)) {
		if len(moves[name]) > 0 {
			moved = append(moved, fmt.Sprintf("%s→%s", name, after[name].Node))
		}
	}
	t.Logf("of %v on %s, moved once each: %s", onFlapper, flapper, strings.Join(moved, " "))
}

func placementDiff(a, b map[string]placement) string {
	var diff []string
	for _, name := range slices.Sorted(mapKeys(a)) {
		if a[name] != b[name] {
			diff = append(diff, fmt.Sprintf("%s %+v → %+v", name, a[name], b[name]))
		}
	}
	return strings.Join(diff, "; ")
}

// TestGossipRestartMovesNothing: an agent that stops cleanly (an upgrade)
// does not leave the ring (gossip.Ring.Stop), so when it is back within
// the failure detector's suspicion no peer ever holds it dead and nothing
// moves or restarts.
func TestGossipRestartMovesNothing(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{
		Gossip: true, LivenessTTL: gossipTTL, ReportInterval: gossipTTL / 3, Poll: 10 * time.Minute,
		Files: map[string]string{"apps/web.yaml": webService(6, "base/demo", "hello")},
	})
	started := time.Now()
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	before := c.checkOneEach(m)
	const restarted = "n2"
	others := []string{"n1", "n3"}
	// The others settle (30 s with a ring) before they may take an
	// instance: until then a restart could not move anything.
	time.Sleep(time.Until(started.Add(planner.SettlePeriod(m) + time.Second))) // nothing to poll for

	stopAt := time.Now()
	if err := c.Stop(restarted, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(restarted); err != nil {
		t.Fatal(err)
	}
	// The others' rings never hold it dead; sampled until it is back in
	// every ring and a few reconciles later.
	var heldDead []string
	var backAt time.Time
	c.waitFor(restarted+" is back in every ring", func() (bool, string) {
		for _, n := range others {
			if dead, err := c.metric(n, `keel_gossip_members{state="dead"}`); err == nil && dead > 0 {
				heldDead = append(heldDead, fmt.Sprintf("%s at %s", n, time.Since(stopAt).Round(100*time.Millisecond)))
			}
		}
		for _, n := range c.Nodes {
			v, err := c.metric(n, `keel_gossip_members{state="alive"}`)
			if err != nil {
				return false, err.Error()
			}
			if int(v) != len(c.Nodes) {
				return false, fmt.Sprintf("%s's ring holds %d nodes alive", n, int(v))
			}
		}
		if backAt.IsZero() {
			backAt = time.Now()
		}
		// Five seconds more: a move would take a reconcile (1 s) after
		// the ring's verdict.
		return time.Since(backAt) > 5*time.Second, "watching a while longer"
	})
	gap := c.restartGap(restarted, stopAt)
	t.Logf("%s stopped and restarted: in its ring again %s after the stop, back in every ring %s after", restarted, gap.Round(10*time.Millisecond), backAt.Sub(stopAt).Round(100*time.Millisecond))
	if len(heldDead) > 0 {
		// memberlist's suspicion is 4 s for three members, after a failed
		// probe: a restart slower than that (a machine too busy) is a
		// death, and it is not what this test is about.
		if gap > 3*time.Second {
			t.Skipf("the restart took %s, longer than the suspicion: the others held it dead (%v)", gap, heldDead)
		}
		t.Errorf("the others' rings held %s dead after a restart of %s: %v", restarted, gap, heldDead)
	}
	c.converge("after the restart")
	if now := c.checkOneEach(m); !maps.Equal(before, now) {
		t.Errorf("a clean restart moved or restarted instances: %s", placementDiff(before, now))
	}
	if evs := c.instanceEvents(); len(evs) != len(m.Instances) {
		t.Errorf("the agents started or removed instances after the restart: %d events for %d instances", len(evs), len(m.Instances))
	}
}

// restartGap is how long after since node's agent logged that it joined
// the gossip ring (its last such line).
func (c *cluster) restartGap(node string, since time.Time) time.Duration {
	c.t.Helper()
	b, err := os.ReadFile(c.LogFile(node))
	if err != nil {
		c.t.Fatal(err)
	}
	var at time.Time
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, "joined the gossip ring") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			at = t
		}
	}
	if at.IsZero() {
		c.t.Fatalf("%s never logged that it joined the gossip ring", node)
	}
	return at.Sub(since)
}

// logCount counts the lines of node's agent log that contain s.
func (c *cluster) logCount(node, s string) int {
	b, err := os.ReadFile(c.LogFile(node))
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}
