package gossip

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRing runs N real rings in this process on 127.0.0.1 (memberlist's
// LAN defaults, AES-256 keys) and reports, per member, the CPU the rings
// use in steady state (all of this process's CPU over a minute, divided by
// N: an upper bound, since the Go runtime's own work is in it), how long a
// killed member takes to be found dead by every other, and how long a
// report version takes to reach every member.
//
//	go test -run '^$' -bench Ring -benchtime 1x ./gossip
func BenchmarkRing(b *testing.B) {
	for _, n := range []int{10, 50, 150, 300} {
		b.Run(fmt.Sprintf("%d", n), func(b *testing.B) {
			for range b.N {
				benchRing(b, n)
			}
		})
	}
}

func benchRing(b *testing.B, n int) {
	names := make([]string, n)
	peers := map[string]netip.AddrPort{}
	rings := make([]*Ring, n)
	for i := range n {
		names[i] = fmt.Sprintf("n%d", i)
		// A port found free may be taken before the ring binds it (other
		// tests, the rings started before): try another.
		var err error
		for range 20 {
			port := freePortB(b)
			if rings[i], err = Start(Config{Node: names[i], Addr: loopback, Port: port, Keys: [][]byte{key(1)}, Cluster: "bench"}); err == nil {
				peers[names[i]] = netip.AddrPortFrom(loopback, uint16(port))
				break
			}
		}
		if err != nil {
			b.Fatalf("start %s: %v", names[i], err)
		}
		defer rings[i].Stop()
	}
	for _, r := range rings {
		r.SetPeers(peers)
	}
	allAlive := func(r *Ring, want int) bool {
		alive := 0
		for _, m := range r.View().Members {
			if m.Alive {
				alive++
			}
		}
		return alive == want
	}
	waitAll := func(what string, limit time.Duration, cond func(*Ring) bool, skip int) time.Duration {
		start := time.Now()
		for {
			done := true
			for i, r := range rings {
				if i != skip && !cond(r) {
					done = false
					break
				}
			}
			if done {
				return time.Since(start)
			}
			if time.Since(start) > limit {
				b.Fatalf("%d members: %s not within %s", n, what, limit)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	converged := waitAll("every member sees every other alive", 2*time.Minute, func(r *Ring) bool { return allAlive(r, n) }, -1)

	// Steady state: one minute of probes, gossip and push-pulls.
	const window = time.Minute
	before := cpuTime()
	time.Sleep(window)
	cpu := cpuTime() - before

	// A report version announced by one member reaches all.
	digest := strings.Repeat("ab", 16)
	rings[0].SetReport(digest)
	spread := waitAll("a report version reaches every member", time.Minute, func(r *Ring) bool {
		return r.View().Members[names[0]].Meta.Report == digest
	}, -1)

	// A member that vanishes is found dead by every other.
	last := n - 1
	rings[last].closed.Do(func() { _ = rings[last].halt() })
	detect := waitAll("every member finds the killed one dead", 2*time.Minute, func(r *Ring) bool {
		m, ok := r.View().Members[names[last]]
		return ok && !m.Alive
	}, last)

	b.ReportMetric(float64(cpu.Milliseconds())/float64(n)/window.Minutes(), "cpu-ms/member/min")
	b.ReportMetric(converged.Seconds(), "s-to-converge")
	b.ReportMetric(spread.Seconds(), "s-to-spread")
	b.ReportMetric(detect.Seconds(), "s-to-detect")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func freePortB(b *testing.B) int { return freePortTB(b) }
