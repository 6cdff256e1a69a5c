package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// TestStatusGolden draws keel status's table and JSON for every fixture
// cluster: converged, a node dead, a node on an old commit, a refused
// commit, an unschedulable instance, a crash loop, an expiring
// certificate.
func TestStatusGolden(t *testing.T) {
	for _, name := range statustest.Names() {
		t.Run(name, func(t *testing.T) {
			snap, now := statustest.Snapshot(t, name)
			st := status.Compute(status.Input{Snapshot: snap, Now: now})
			var table, js bytes.Buffer
			if err := writeStatus(&table, st, "table", tableOptions{width: 120}); err != nil {
				t.Fatal(err)
			}
			if err := writeStatus(&js, st, "json", tableOptions{}); err != nil {
				t.Fatal(err)
			}
			goldenFile(t, "status/"+name+".txt", table.String())
			goldenFile(t, "status/"+name+".json", js.String())
			var back status.Status
			if err := json.Unmarshal(js.Bytes(), &back); err != nil {
				t.Fatalf("the JSON does not read back: %v", err)
			}
			// An expiring certificate is a warning: the deploy has converged.
			if back.Converged != (name == "converged" || name == "expiring-cert") {
				t.Errorf("converged = %v for fixture %s", back.Converged, name)
			}
			var y bytes.Buffer
			if err := writeStatus(&y, st, "yaml", tableOptions{}); err != nil || !strings.Contains(y.String(), "headline: ") {
				t.Errorf("yaml: %v\n%s", err, y.String())
			}
		})
	}
}

// TestStatusTableWidth: no line of the table is wider than asked, and
// colour codes appear only when asked for.
func TestStatusTableWidth(t *testing.T) {
	snap, now := statustest.Snapshot(t, "crashloop")
	st := status.Compute(status.Input{Snapshot: snap, Now: now})
	// widest is the widest table line: lines with column gaps, not the
	// prose (headline, counts, warnings) or the missing list.
	widest := func(out string) int {
		n := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "  ") && !strings.HasPrefix(line, "  - ") {
				n = max(n, len([]rune(line)))
			}
		}
		return n
	}
	full := widest(statusTable(st, tableOptions{width: 1000}))
	for _, w := range []int{60, 80, 100, 120} {
		out := statusTable(st, tableOptions{width: w})
		if strings.Contains(out, "\x1b[") {
			t.Fatalf("colour without asking:\n%s", out)
		}
		got := widest(out)
		// A column is cut no narrower than 12 runes: below about 80
		// columns the tables stop shrinking, but they always shrink.
		if got >= full || (w >= 100 && got > w) {
			t.Errorf("width %d: widest table line %d runes (uncut %d):\n%s", w, got, full, out)
		}
	}
	if out := statusTable(st, tableOptions{width: 120, color: true}); !strings.Contains(out, "\x1b[31m") {
		t.Errorf("no red with colour on:\n%s", out)
	}
}

// goldenFile compares got with testdata/name, or rewrites it when the
// tests run with -update (the flag cli_test defines).
func goldenFile(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if f := flag.Lookup("update"); f != nil && f.Value.String() == "true" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cli -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (run go test ./cli -update after checking the change):\n--- got\n%s", name, got)
	}
}
