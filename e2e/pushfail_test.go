//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// rejectReports is a pre-receive hook that refuses pushes to one node's
// report ref while a flag file exists: the repository stays readable for
// that node, but its reports no longer get through.
const rejectReports = `#!/bin/sh
while read old new ref; do
	if [ "$ref" = %q ] && [ -e %q ]; then
		echo "report pushes of %s are refused by the test" >&2
		exit 1
	fi
done
exit 0
`

// TestReportPushFailure: a node whose report pushes fail for longer than
// the TTL looks dead to the others, who start its stateless replicas; it
// keeps its own running until their new owners report them running (make
// before break), and once its pushes get through again the cluster goes
// back to one copy of each.
func TestReportPushFailure(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"jails/anchor.yaml": jail("anchor", "n1", 9900, false),
	}})
	const mute = "n3"
	flag := filepath.Join(c.Dir, "reject-"+mute)
	hook := fmt.Sprintf(rejectReports, render.DefaultReportRefPrefix+mute, flag, mute)
	if err := os.WriteFile(filepath.Join(c.Bare, "hooks", "pre-receive"), []byte(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	c.converge("first commit")
	c.waitAllAlive()
	c.commit("web", map[string]string{"apps/web.yaml": webService(6, "base/demo", "hello")})
	c.converge("web")
	m := c.model()
	placed := c.checkOneEach(m)
	var muted []string
	for _, inst := range m.Instances {
		if placed[inst.Name].Node == mute && inst.Service == "web" {
			muted = append(muted, inst.Name)
		}
	}
	if len(muted) == 0 {
		t.Fatalf("%s runs nothing: %v", mute, placed)
	}
	others := slices.DeleteFunc(slices.Clone(c.Nodes), func(n string) bool { return n == mute })

	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	muteAt := time.Now()
	stop := make(chan struct{})
	done := make(chan string)
	// What the wait below sees counts as seen by the watcher too: on a busy
	// machine the watcher's own samples may miss the moment.
	var seen gosync.Map
	go func() { done <- c.watchMakeBeforeBreak(mute, others, muted, placed, &seen, stop) }()

	c.waitFor("the others run "+strings.Join(muted, ", "), func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range muted {
			ok := false
			for _, n := range others {
				if ri := reported(sts[n], name); ri != nil && ri.State == report.StateRunning {
					ok = true
					seen.Store(name, true)
				}
			}
			if !ok {
				return false, "no other node runs " + name
			}
		}
		return true, ""
	})
	t.Logf("the others started %v %s after %s's pushes began to fail", muted, time.Since(muteAt).Round(100*time.Millisecond), mute)
	pub := c.mustPublished()
	if age := time.Since(pub[mute].Time); age < ttl-reportInterval {
		t.Errorf("%s's published report is only %s old: were its pushes refused?", mute, age)
	}

	// Let the muted node see the new owners and settle, then let its
	// reports through again.
	time.Sleep(ttl) // a time for make-before-break to be tested in
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	c.converge("pushes get through again")
	close(stop)
	if problem := <-done; problem != "" {
		t.Error(problem)
	}
	c.checkOneEach(m)
}

// watchMakeBeforeBreak samples, until stop closes, the statuses of the
// other nodes and then the processes of node: it returns a problem when one
// of node's instances stopped before another node had reported it running.
func (c *cluster) watchMakeBeforeBreak(node string, others, instances []string, was map[string]placement, seen *gosync.Map, stop <-chan struct{}) string {
	ownedElsewhere := map[string]bool{}
	var problems []string
	stopped := map[string]bool{}
	for {
		select {
		case <-stop:
			if len(stopped) > 0 {
				c.t.Logf("%s stopped %v once others ran them", node, slices.Sorted(mapKeys(stopped)))
			}
			return strings.Join(problems, "\n")
		default:
		}
		for _, n := range others {
			st, err := c.Status(c.ctx, n)
			if err != nil {
				continue
			}
			for _, name := range instances {
				if ri := reported(st, name); ri != nil && ri.State == report.StateRunning {
					ownedElsewhere[name] = true
				}
			}
		}
		for _, name := range instances {
			if _, ok := seen.Load(name); ok {
				ownedElsewhere[name] = true
			}
		}
		for _, name := range instances {
			if stopped[name] || procAlive(was[name].PID) {
				continue
			}
			stopped[name] = true
			if !ownedElsewhere[name] && !c.startedBeforeRemoved(name, node, others) {
				problems = append(problems, fmt.Sprintf("%s stopped %s (pid %d) before any other node reported it running", node, name, was[name].PID))
			}
		}
		time.Sleep(20 * time.Millisecond) // a sampling period
	}
}

// startedBeforeRemoved reports whether one of others' agent logs says it
// started instance before node's log says it removed it: the evidence of
// make-before-break when the samples of the statuses missed the moment (on
// a busy machine, a poll may take longer than the moment lasts). The logs
// are written by processes of this machine, on one clock.
func (c *cluster) startedBeforeRemoved(instance, node string, others []string) bool {
	removed, ok := c.logTime(node, `msg="removed instance" instance=`+instance+" ")
	if !ok {
		return false
	}
	for _, n := range others {
		if started, ok := c.logTime(n, `msg="started instance" instance=`+instance+" "); ok && started.Before(removed) {
			return true
		}
	}
	return false
}

// logTime returns the time of the last line of node's agent log that
// contains s.
func (c *cluster) logTime(node, s string) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(c.StateDir(node), "agent.log"))
	if err != nil {
		return time.Time{}, false
	}
	var at time.Time
	found := false
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, s) {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			at, found = t, true
		}
	}
	return at, found
}
