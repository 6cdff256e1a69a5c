//go:build linux

package e2e

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/report"
)

// TestChanges: each kind of change to the specs does what it must, and the
// cluster converges after each: scaling a Service up and down, replacing
// its image one replica at a time, restarting on an env change, deleting a
// Jail.
func TestChanges(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":       webService(3, "base/demo", "hello"),
		"jails/exporter.yaml": jail("exporter", "n2", 9100, false),
	}})
	c.converge("first commit")

	// Scale up: two more replicas, on the least loaded nodes; the others
	// are left alone.
	before := c.checkOneEach(c.model())
	c.commit("scale web to 5", map[string]string{"apps/web.yaml": webService(5, "base/demo", "hello")})
	c.converge("scale up")
	after := c.checkOneEach(c.model())
	perNode := map[string]int{}
	for i := range 5 {
		name := fmt.Sprintf("web-%d", i)
		perNode[after[name].Node]++
		if old, ok := before[name]; ok && old != after[name] {
			t.Errorf("scale up moved or restarted %s: %+v, then %+v", name, old, after[name])
		}
	}
	for n, k := range perNode {
		if k > 2 {
			t.Errorf("node %s runs %d of 5 replicas of web", n, k)
		}
	}
	c.checkAnswers("web", 5, "hello")

	// Scale down: the extra replicas stop, their processes are gone, and
	// no node reports them any more.
	c.commit("scale web to 3", map[string]string{"apps/web.yaml": webService(3, "base/demo", "hello")})
	c.converge("scale down")
	after = c.checkOneEach(c.model())
	for i := range 3 {
		name := fmt.Sprintf("web-%d", i)
		if before[name] != after[name] {
			t.Errorf("scale down moved or restarted %s: %+v, then %+v", name, before[name], after[name])
		}
	}
	c.waitFor("no node reports the removed replicas", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for n, st := range sts {
			for _, name := range []string{"web-3", "web-4"} {
				if st.Report.Instance(name) != nil {
					return false, n + " still reports " + name
				}
			}
		}
		return true, ""
	})

	// A new image replaces the replicas one at a time: at no moment are
	// two of them down, whether asked of the agents or of /proc.
	stop := make(chan struct{})
	done := make(chan string)
	go func() { done <- c.watchRollout("web", 3, stop) }()
	old := map[string]int{}
	for i := range 3 {
		name := fmt.Sprintf("web-%d", i)
		old[name] = after[name].PID
	}
	exits, err := watchExits(old, stop)
	if err != nil {
		t.Fatal(err)
	}
	c.commit("web on base/demo2", map[string]string{"apps/web.yaml": webService(3, "base/demo2", "hello")})
	c.converge("image replace")
	close(stop)
	if problem := <-done; problem != "" {
		t.Error(problem)
	}
	<-exits.done
	replaced := c.checkOneEach(c.model())
	c.checkOneDownAtATime(exits, replaced)
	for i := range 3 {
		name := fmt.Sprintf("web-%d", i)
		if replaced[name].PID == after[name].PID {
			t.Errorf("%s was not replaced: still pid %d", name, after[name].PID)
		}
		if replaced[name].Node != after[name].Node {
			t.Errorf("%s moved from %s to %s on replace", name, after[name].Node, replaced[name].Node)
		}
	}
	// A new env restarts each replica: new PIDs, the new greeting.
	c.commit("greet in French", map[string]string{"apps/web.yaml": webService(3, "base/demo2", "bonjour")})
	c.converge("env restart")
	restarted := c.checkOneEach(c.model())
	for i := range 3 {
		name := fmt.Sprintf("web-%d", i)
		if restarted[name].PID == replaced[name].PID || restarted[name].Node != replaced[name].Node {
			t.Errorf("%s was not restarted in place: %+v, then %+v", name, replaced[name], restarted[name])
		}
	}
	c.checkAnswers("web", 3, "bonjour")

	// Deleting a Jail stops it: its process is gone and no node reports it.
	exporter := restarted["exporter"]
	c.commit("delete the exporter", map[string]string{"jails/exporter.yaml": ""})
	c.converge("delete a jail")
	if procAlive(exporter.PID) {
		t.Errorf("the exporter's process %d still runs", exporter.PID)
	}
	if ps := c.procsByInstance()["exporter"]; len(ps) > 0 {
		t.Errorf("the exporter still has processes: %v", ps)
	}
	c.checkOneEach(c.model())
	c.waitFor("no node reports the exporter", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for n, st := range sts {
			if st.Report.Instance("exporter") != nil {
				return false, n + " still reports the exporter"
			}
		}
		return true, ""
	})
}

// checkAnswers waits until every replica of service answers with the
// greeting at the address its node reports (a replica reported running may
// not listen yet).
func (c *cluster) checkAnswers(service string, replicas int, greeting string) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("every replica of %s answers %q", service, greeting), func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for i := range replicas {
			name := fmt.Sprintf("%s-%d", service, i)
			nodes := runningOn(sts)[name]
			if len(nodes) != 1 {
				return false, fmt.Sprintf("%s runs on %v", name, nodes)
			}
			ri := reported(sts[nodes[0]], name)
			body, err := httpGet(c.ctx, ri.Address, webPort)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", name, err)
			}
			if want := greeting + " from " + name + " on node " + nodes[0]; !strings.HasPrefix(body, want) {
				return false, fmt.Sprintf("%s answered %q, want %q...", name, body, want)
			}
		}
		return true, ""
	})
}

// watchRollout samples, until stop closes, the agents' statuses and the
// processes of the service's replicas, and returns what went wrong: two
// replicas down at once. It also says how many samples saw one down, so
// that a sampler too slow to see anything is noticed.
func (c *cluster) watchRollout(service string, replicas int, stop <-chan struct{}) string {
	var problems []string
	samples, sawDown := 0, 0
	for {
		select {
		case <-stop:
			c.t.Logf("rollout of %s: %d samples, %d with one replica down", service, samples, sawDown)
			return strings.Join(problems, "\n")
		default:
		}
		sts, err := c.statuses()
		if err != nil {
			continue
		}
		procs := c.procsByInstance()
		samples++
		downStatus, downProcs := downReplicas(sts, service, replicas), []string{}
		for i := range replicas {
			name := fmt.Sprintf("%s-%d", service, i)
			if len(procs[name]) == 0 {
				downProcs = append(downProcs, name)
			}
		}
		if len(downStatus) > 0 || len(downProcs) > 0 {
			sawDown++
		}
		if len(downStatus) > 1 && len(problems) < 5 {
			problems = append(problems, fmt.Sprintf("the agents report %v not running at once", downStatus))
		}
		if len(downProcs) > 1 && len(problems) < 5 {
			problems = append(problems, fmt.Sprintf("%v have no process at once", downProcs))
		}
		time.Sleep(5 * time.Millisecond) // a sampling period, not a wait for a condition
	}
}

// downReplicas lists the replicas no agent reports running.
func downReplicas(sts map[string]agent.Status, service string, replicas int) []string {
	var down []string
	for i := range replicas {
		name := fmt.Sprintf("%s-%d", service, i)
		up := false
		for _, st := range sts {
			if ri := st.Report.Instance(name); ri != nil && ri.State == report.StateRunning {
				up = true
			}
		}
		if !up {
			down = append(down, name)
		}
	}
	return down
}

// exitWatch learns when processes exit, to the millisecond, from pidfds.
type exitWatch struct {
	mu    gosync.Mutex
	exits map[string]float64 // by instance, in seconds of CLOCK_BOOTTIME
	done  chan struct{}
}

// watchExits starts watching the given processes (by instance) until they
// exit or stop closes.
func watchExits(procs map[string]int, stop <-chan struct{}) (*exitWatch, error) {
	w := &exitWatch{exits: map[string]float64{}, done: make(chan struct{})}
	var wg gosync.WaitGroup
	for name, pid := range procs {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return nil, fmt.Errorf("pidfd of %s (pid %d): %w", name, pid, err)
		}
		wg.Go(func() {
			defer unix.Close(fd)
			for {
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				n, err := unix.Poll(fds, 100)
				if err == nil && n > 0 {
					w.mu.Lock()
					w.exits[name] = boottime()
					w.mu.Unlock()
					return
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	go func() { wg.Wait(); close(w.done) }()
	return w, nil
}

// boottime reads CLOCK_BOOTTIME, the clock of the start times in /proc.
func boottime() float64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// startedAt reads when pid started, in seconds of CLOCK_BOOTTIME (to the
// clock tick), from /proc/<pid>/stat.
func startedAt(pid int) (float64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ticks, err := strconv.ParseInt(fields[22-3], 10, 64) // starttime is field 22
	if err != nil {
		return 0, err
	}
	return float64(ticks) / clockTicks, nil
}

// checkOneDownAtATime checks that the replicas' down windows, each from the
// exit of its old process to the start of its new one, never overlap.
func (c *cluster) checkOneDownAtATime(w *exitWatch, after map[string]placement) {
	c.t.Helper()
	type window struct {
		name     string
		from, to float64
	}
	var windows []window
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, exit := range w.exits {
		start, err := startedAt(after[name].PID)
		if err != nil {
			c.t.Errorf("%s: %v", name, err)
			continue
		}
		windows = append(windows, window{name, exit, start})
	}
	slices.SortFunc(windows, func(a, b window) int { return cmp.Compare(a.from, b.from) })
	for i, a := range windows {
		c.t.Logf("%s down from %.3f to %.3f s (%.0f ms)", a.name, a.from, a.to, 1000*(a.to-a.from))
		for _, b := range windows[i+1:] {
			// Start times are counted in clock ticks: a window may end up
			// to one tick after the start time read.
			if b.from < a.to+1.0/clockTicks {
				c.t.Errorf("%s was down (%.3f to %.3f s) while %s was (%.3f to %.3f s)", a.name, a.from, a.to, b.name, b.from, b.to)
			}
		}
	}
}
