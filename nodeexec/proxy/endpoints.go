package proxy

import (
	"net/netip"
	"sync/atomic"
)

// endpoint is one backend address and its passive health.
type endpoint struct {
	addr netip.AddrPort
	// downUntil is the Manager clock reading until which round-robin
	// skips the endpoint; 0 when healthy.
	downUntil atomic.Int64
}

func (e *endpoint) healthy(now int64) bool { return e.downUntil.Load() <= now }

// markDown skips the endpoint until now+d and reports whether it was
// healthy before, so that only the change is logged.
func (e *endpoint) markDown(now, d int64) bool {
	return e.downUntil.Swap(now+d) <= now
}

func (e *endpoint) markUp() {
	if e.downUntil.Load() != 0 {
		e.downUntil.Store(0)
	}
}

// endpointSet is an immutable list of endpoints, replaced whole on Set.
type endpointSet struct {
	eps []*endpoint
}

// newEndpointSet builds the set for addrs, reusing the endpoints of old that
// are still listed so that their health carries over a hot swap.
func newEndpointSet(addrs []netip.AddrPort, old *endpointSet) *endpointSet {
	prev := map[netip.AddrPort]*endpoint{}
	if old != nil {
		for _, e := range old.eps {
			prev[e.addr] = e
		}
	}
	set := &endpointSet{eps: make([]*endpoint, len(addrs))}
	for i, a := range addrs {
		e, ok := prev[a]
		if !ok {
			e = &endpoint{addr: a}
			prev[a] = e // a duplicate address shares its health
		}
		set.eps[i] = e
	}
	return set
}

// pick returns the index of the first healthy endpoint at or after
// position n of the round-robin; if none is healthy, the one at n all the
// same: skipping every endpoint would turn a blip into an outage.
// The set must not be empty.
func (s *endpointSet) pick(n uint64, now int64) int {
	l := uint64(len(s.eps))
	for k := range l {
		if i := int((n + k) % l); s.eps[i].healthy(now) {
			return i
		}
	}
	return int(n % l)
}

// after returns the index of the first healthy endpoint after i, else the
// one right after i: the endpoint for the one retry.
func (s *endpointSet) after(i int, now int64) int {
	return s.pick(uint64(i)+1, now)
}
