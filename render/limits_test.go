package render_test

import (
	"testing"

	"github.com/keel-dev/keel/render"
)

// TestInstanceCapIsCheckedBeforeExpansion renders the 8.6 KB spec of
// 100 Services × 10000 replicas: it is refused, and refusing it costs about
// what reading its 100 documents does, not a million instances (which took
// 32 s and 1.6 GB).
func TestInstanceCapIsCheckedBeforeExpansion(t *testing.T) {
	fsys := corpusFS(map[string]string{"apps/many.yaml": corpusServices(100, 10000)}, nil)
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := render.Render(fsys); err == nil {
			t.Fatal("Render accepted 1000000 instances")
		}
	})
	// Reading 100 small documents takes a few thousand allocations; one
	// expanded replica takes about ten.
	if allocs > 50000 {
		t.Errorf("Render made %.0f allocations to refuse 100 × 10000 replicas, want fewer than 50000", allocs)
	}
}

// BenchmarkRenderOverCap measures refusing 100 Services × 10000 replicas.
func BenchmarkRenderOverCap(b *testing.B) {
	fsys := corpusFS(map[string]string{"apps/many.yaml": corpusServices(100, 10000)}, nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := render.Render(fsys); err == nil {
			b.Fatal("Render accepted 1000000 instances")
		}
	}
}

// BenchmarkRenderLargestModel measures the largest model a cluster may
// declare: maxInstances at its limit, 10 Services × 10000 replicas.
func BenchmarkRenderLargestModel(b *testing.B) {
	fsys := corpusFS(map[string]string{
		"cluster.yaml":   corpusBase["cluster.yaml"] + "  maxInstances: 100000\n",
		"apps/many.yaml": corpusServices(10, 10000),
	}, nil)
	b.ReportAllocs()
	for b.Loop() {
		m, err := render.Render(fsys)
		if err != nil {
			b.Fatal(err)
		}
		if len(m.Instances) != 100000 {
			b.Fatalf("%d instances, want 100000", len(m.Instances))
		}
	}
}
