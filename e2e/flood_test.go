//go:build linux

package e2e

import (
	"context"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestMetricsPortFlood holds more idle keep-alive connections to an
// agent's metrics port than the agent has file descriptors (issue 8, item
// 10). The agent keeps reconciling (a killed instance is restarted) and
// fetching (a push is applied) meanwhile: its listeners hold at most their
// connection limits, and the rest wait in the kernel's queue.
func TestMetricsPortFlood(t *testing.T) {
	t.Parallel()
	// The agent's descriptor limit: enough for its default limits (an
	// agent refuses limits that do not fit) and far below the flood.
	const fdLimit = 5000
	const flood = 7000
	c := newCluster(t, 5*time.Minute, localcluster.Options{
		Nodes:   []string{"n1"},
		FDLimit: fdLimit,
		Files:   map[string]string{"apps/web.yaml": webService(1, "base/demo", "hello")},
	})
	c.converge("first commit")
	addr, err := c.MetricsAddr(c.ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}

	// The flood: connections that each send a request and then stay open
	// and silent, never reading. Dials are tried until flood are open or a
	// deadline: with the limit, most wait in (or are refused by) the
	// kernel's accept queue.
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	floodCtx, stop := context.WithTimeout(c.ctx, 45*time.Second)
	defer stop()
	var wg sync.WaitGroup
	attempts := make(chan struct{}, flood)
	for range flood {
		attempts <- struct{}{}
	}
	close(attempts)
	for range 400 {
		wg.Go(func() {
			d := net.Dialer{Timeout: 2 * time.Second}
			for range attempts {
				if floodCtx.Err() != nil {
					return
				}
				conn, err := d.DialContext(floodCtx, "tcp", addr)
				if err != nil {
					continue
				}
				conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
				if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: keel\r\n\r\n")); err != nil {
					conn.Close()
					continue
				}
				mu.Lock()
				conns = append(conns, conn)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	mu.Lock()
	held := len(conns)
	mu.Unlock()
	t.Logf("the flood holds %d connections (the agent's descriptor limit is %d)", held, fdLimit)

	// Reconcile: a killed instance is restarted.
	var before []placement
	c.waitFor("web-0 runs as one process", func() (bool, string) {
		before = c.procsByInstance()["web-0"]
		return len(before) == 1, "web-0 runs as " + placementsString(before)
	})
	if err := syscall.Kill(before[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the killed instance runs again", func() (bool, string) {
		ps := c.procsByInstance()["web-0"]
		if len(ps) == 1 && ps[0].PID != before[0].PID {
			return true, ""
		}
		return false, "web-0 runs as " + placementsString(ps)
	})
	// Fetch: a push is applied.
	c.commit("scale web", map[string]string{"apps/web.yaml": webService(2, "base/demo", "hello")})
	c.converge("a push during the flood")
	if b, err := c.logContains("n1", "too many open files"); b {
		t.Errorf("the agent ran out of file descriptors: %s", err)
	}
}

func placementsString(ps []placement) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, p.Node+":"+itoa(p.PID))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// TestHarnessNoticesADeadAgent: a wait fails as soon as an agent that was
// not stopped exits, with the end of its log, instead of at its deadline.
func TestHarnessNoticesADeadAgent(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 5*time.Minute, localcluster.Options{Nodes: []string{"n1"},
		Files: map[string]string{"apps/web.yaml": webService(1, "base/demo", "hello")}})
	c.converge("first commit")
	if err := syscall.Kill(c.agentPID("n1"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := c.WaitFor(c.ctx, func() (bool, string) { return false, "never" })
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "agent n1 exited unexpectedly") {
		t.Fatalf("the wait ended with %v, want the agent's exit", err)
	}
	if took > time.Minute {
		t.Errorf("the wait noticed the dead agent after %s", took)
	}
	if err := c.Exited(c.ctx, "n1"); err != nil { // expected now: no failure at teardown
		t.Fatal(err)
	}
}
