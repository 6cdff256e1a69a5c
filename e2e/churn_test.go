//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// TestPinMoveWhileOldNodeDown (issue 8 item 3): the agent of the node a
// stateful jail is pinned to dies, its jail still running; the pin is
// changed to another node. The new node must not start the jail while the
// old node's last report says it runs, however long that lasts; once the
// old agent returns and stops it, the new node starts it: one copy at all
// times.
func TestPinMoveWhileOldNodeDown(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"jails/store.yaml": jail("store", "n2", 9300, true),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	if pin := c.model().Lock.Pins["store"]; pin != "n2" {
		t.Fatalf("store pinned to %q", pin)
	}
	// The others know store runs on n2 only from n2's report: wait until
	// it is in git. (Killed before, n2 would be a node that never said
	// what it runs, presumed alive during the warm-up: nothing could tell
	// n3 that store runs there.)
	c.waitFor("n2 reports store running", func() (bool, string) {
		pub, err := c.published()
		if err != nil {
			return false, err.Error()
		}
		for _, in := range pub["n2"].Instances {
			if in.Name == "store" && in.State == report.StateRunning {
				return true, ""
			}
		}
		return false, fmt.Sprintf("n2 reports %+v", pub["n2"].Instances)
	})

	c.killAgent("n2") // store keeps running on n2
	// keel lock never changes a pin: the operator edits it by hand.
	lockPath := filepath.Join(c.Work, "keel.lock")
	lock, err := os.ReadFile(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	moved := regexp.MustCompile(`(?m)^(\s+store:\s*)n2\s*$`).ReplaceAllString(string(lock), "${1}n3")
	if moved == string(lock) {
		t.Fatalf("no pin of store in keel.lock:\n%s", lock)
	}
	c.commit("move store to n3", map[string]string{"keel.lock": moved, "jails/store.yaml": jail("store", "n3", 9300, true)})
	c.waitFor("n1 and n3 apply the move", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for n, st := range sts {
			if st.Applied != c.tip() {
				return false, n + " has not applied the tip"
			}
		}
		return true, ""
	})

	// n2 is dead to the others within a TTL; on main, n3 then started store.
	stop := make(chan struct{})
	done := make(chan string)
	go func() { done <- c.watchNotStarted("store", c.stateDirs("n1", "n3"), stop) }()
	time.Sleep(3 * ttl) // nothing may start during this wait: n2 is long dead
	close(stop)
	if problem := <-done; problem != "" {
		t.Fatalf("a second copy while n2's agent is down: %s", problem)
	}
	c.waitFor("n3 says it waits for n2", func() (bool, string) {
		v, err := c.metric("n3", "keel_instances_waiting")
		if err != nil || v != 1 {
			return false, fmt.Sprintf("keel_instances_waiting %v (%v)", v, err)
		}
		return true, ""
	})
	if ps := c.procsByInstance()["store"]; len(ps) != 1 || ps[0].Node != "n2" {
		t.Fatalf("store runs as %v, want once on n2", ps)
	}

	// n2's agent returns: it stops store, then n3 starts it.
	if err := c.Start("n2"); err != nil {
		t.Fatal(err)
	}
	c.converge("n2 is back")
	if ps := c.procsByInstance()["store"]; len(ps) != 1 || ps[0].Node != "n3" {
		t.Fatalf("store runs as %v, want once on n3", ps)
	}
}

// TestGhostReportMovesNoClock (issue 8 item 4): a report dated 58 minutes
// ahead, pushed for a node outside the inventory, must not move any
// agent's report time past MaxClockLead, nor start or move anything.
func TestGhostReportMovesNoClock(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml": webService(3, "base/demo", "hello"),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	before := c.checkOneEach(m)

	ghost := report.Report{Node: "ghost", Time: time.Now().Add(58 * time.Minute), AgentVersion: "0.0.0"}
	pushReport(t, c.Bare, render.DefaultReportRefPrefix+"ghost", ghost.Marshal())
	lead := ttl / 3
	// Every agent fetches it within a poll; watch for two TTLs.
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		pub, err := c.published()
		if err != nil {
			time.Sleep(100 * time.Millisecond) // git may be writing a ref
			continue
		}
		now := time.Now()
		for n, r := range pub {
			if n == "ghost" {
				continue
			}
			if ahead := r.Time.Sub(now); ahead > lead+time.Second {
				t.Fatalf("%s's report is dated %s ahead after the ghost report (MaxClockLead %s)", n, ahead.Round(time.Second), lead)
			}
		}
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			if ps := procs[inst.Name]; len(ps) != 1 || ps[0] != before[inst.Name] {
				t.Fatalf("%s runs as %v, before the ghost as %v", inst.Name, ps, before[inst.Name])
			}
		}
		time.Sleep(200 * time.Millisecond) // a sampling period
	}
}

// pushReport writes data as report.yaml of a single orphan commit at ref
// of the bare repository, as an agent (or an attacker) would publish it.
func pushReport(t *testing.T, bare, ref string, data []byte) {
	t.Helper()
	git := func(stdin string, args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", bare}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=x", "GIT_AUTHOR_EMAIL=x@x.invalid", "GIT_COMMITTER_NAME=x", "GIT_COMMITTER_EMAIL=x@x.invalid")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	blob := git(string(data), "hash-object", "-w", "--stdin")
	tree := git("100644 blob "+blob+"\t"+report.FileName+"\n", "mktree")
	commit := git("", "commit-tree", tree, "-m", "report")
	git("", "update-ref", ref, commit)
}
