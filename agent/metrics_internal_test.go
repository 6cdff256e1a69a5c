package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestInstanceMetricsPruned: the restart series of instances this node no
// longer holds are deleted, so that memory returns after a model shrinks.
func TestInstanceMetricsPruned(t *testing.T) {
	a := &Agent{metrics: NewMetrics(prometheus.NewRegistry()), restarted: map[string]int{}}
	for _, name := range []string{"web-0", "web-1", "web-2"} {
		a.metrics.InstanceRestarts.WithLabelValues(name).Add(2)
		a.restarted[name] = 2
	}
	if n := testutil.CollectAndCount(a.metrics.InstanceRestarts); n != 3 {
		t.Fatalf("%d series before, want 3", n)
	}
	a.pruneInstanceMetrics(func(name string) bool { return name == "web-1" })
	if n := testutil.CollectAndCount(a.metrics.InstanceRestarts); n != 1 {
		t.Errorf("%d restart series after web-0 and web-2 left, want 1", n)
	}
	if len(a.restarted) != 1 || a.restarted["web-1"] != 2 {
		t.Errorf("restart counts kept: %v", a.restarted)
	}
	a.pruneInstanceMetrics(func(string) bool { return false })
	if n := testutil.CollectAndCount(a.metrics.InstanceRestarts); n != 0 {
		t.Errorf("%d restart series after every instance left, want 0", n)
	}
}

func TestShrunk(t *testing.T) {
	for _, c := range []struct {
		before, after int
		want          bool
	}{{300000, 3, true}, {300000, 200000, false}, {900, 0, false}, {5000, 1000, true}, {5000, 2000, false}} {
		if got := shrunk(c.before, c.after); got != c.want {
			t.Errorf("shrunk(%d, %d) = %v, want %v", c.before, c.after, got, c.want)
		}
	}
}
