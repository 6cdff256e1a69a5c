//go:build linux

package e2e

import (
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
	"github.com/keel-dev/keel/nodeexec"
)

// TestFreeBSDCluster runs three agents on the freebsd driver, each on a
// simulated FreeBSD host of its own, through a push, a scale up and down,
// a replace, the loss of a node and its return, and checks every host's
// state after each step (hostProblems: one jail per instance placed there,
// with its clone, epair, mounts and limits, the VIPs, the routes to the
// alive peers, and nothing else).
func TestFreeBSDCluster(t *testing.T) {
	t.Parallel()
	c := newFreeBSDCluster(t, 4*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":    fbsdWeb(3, "base/demo"),
		"jails/store.yaml": fbsdJail("store", ""),
	}})
	all := slices.Clone(c.Nodes)

	// Push: a Service of three replicas and a stateful Jail with a volume
	// and limits.
	c.converge("push")
	c.checkHosts("push", all...)
	c.waitAllAlive()

	// Scale up, and a stateful Service.
	c.commit("scale up", map[string]string{"apps/web.yaml": fbsdWeb(5, "base/demo"), "apps/db.yaml": fbsdDB(2)})
	c.converge("scale up")
	c.checkHosts("scale up", all...)
	before := c.placement()

	// Scale down: what the removed replicas had is gone, their volumes
	// stay.
	c.commit("scale down", map[string]string{"apps/web.yaml": fbsdWeb(3, "base/demo"), "apps/db.yaml": fbsdDB(1)})
	c.converge("scale down")
	c.checkHosts("scale down", all...)
	c.checkGone("scale down", all, "web-3", "web-4", "db-1")
	if !c.hasVolume(before["db-1"], "db-1-data") {
		t.Errorf("scale down: db-1's volume is gone from %s", before["db-1"])
	}

	// Replace: a new image needs a fresh root; the Jail is untouched.
	storeNode := before["store"]
	pids := c.jailPIDs(storeNode)
	c.commit("replace", map[string]string{"apps/web.yaml": fbsdWeb(3, "base/other")})
	c.converge("replace")
	c.checkHosts("replace", all...) // each web root is a clone of base/other@keel
	if got := c.jailPIDs(storeNode)["keel-store"]; !slices.Equal(got, pids["keel-store"]) {
		t.Errorf("replace: store's processes went from %v to %v", pids["keel-store"], got)
	}

	// Node lost: a node holding a stateful instance and a stateless
	// replica dies with its workloads (its host's state stays, as a dead
	// machine's disk). The others run its replicas and withdraw the route
	// to its /24; its stateful instances wait for it. Replicas spread one
	// per node when every node reports in time, so store's node also runs
	// a web replica; on a machine loaded past the liveness TTL at the
	// first push, each node may have taken every replica and kept some
	// (stateless duplicates resolve by stickiness), so the node is picked
	// from the placement rather than assumed.
	placed := c.placement()
	m := c.model()
	lost, moving, held := pickLost(all, placed, func(name string) bool { return m.Instance(name).Stateful })
	if len(moving) == 0 {
		t.Fatalf("no node runs a stateless replica: %v", placed)
	}
	if len(held) == 0 {
		t.Logf("no node runs both a stateful instance and a stateless replica (%v): losing %s, which holds no stateful instance", placed, lost)
	}
	t.Logf("losing node %s, with %v held and %v to move", lost, held, moving)
	lostPIDs := c.jailPIDs(lost)
	c.killAgent(lost)
	killHostWorkloads(t, c.hosts[lost])
	died := time.Now()
	survivors := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return n == lost })
	c.waitFor("the lost node's stateless replicas run on the others", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		on := runningOn(sts)
		for _, name := range moving {
			if len(on[name]) != 1 {
				return false, fmt.Sprintf("%s runs on %v", name, on[name])
			}
		}
		return true, ""
	})
	t.Logf("the replicas ran elsewhere %s after the node died (livenessTTL %s)", time.Since(died).Round(100*time.Millisecond), ttl)
	c.checkHosts("node lost", survivors...)
	sts := c.mustStatuses()
	for n, st := range sts {
		for _, name := range held {
			if ri := reported(st, name); ri != nil {
				t.Errorf("node lost: %s reports %s, whose volume is on the lost node: %+v", n, name, ri)
			}
		}
	}
	c.checkGone("node lost", survivors, held...)
	dead, err := c.hostState(lost)
	if err != nil {
		t.Fatal(err)
	}
	for jail := range lostPIDs {
		if dead.Jail(jail) == nil {
			t.Errorf("node lost: jail %s vanished from the dead host", jail)
		}
	}

	// The node comes back: store runs there again, the replicas that
	// moved leave nothing behind on it.
	if err := c.Start(lost); err != nil {
		t.Fatal(err)
	}
	c.converge("the lost node is back")
	c.checkHosts("the lost node is back", all...)
	c.checkGone("the lost node is back", []string{lost}, moving...)
	back := c.placement()
	for _, name := range held {
		if back[name] != lost {
			t.Errorf("%s runs on %s, pinned to %s", name, back[name], lost)
		}
	}
}

// pickLost picks the node to lose: the first of nodes that runs a
// stateless replica and a stateful instance, or else the first that runs a
// stateless replica; moving are its stateless instances, held its stateful
// ones.
func pickLost(nodes []string, placed map[string]string, stateful func(string) bool) (lost string, moving, held []string) {
	for _, needHeld := range []bool{true, false} {
		for _, n := range nodes {
			moving, held = nil, nil
			for name, on := range placed {
				switch {
				case on != n:
				case stateful(name):
					held = append(held, name)
				default:
					moving = append(moving, name)
				}
			}
			if len(moving) > 0 && (len(held) > 0 || !needHeld) {
				slices.Sort(moving)
				slices.Sort(held)
				return n, moving, held
			}
		}
	}
	return "", nil, nil
}

// TestFreeBSDCrashPoints kills an agent on the freebsd driver at each
// named step of its work (KEEL_CRASH_AT, as TestCrashPoints), restarts
// it, and checks its host: one jail per instance, the same processes for
// the jails that ran at the crash and are still placed there, and nothing
// orphaned. A stateless replica may have moved to the other node only if
// the victim's reports went stale past the liveness TTL meanwhile (on a
// machine loaded beyond what TestMain's scaling covers): see reportAges.
func TestFreeBSDCrashPoints(t *testing.T) {
	t.Parallel()
	const victim = "n2"
	c := newFreeBSDCluster(t, 4*time.Minute, localcluster.Options{Nodes: []string{"n1", "n2"}, Files: map[string]string{
		"apps/web.yaml":    fbsdWeb(2, "base/demo"),
		"jails/store.yaml": fbsdJail("store", victim),
	}})
	all := slices.Clone(c.Nodes)
	c.converge("first commit")
	c.checkHosts("first commit", all...)
	// Data in store's volume (its dataset's directory on the host), which
	// must survive every crash.
	marker := filepath.Join(c.hosts[victim], fbsdPool, "keel", "volumes", "store-data", "marker")
	if err := os.WriteFile(marker, []byte("before the crashes\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ages := c.watchReportAges()
	points := []string{nodeexec.CrashAfterVolume, nodeexec.CrashAfterStart, nodeexec.CrashBeforeStateWrite, nodeexec.CrashBeforeReportPush}
	for i, point := range points {
		ages.reset()
		// The victim stops cleanly while a change gives it work: a new
		// stateful jail, so a volume to create and a jail to provision.
		extra := fmt.Sprintf("crash%d", i)
		if err := c.Stop(victim, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		c.commit("add "+extra, map[string]string{"jails/" + extra + ".yaml": fbsdJail(extra, victim)})
		if point == nodeexec.CrashBeforeStateWrite || point == nodeexec.CrashBeforeReportPush {
			// These come in every pass: without a last good commit, the
			// first pass is the one that applies the new commit.
			if err := os.Remove(filepath.Join(c.StateDir(victim), "last-good")); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Start(victim, nodeexec.CrashEnv+"="+point); err != nil {
			t.Fatal(err)
		}
		if err := c.Exited(c.ctx, victim); err != nil {
			t.Fatalf("%s: the agent did not crash: %v", point, err)
		}

		// The crash came where asked, and left a consistent host.
		host, err := c.hostState(victim)
		if err != nil {
			t.Fatal(err)
		}
		// Its workloads: a readiness check in flight at the crash (an
		// orphan now, which ends by itself) is no process of theirs.
		atCrash := c.workloadPIDs(victim, c.model())
		runs := len(atCrash["keel-"+extra]) == 1
		// The new jail's operation (its volume, then its start) runs off
		// the agent's loop: before-report-push comes at the first push,
		// while that operation may still run, so the jail may or may not
		// run yet (and has its volume if it runs); the other points come
		// inside the operation or in the pass that folds it.
		switch {
		case point == nodeexec.CrashBeforeReportPush:
			if runs && !c.hasVolume(victim, extra+"-data") {
				t.Errorf("%s: %s runs without its volume %s-data at the crash", point, extra, extra)
			}
		default:
			if !c.hasVolume(victim, extra+"-data") {
				t.Errorf("%s: no volume %s-data at the crash", point, extra)
			}
			if started := point != nodeexec.CrashAfterVolume; runs != started {
				t.Errorf("%s: %s runs at the crash: %v, want %v (jails %v)", point, extra, runs, started, atCrash)
			}
		}
		var jails []string
		for name, j := range host.Jails {
			if !j.Dying {
				jails = append(jails, name)
			}
			if point == nodeexec.CrashBeforeReportPush && name == "keel-"+extra && len(atCrash[name]) == 0 {
				continue // killed while provisioning: the restart finishes or undoes it
			}
			if len(atCrash[name]) != 1 {
				t.Errorf("%s: jail %s has processes %v at the crash", point, name, atCrash[name])
			}
		}
		if j := host.Jails["keel-"+extra]; point == nodeexec.CrashBeforeReportPush && (j == nil || len(atCrash["keel-"+extra]) == 0) {
			// Killed while provisioning (a busy machine: the first push
			// waits opSettle at most for the operation): its epair, root
			// or mounts may be there without the running jail. The
			// restart must finish or undo it: checkHosts below.
			t.Logf("%s: %s was being provisioned at the crash", point, extra)
		} else {
			for _, l := range host.LeaksExpect(fbsdsimExpect(c, jails, all)) {
				t.Errorf("%s: at the crash: leak: %s", point, l)
			}
		}

		if err := c.Start(victim); err != nil {
			t.Fatal(err)
		}
		c.converge("restart after " + point)
		c.checkHosts("restart after "+point, all...)
		// A jail that ran at the crash runs on as the same processes: the
		// restarted agent adopts it. Or, for a stateless replica, it is
		// gone from the victim because another node took it over, which
		// the planner does only once the victim's reports are more than
		// the TTL old (its agent was down, restarting or starved of CPU
		// that long); checkHosts above saw it run once, and nothing of it
		// left. A replica the victim runs again as other processes would
		// have to have been taken from the other node in turn.
		m := c.model()
		after := c.workloadPIDs(victim, m)
		victimAge, othersAge := ages.maxAge(victim), ages.maxAgeOthers(all, victim)
		t.Logf("%s: the published reports were at most %s old for %s, %s for the others (livenessTTL %s)", point,
			victimAge.Round(100*time.Millisecond), victim, othersAge.Round(100*time.Millisecond), ttl)
		victimStale, othersStale := mayLookDead(victimAge, ttl), mayLookDead(othersAge, ttl)
		for jail, ps := range atCrash {
			if slices.Equal(after[jail], ps) {
				continue
			}
			inst := m.Instance(strings.TrimPrefix(jail, "keel-"))
			switch {
			case inst != nil && !inst.Stateful && len(after[jail]) == 0 && victimStale:
				t.Logf("%s: %s ran as %v at the crash, and moved off %s: its reports were up to %s old (livenessTTL %s)",
					point, jail, ps, victim, victimAge.Round(100*time.Millisecond), ttl)
			case inst != nil && !inst.Stateful && victimStale && othersStale:
				t.Logf("%s: %s ran as %v at the crash, and as %v after the restart: moved off %s and back (the reports of both nodes went stale past livenessTTL %s)",
					point, jail, ps, after[jail], victim, ttl)
			default:
				t.Errorf("%s: %s ran as %v at the crash, and as %v after the restart (%s's reports were at most %s old, livenessTTL %s)",
					point, jail, ps, after[jail], victim, victimAge.Round(100*time.Millisecond), ttl)
			}
		}
		if t.Failed() {
			t.Fatalf("%s: see above; instances at the crash %v, after %v", point, slices.Sorted(maps.Keys(atCrash)), slices.Sorted(maps.Keys(after)))
		}
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "before the crashes\n" {
		t.Errorf("the marker in store's volume: %q, %v", b, err)
	}
}
