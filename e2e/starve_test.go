//go:build linux

package e2e

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// TestStarvedAgentMovesNothingBack: liveness hysteresis (issue 8 item 8).
// n2's agent is starved (SIGSTOP, its instances keep running) for longer
// than the TTL: its replicas move to the others once, and when it is back
// none moves back, n2 stops its stale copies and each instance runs once.
// n2 is starved within the first TTL after the agents start, while every
// node is still settling: the replicas move once every other node has
// settled, to one node each (a node judges itself settling as its peers
// do). TestStarveBurstsMoveNothingBack starves it in bursts around the
// TTL. The evidence is the agents' logs ("started instance", "removed
// instance"), written on one clock, so that no move is missed however
// short it lasts.
func TestStarvedAgentMovesNothingBack(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 8*time.Minute, localcluster.Options{Files: map[string]string{
		"jails/anchor.yaml": jail("anchor", "n1", 9900, false),
	}})
	const starved = "n2"
	peers := []string{"n1", "n3"}
	c.converge("first commit")
	c.waitAllAlive()
	c.commit("web", map[string]string{"apps/web.yaml": webService(6, "base/demo", "hello")})
	c.converge("web")
	m := c.model()
	before := c.checkOneEach(m)
	var onStarved []string
	for _, inst := range m.Instances {
		if before[inst.Name].Node == starved {
			onStarved = append(onStarved, inst.Name)
		}
	}
	if len(onStarved) == 0 {
		t.Fatalf("%s runs no replica: %v", starved, before)
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
	// Whatever happens, the agent is not left stopped (teardown stops it
	// with SIGTERM).
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	// Phase 1: one starvation of at least 1.5 TTL, until the others run
	// n2's replicas.
	t.Logf("starving %s (pid %d), which runs %v; livenessTTL %s", starved, pid, onStarved, ttl)
	stopAt := time.Now()
	signal(syscall.SIGSTOP)
	c.waitFor("the others run "+strings.Join(onStarved, ", "), func() (bool, string) {
		if d := time.Since(stopAt); d < ttl*3/2 {
			return false, fmt.Sprintf("%s stopped for %s only", starved, d.Round(100*time.Millisecond))
		}
		for _, name := range onStarved {
			if on := c.reportedOn(name, peers); len(on) == 0 {
				return false, "no other node reports " + name + " running"
			}
		}
		return true, ""
	})
	contAt := time.Now()
	signal(syscall.SIGCONT)
	t.Logf("%s stopped for %s", starved, contAt.Sub(stopAt).Round(100*time.Millisecond))
	c.settle("n2 is back", contAt, 2*ttl, m)
	after := c.checkOneEach(m)
	for _, inst := range m.Instances {
		p := after[inst.Name]
		switch {
		case before[inst.Name].Node == starved && p.Node == starved:
			t.Errorf("%s runs on %s again (pid %d)", inst.Name, starved, p.PID)
		case before[inst.Name].Node != starved && p != before[inst.Name]:
			t.Errorf("%s, on %s, was not starved but moved or restarted: %+v, then %+v", inst.Name, before[inst.Name].Node, before[inst.Name], p)
		}
	}
	moves := c.checkMoves(starved, before)
	for _, name := range onStarved {
		if len(moves[name]) != 1 {
			t.Errorf("%s moved %d times off %s, not once: %v", name, len(moves[name]), starved, moves[name])
		}
	}
}

// reportedOn lists the nodes among nodes whose agents report the instance
// running.
func (c *cluster) reportedOn(name string, nodes []string) []string {
	var on []string
	for _, n := range nodes {
		st, err := c.Status(c.ctx, n)
		if err != nil {
			continue
		}
		if ri := reported(st, name); ri != nil && ri.State == report.StateRunning {
			on = append(on, n)
		}
	}
	return on
}

// settle waits until at least wait has passed since since, every agent
// runs the tip and each instance of m runs once, in one process.
func (c *cluster) settle(what string, since time.Time, wait time.Duration, m *render.Model) {
	c.t.Helper()
	c.waitFor(what+": settled", func() (bool, string) {
		if d := time.Since(since); d < wait {
			return false, fmt.Sprintf("only %s since", d.Round(100*time.Millisecond))
		}
		if ok, why := c.Converged(c.ctx); !ok {
			return false, why
		}
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			if ps := procs[inst.Name]; len(ps) != 1 {
				return false, fmt.Sprintf("%s runs as %v", inst.Name, ps)
			}
		}
		return true, ""
	})
	c.t.Logf("%s: settled %s after", what, time.Since(since).Round(100*time.Millisecond))
}

// checkMoves replays every instance's starts and removals from the agents'
// logs and fails the test when an instance moved more than once, moved off
// another node than starved, went back to a node it had left, or lost its
// newest copy (the older one kept it: a move back). first has where some
// instances were first placed, to check the logs against. It returns the
// times each instance moved.
func (c *cluster) checkMoves(starved string, first map[string]placement) map[string][]time.Time {
	c.t.Helper()
	type life struct {
		home    string // where its newest copy started
		holders map[string]bool
		left    map[string]bool // nodes that ever held it
		moves   []time.Time
	}
	lives := map[string]*life{}
	for _, e := range c.instanceEvents() {
		l := lives[e.Instance]
		if l == nil {
			l = &life{holders: map[string]bool{}, left: map[string]bool{}}
			lives[e.Instance] = l
		}
		at := e.At.Format("15:04:05.000")
		switch {
		case !e.Started:
			delete(l.holders, e.Node)
			if e.Node == l.home {
				c.t.Errorf("%s: its newest copy, on %s, was removed at %s; it runs on %v: a move back", e.Instance, e.Node, at, slices.Sorted(mapKeys(l.holders)))
			}
		case l.holders[e.Node]:
			c.t.Logf("%s restarted on %s at %s", e.Instance, e.Node, at)
		case l.left[e.Node]:
			c.t.Errorf("%s moved back to %s at %s", e.Instance, e.Node, at)
		case l.home == "":
			if p, ok := first[e.Instance]; ok && p.Node != e.Node {
				c.t.Errorf("the logs say %s first started on %s, /proc saw it on %s", e.Instance, e.Node, p.Node)
			}
			l.home = e.Node
		default:
			if len(l.moves) > 0 && l.holders[starved] {
				c.t.Errorf("%s started on %s at %s, a second copy for one death of %s (it had moved to %s)", e.Instance, e.Node, at, starved, l.home)
			} else if l.home != starved {
				c.t.Errorf("%s moved off %s, which was never starved, to %s at %s", e.Instance, l.home, e.Node, at)
			}
			l.moves = append(l.moves, e.At)
			if len(l.moves) > 1 {
				c.t.Errorf("%s moved again, to %s at %s: %d moves", e.Instance, e.Node, at, len(l.moves))
			}
			l.home = e.Node
		}
		if e.Started {
			l.holders[e.Node], l.left[e.Node] = true, true
		}
	}
	out := map[string][]time.Time{}
	for name := range first {
		if lives[name] == nil {
			c.t.Errorf("the agents' logs never say %s started", name)
		}
	}
	for name, l := range lives {
		out[name] = l.moves
	}
	return out
}

// instEvent is an instance started or removed on a node, from its log.
type instEvent struct {
	At       time.Time
	Node     string
	Instance string
	Started  bool // else removed
}

// instanceEvents reads the "started instance" and "removed instance" lines
// of every agent's log, in time order (a start before a removal at the same
// millisecond: make before break).
func (c *cluster) instanceEvents() []instEvent {
	c.t.Helper()
	var out []instEvent
	for _, n := range c.Nodes {
		b, err := os.ReadFile(filepath.Join(c.StateDir(n), "agent.log"))
		if err != nil {
			c.t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			var started bool
			switch {
			case strings.Contains(line, `msg="started instance" `):
				started = true
			case strings.Contains(line, `msg="removed instance" `):
			default:
				continue
			}
			_, rest, ok := strings.Cut(line, " instance=")
			if !ok {
				c.t.Fatalf("%s: no instance in %q", n, line)
			}
			name, _, _ := strings.Cut(rest, " ")
			ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil {
				c.t.Fatalf("%s: no time in %q: %v", n, line, err)
			}
			out = append(out, instEvent{At: at, Node: n, Instance: name, Started: started})
		}
	}
	slices.SortStableFunc(out, func(a, b instEvent) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		switch {
		case a.Started && !b.Started:
			return -1
		case b.Started && !a.Started:
			return 1
		}
		return cmp.Compare(a.Node, b.Node)
	})
	return out
}
