package sync_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// TestMirrorEmptyRefs: go-git writes a ref by truncating its file and then
// writing the hash, so an agent killed in between leaves an empty ref. The
// mirror, reopened, must fetch again rather than fail for good.
func TestMirrorEmptyRefs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bare, work := server(t)
	prefix := render.DefaultReportRefPrefix
	dir := filepath.Join(t.TempDir(), "repo")
	remote := sync.Remote{URL: "file://" + bare, Branch: "main"}
	m, err := sync.OpenMirror(ctx, dir, remote, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	r := report.Report{Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC), AgentVersion: "test"}
	if _, err := m.Publish(ctx, "n1", r.Marshal(), r.Time); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"refs/heads/main", prefix + "n1"} {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(ref)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	m, err = sync.OpenMirror(ctx, dir, remote, prefix)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := m.Fetch(ctx)
	if err != nil {
		t.Fatalf("fetch with refs left empty by a crash: %v", err)
	}
	if tip := git(t, work, "", "rev-parse", "HEAD"); refs.Tip.String() != tip {
		t.Errorf("tip %s, want %s", refs.Tip, tip)
	}
	if _, ok := refs.Reports["n1"]; !ok {
		t.Errorf("the report of n1 was not fetched again: %v", refs.Reports)
	}
}

// TestReadReportsSkipsLockFiles: while git updates a ref, it writes the new
// value in <ref>.lock, which go-git lists as a ref of its own; a reader of a
// repository git is writing to must not take it for a node's report.
func TestReadReportsSkipsLockFiles(t *testing.T) {
	dir := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
	r := report.Report{Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
	blob := git(t, dir, string(r.Marshal()), "hash-object", "-w", "--stdin")
	tree := git(t, dir, "100644 blob "+blob+"\treport.yaml\n", "mktree")
	commit := git(t, dir, "", "commit-tree", tree, "-m", "report")
	git(t, dir, "", "update-ref", "refs/keel/reports/n1", commit)
	lock := filepath.Join(dir, ".git", "refs", "keel", "reports", "n1.lock")
	if err := os.WriteFile(lock, []byte(commit+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	repo, err := sync.OpenRepo(dir)
	if err != nil {
		t.Fatal(err)
	}
	reports, problems, err := sync.ReadReports(repo, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 1 || reports[0].Node != "n1" || len(problems) != 0 {
		t.Errorf("reports %v, problems %q; want the report of n1 alone", reports, problems)
	}
}
