//go:build linux

package e2e

import (
	gosync "sync"
	"time"
)

// reportAges follows the reports published in the served repository and
// bounds, for each node, how old the newest of its reports there was at
// any moment since the last reset. An agent judges a peer dead, and takes
// its stateless replicas (for good: planner.SettlePeriod), when the
// newest report of the peer that its last fetch found is more than
// livenessTTL older than its own (planner.readNodes, the plan being dated
// by when that fetch began). TestMain scales the TTL by the contention it
// measures at start, up to maxSlowdown: on a machine loaded beyond that,
// or more loaded later, an agent that is stopped, restarting or starved
// may go longer than the TTL without a report, and a replica of its then
// moves legitimately. The bound tells such a move from a bug: a node
// whose bound stayed within the TTL was alive to every peer throughout.
//
// The bound is sound however rarely the watch samples: between two
// samples the newest report is at least the one the first sample found,
// so its age is at most the second sample's time minus that report's
// time. A late sample only makes the bound larger.
type reportAges struct {
	mu     gosync.Mutex
	newest map[string]time.Time     // each node's newest report time seen
	bound  map[string]time.Duration // since the reset
	stop   chan struct{}
	done   chan struct{}
}

// watchReportAges starts following the published reports until the test
// ends.
func (c *cluster) watchReportAges() *reportAges {
	w := &reportAges{newest: map[string]time.Time{}, bound: map[string]time.Duration{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			// Unreadable while git writes a ref: the next sample counts
			// the time since the last one that read.
			if pub, err := c.published(); err == nil {
				now := time.Now() // after the read
				w.mu.Lock()
				for node, r := range pub {
					prev, ok := w.newest[node]
					if !ok || r.Time.After(prev) {
						w.newest[node] = r.Time
					}
					if !ok {
						prev = r.Time
					}
					w.bound[node] = max(w.bound[node], now.Sub(prev))
				}
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-c.ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	c.t.Cleanup(func() {
		close(w.stop)
		<-w.done
	})
	return w
}

// reset starts new bounds: each node's is then the age of its newest
// report as of now, growing from there.
func (w *reportAges) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for node, t := range w.newest {
		w.bound[node] = now.Sub(t)
	}
}

// maxAge is the bound for node since the last reset: how old its newest
// published report may have been at worst.
func (w *reportAges) maxAge(node string) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return max(w.bound[node], time.Since(w.newest[node]))
}

// maxAgeOthers is the largest bound of nodes other than node.
func (w *reportAges) maxAgeOthers(nodes []string, node string) time.Duration {
	var d time.Duration
	for _, n := range nodes {
		if n != node {
			d = max(d, w.maxAge(n))
		}
	}
	return d
}

// mayLookDead reports whether a report age bound (maxAge) means that a
// peer may have judged the node dead, in a cluster whose liveness TTL is
// ttl: with a second of slack for what the bound does not model (the
// clocks' and the reports' rounding).
func mayLookDead(age, ttl time.Duration) bool { return age > ttl-time.Second }
