package planner_test

import (
	"fmt"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

var benchNow = time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)

// benchCluster renders a cluster of nodes nodes and services Services of
// replicas replicas each, sized so that everything fits.
func benchCluster(b *testing.B, nodes, services, replicas int) *render.Model {
	b.Helper()
	fsys := fstest.MapFS{
		"cluster.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: bench}\nspec: {podCIDR: 10.0.0.0/12, serviceCIDR: 10.16.0.0/16, maxInstances: 100000}\n")},
	}
	for i := range nodes {
		fsys[fmt.Sprintf("nodes/n%04d.yaml", i)] = &fstest.MapFile{Data: fmt.Appendf(nil,
			"apiVersion: keel/v1\nkind: Node\nmetadata: {name: n%04d, labels: {zone: z%d}}\nspec: {address: 192.0.%d.%d, capacity: {cpu: \"64\", memory: 256G}}\n",
			i, i%3, 2+i/250, 1+i%250)}
	}
	for i := range services {
		fsys[fmt.Sprintf("apps/s%04d.yaml", i)] = &fstest.MapFile{Data: fmt.Appendf(nil,
			"apiVersion: keel/v1\nkind: Service\nmetadata: {name: s%04d}\nspec:\n  replicas: %d\n  port: 8080\n  template:\n    image: base/app\n    command: [/app, --id, \"%d\"]\n    resources: {cpu: 100m, memory: 64M}\n",
			i, replicas, i)}
	}
	m, err := render.Render(fsys)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// reportsOf returns the reports of a cluster that runs exactly plan.
func reportsOf(m *render.Model, plan *planner.Plan) []report.Report {
	byNode := map[string]*report.Report{}
	var out []report.Report
	for _, n := range m.Nodes {
		byNode[n.Name] = &report.Report{Node: n.Name, Time: benchNow, Capacity: report.Capacity{CPU: 64000, Memory: 256 << 30}}
	}
	for _, pl := range plan.Placements {
		r := byNode[pl.Node]
		r.Instances = append(r.Instances, report.Instance{Name: pl.Instance, State: report.StateRunning, Address: pl.Address, SpecHash: m.Instance(pl.Instance).SpecHash})
	}
	for _, n := range m.Nodes {
		out = append(out, *byNode[n.Name])
	}
	return out
}

func aliveReports(m *render.Model) []report.Report {
	var out []report.Report
	for _, n := range m.Nodes {
		out = append(out, report.Report{Node: n.Name, Time: benchNow, Capacity: report.Capacity{CPU: 64000, Memory: 256 << 30}})
	}
	return out
}

func benchmarkCold(b *testing.B, nodes, services, replicas int) {
	m := benchCluster(b, nodes, services, replicas)
	in := planner.Input{Model: m, Reports: aliveReports(m), Now: benchNow}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p := planner.Compute(in)
		if len(p.Unschedulable) > 0 {
			b.Fatalf("%d unschedulable: %s", len(p.Unschedulable), p.Unschedulable[0].Reason)
		}
	}
	b.ReportMetric(float64(len(m.Instances)), "instances")
}

func benchmarkWarm(b *testing.B, nodes, services, replicas int) {
	m := benchCluster(b, nodes, services, replicas)
	cold := planner.Compute(planner.Input{Model: m, Reports: aliveReports(m), Now: benchNow})
	in := planner.Input{Model: m, Reports: reportsOf(m, cold), Now: benchNow}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p := planner.Compute(in)
		if p.PlanID != cold.PlanID {
			b.Fatal("a warm re-plan moved something")
		}
	}
	b.ReportMetric(float64(len(m.Instances)), "instances")
}

// Cold placement: every node alive, nothing running yet.
func BenchmarkColdPlacement20kOn256(b *testing.B)   { benchmarkCold(b, 256, 200, 100) }
func BenchmarkColdPlacement100kOn1000(b *testing.B) { benchmarkCold(b, 1000, 1000, 100) }

// Warm re-plan: every instance reported running where it is (sticky).
func BenchmarkWarmReplan20kOn256(b *testing.B)   { benchmarkWarm(b, 256, 200, 100) }
func BenchmarkWarmReplan100kOn1000(b *testing.B) { benchmarkWarm(b, 1000, 1000, 100) }
