package roundrobin

import (
	"net/netip"
	"testing"
)

func TestPick(t *testing.T) {
	addrs := []netip.AddrPort{
		netip.MustParseAddrPort("127.0.0.1:1"),
		netip.MustParseAddrPort("127.0.0.1:2"),
		netip.MustParseAddrPort("127.0.0.1:3"),
	}
	const now = 100
	tests := []struct {
		name string
		down []int // indexes marked unhealthy until after now
		n    uint64
		want int
	}{
		{"healthy: the counter's turn", nil, 4, 1},
		{"skips a marked endpoint", []int{1}, 4, 2},
		{"wraps around", []int{2}, 2, 0},
		{"all marked: the counter's turn anyway", []int{0, 1, 2}, 5, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set := NewSet(addrs, nil)
			for _, i := range tt.down {
				set.Endpoints[i].MarkDown(now, 1)
			}
			if got := set.Pick(tt.n, now); got != tt.want {
				t.Errorf("pick(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}

	t.Run("health survives a swap", func(t *testing.T) {
		old := NewSet(addrs, nil)
		old.Endpoints[1].MarkDown(now, 1)
		swapped := NewSet([]netip.AddrPort{addrs[1], addrs[2]}, old)
		if swapped.Endpoints[0].Healthy(now) {
			t.Error("a marked endpoint became healthy by a swap")
		}
	})
}
