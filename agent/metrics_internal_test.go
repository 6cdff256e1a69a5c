package agent

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
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

// Issue 11: what the plan cannot place, and each Service's replicas and
// ready endpoints, are metrics; a Service that leaves the model takes its
// series with it.
func TestPlanMetrics(t *testing.T) {
	a := &Agent{metrics: NewMetrics(prometheus.NewRegistry()), log: slog.New(slog.DiscardHandler)}
	m := &render.Model{Services: []render.Service{{Name: "web", Replicas: 3}, {Name: "db", Replicas: 2}}}
	plan := &planner.Plan{
		Services: []planner.Service{
			{Name: "web", Endpoints: []planner.Endpoint{{Instance: "web-0"}, {Instance: "web-1"}}},
			{Name: "db"},
		},
		Unschedulable: []planner.Unschedulable{{Instance: "web-2", Service: "web", Reason: "no node has 8 CPUs free"}},
	}
	a.updatePlanMetrics(m, plan)
	for _, c := range []struct {
		g    prometheus.Collector
		want float64
	}{
		{a.metrics.Unschedulable, 1},
		{a.metrics.ServiceReplicas.WithLabelValues("web"), 3},
		{a.metrics.ServiceEndpoints.WithLabelValues("web"), 2},
		{a.metrics.ServiceReplicas.WithLabelValues("db"), 2},
		{a.metrics.ServiceEndpoints.WithLabelValues("db"), 0},
	} {
		if got := testutil.ToFloat64(c.g); got != c.want {
			t.Errorf("got %v, want %v", got, c.want)
		}
	}
	if a.unschedulable != "web-2: no node has 8 CPUs free" {
		t.Errorf("unschedulable logged as %q", a.unschedulable)
	}
	if a.belowReplicas != "web 2/3, db 0/2" {
		t.Errorf("services below their replicas logged as %q", a.belowReplicas)
	}
	a.updatePlanMetrics(&render.Model{Services: m.Services[:1]}, &planner.Plan{Services: plan.Services[:1]})
	if n := testutil.CollectAndCount(a.metrics.ServiceReplicas); n != 1 {
		t.Errorf("%d replica series after db left, want 1", n)
	}
	if n := testutil.CollectAndCount(a.metrics.ServiceEndpoints); n != 1 {
		t.Errorf("%d endpoint series after db left, want 1", n)
	}
	if got := testutil.ToFloat64(a.metrics.Unschedulable); got != 0 {
		t.Errorf("unschedulable %v once everything is placed, want 0", got)
	}
}
