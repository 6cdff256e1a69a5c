package fbsdsim

import (
	"slices"
	"testing"
)

// TestRouteConnectedLongestPrefix: a route's gateway is reached through
// the interface with the most specific connected prefix holding it, and
// lo0's 127.0.0.1/8 is only a host route to 127.0.0.1 (sys/netinet/in.c
// in_ifinit: IFF_LOOPBACK adds RTF_HOST). So with em0 on 127.0.1.1/24, a
// route via 127.0.1.2 goes out em0, and 127.9.9.9 is unreachable, where
// the simulator used to take the first interface whose network held the
// gateway: lo0 for all of 127/8.
func TestRouteConnectedLongestPrefix(t *testing.T) {
	s := New(t.TempDir(), Options{HostIfaces: []HostIface{
		{Name: "em0", Addrs: []Addr{{IP: "127.0.1.1", Prefix: 24}}},
		{Name: "em1", Addrs: []Addr{{IP: "10.0.0.10", Prefix: 8}}},
		{Name: "em2", Addrs: []Addr{{IP: "10.1.0.10", Prefix: 16}}},
	}})
	must(t, s, "route", "add", "-net", "10.200.2.0/24", "127.0.1.2")
	must(t, s, "route", "add", "-net", "10.200.3.0/24", "10.1.5.5")
	must(t, s, "route", "add", "-net", "10.200.4.0/24", "10.2.5.5")
	want := []Route{
		{Dest: "10.200.2.0/24", Gateway: "127.0.1.2", Iface: "em0"},
		{Dest: "10.200.3.0/24", Gateway: "10.1.5.5", Iface: "em2"},
		{Dest: "10.200.4.0/24", Gateway: "10.2.5.5", Iface: "em1"},
	}
	if got := s.State().Routes; !slices.Equal(got, want) {
		t.Errorf("routes %+v, want %+v", got, want)
	}
	res := run(t, s, "route", "add", "-net", "10.200.5.0/24", "127.9.9.9")
	if res.Code != 1 || string(res.Stderr) != "route: message indicates error: Network is unreachable\n" {
		t.Errorf("a gateway only lo0's /8 holds: exit %d, stderr %q; want Network is unreachable", res.Code, res.Stderr)
	}
}
