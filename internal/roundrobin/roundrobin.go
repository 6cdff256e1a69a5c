// Package roundrobin is the endpoint choice shared by the service proxies
// and the ingress: round-robin over a list of backend addresses that skips
// the ones whose last connection attempt failed (passive health), with the
// health of an address carried over when the list is swapped.
//
// Time is a caller's monotonic clock reading in nanoseconds, so that tests
// drive it; the package reads no clock.
package roundrobin

import (
	"net/netip"
	"sync/atomic"
)

// Endpoint is one backend address and its passive health. Its methods are
// safe for concurrent use.
type Endpoint struct {
	Addr netip.AddrPort
	// downUntil is the clock reading until which round-robin skips the
	// endpoint; 0 when healthy.
	downUntil atomic.Int64
}

// Healthy reports whether round-robin takes e at time now.
func (e *Endpoint) Healthy(now int64) bool { return e.downUntil.Load() <= now }

// MarkDown skips the endpoint until now+d and reports whether it was
// healthy before, so that only the change is logged.
func (e *Endpoint) MarkDown(now, d int64) bool {
	return e.downUntil.Swap(now+d) <= now
}

// MarkUp makes e healthy again (after a successful connection).
func (e *Endpoint) MarkUp() {
	if e.downUntil.Load() != 0 {
		e.downUntil.Store(0)
	}
}

// Set is an immutable list of endpoints, replaced whole when the list
// changes.
type Set struct {
	Endpoints []*Endpoint
}

// NewSet builds the set for addrs, reusing the endpoints of old (which may
// be nil) that are still listed, so that their health carries over a hot
// swap.
func NewSet(addrs []netip.AddrPort, old *Set) *Set {
	prev := map[netip.AddrPort]*Endpoint{}
	if old != nil {
		for _, e := range old.Endpoints {
			prev[e.Addr] = e
		}
	}
	set := &Set{Endpoints: make([]*Endpoint, len(addrs))}
	for i, a := range addrs {
		e, ok := prev[a]
		if !ok {
			e = &Endpoint{Addr: a}
			prev[a] = e // a duplicate address shares its health
		}
		set.Endpoints[i] = e
	}
	return set
}

// Pick returns the index of the first healthy endpoint at or after
// position n of the round-robin; if none is healthy, the one at n all the
// same: skipping every endpoint would turn a blip into an outage.
// The set must not be empty.
func (s *Set) Pick(n uint64, now int64) int {
	l := uint64(len(s.Endpoints))
	for k := range l {
		if i := int((n + k) % l); s.Endpoints[i].Healthy(now) {
			return i
		}
	}
	return int(n % l)
}

// After returns the index of the first healthy endpoint after i, else the
// one right after i: the endpoint for the one retry.
func (s *Set) After(i int, now int64) int {
	return s.Pick(uint64(i)+1, now)
}
