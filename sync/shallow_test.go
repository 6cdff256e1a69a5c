package sync_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// shallowLines returns the lines of a bare mirror's shallow list.
func shallowLines(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "shallow"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// TestShallowListHoldsOnlyTheBranchBoundary: a depth-1 fetch makes the
// server call every commit it sends shallow, and go-git added every report
// commit to the mirror's shallow list and sent the whole list with every
// fetch (9,091 lines, a 489 KB request after 60 fetches at 150 nodes,
// issue 12). Report commits have no parents: the list keeps only the
// branch's boundary, through report changes and force pushes of the
// branch, and a mirror with FullHistory keeps none.
func TestShallowListHoldsOnlyTheBranchBoundary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bare, work := server(t)
	// A second commit, so that the depth-1 tip has a parent to cut.
	if err := os.WriteFile(filepath.Join(work, "x.yaml"), []byte("x: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, work, "", "add", "-A")
	git(t, work, "", "commit", "-q", "-m", "c2")
	git(t, work, "", "push", "-q", "server", "main")
	prefix := render.DefaultReportRefPrefix
	pub, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "publisher"), sync.Remote{URL: "file://" + bare}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	shallowDir := filepath.Join(t.TempDir(), "shallow")
	fullDir := filepath.Join(t.TempDir(), "full")
	shallow, err := sync.OpenMirror(ctx, shallowDir, sync.Remote{URL: "file://" + bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	full, err := sync.OpenMirror(ctx, fullDir, sync.Remote{URL: "file://" + bare, Branch: "main", FullHistory: true}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	check := func(step string, m *sync.Mirror, dir string, lines int) {
		t.Helper()
		refs, err := m.Fetch(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if want := git(t, work, "", "rev-parse", "HEAD"); refs.Tip.String() != want {
			t.Fatalf("%s: tip %s, want %s", step, refs.Tip, want)
		}
		c, err := m.Commit(refs.Tip)
		if err != nil {
			t.Fatalf("%s: tip unreadable: %v", step, err)
		}
		if _, err := m.CommitFS(c); err != nil {
			t.Fatalf("%s: tree unreadable: %v", step, err)
		}
		reports, problems, err := m.Reports(nil)
		if err != nil || len(problems) > 0 || len(reports) != 5 {
			t.Fatalf("%s: %d reports, problems %v, %v", step, len(reports), problems, err)
		}
		if got := shallowLines(t, dir); len(got) > lines {
			t.Fatalf("%s: the shallow list has %d lines, want at most %d", step, len(got), lines)
		}
	}
	for round := range 6 {
		for n := range 5 {
			node := fmt.Sprintf("n%d", n)
			when := base.Add(time.Duration(round*10+n) * time.Second)
			r := report.Report{Node: node, Time: when, AgentVersion: "test"}
			if _, err := pub.Publish(ctx, node, r.Marshal(), when); err != nil {
				t.Fatal(err)
			}
		}
		check(fmt.Sprintf("round %d", round), shallow, shallowDir, 1)
		check(fmt.Sprintf("round %d, full history", round), full, fullDir, 0)
	}
	// The branch force-pushed: the new tip is fetched and readable, and
	// the list holds at most the old boundary and the new one.
	git(t, work, "", "commit", "-q", "--amend", "-m", "rewritten")
	git(t, work, "", "push", "-q", "-f", "server", "main")
	check("force push", shallow, shallowDir, 2)
	check("force push, full history", full, fullDir, 0)
	if err := shallow.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	check("compacted", shallow, shallowDir, 1)
}
