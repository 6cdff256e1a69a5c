package sync_test

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// TestFetchLeavesOutABomb: a report ref, or the branch, whose commit holds
// a blob that is 1 MiB on the wire and inflates to 1 GiB (a decompression
// bomb) is left out of the fetch from the pack's object headers, before
// go-git inflates it to index it (which cost 1 GiB of memory): the other
// refs are fetched around it, a refused tip is said so, and once the ref
// is fixed it is fetched again (issue 8 item 5).
func TestFetchLeavesOutABomb(t *testing.T) {
	const bombSize = 1 << 30
	remote := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
	goodTip := git(t, remote, "", "rev-parse", "HEAD")
	publish := func(ref string, entries ...string) {
		tree := git(t, remote, strings.Join(entries, "\n")+"\n", "mktree")
		commit := git(t, remote, "", "commit-tree", tree, "-m", "x")
		git(t, remote, "", "update-ref", ref, commit)
	}
	reportBlob := func(node string) string {
		r := report.Report{Node: node, Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
		return "100644 blob " + git(t, remote, string(r.Marshal()), "hash-object", "-w", "--stdin") + "\treport.yaml"
	}
	bomb := "100644 blob " + hashObject(t, remote, bombSize) + "\treport.yaml"
	publish("refs/keel/reports/n1", reportBlob("n1"))
	publish("refs/keel/reports/n2", bomb)
	publish("refs/keel/reports/n3", reportBlob("n3"))
	git(t, remote, "", "repack", "-a", "-d", "-q")

	ctx := context.Background()
	m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: remote, Branch: "main"}, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() sync.Refs {
		t.Helper()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		refs, err := m.Fetch(ctx)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("a bomb made the whole fetch fail: %v", err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > bombSize/16 {
			t.Errorf("the fetch allocated %d MiB for a %d MiB bomb", alloc>>20, bombSize>>20)
		}
		return refs
	}
	refs := fetch()
	if refs.Tip.String() != goodTip || refs.Refused != nil {
		t.Errorf("tip %s refused %v, want %s", refs.Tip, refs.Refused, goodTip)
	}
	if _, ok := refs.Reports["n2"]; ok || len(refs.Reports) != 2 {
		t.Errorf("reports %v, want n1 and n3 alone", refs.Reports)
	}
	if len(refs.Skipped) != 1 || !strings.Contains(refs.Skipped[0], "refs/keel/reports/n2") || !strings.Contains(refs.Skipped[0], "MiB") {
		t.Errorf("skipped %q, want n2's ref named with its reason", refs.Skipped)
	}
	reports, _, err := m.Reports(nil)
	if err != nil || len(reports) != 2 {
		t.Errorf("reports read: %v, %v", reports, err)
	}

	// The next fetch leaves it out at once and still sees the others move;
	// a bomb on the branch is a refused tip, the old tip staying readable.
	publish("refs/keel/reports/n3", reportBlob("n3"), "100644 blob "+git(t, remote, "more", "hash-object", "-w", "--stdin")+"\tx")
	publish("refs/heads/main", "100644 blob "+hashObject(t, remote, bombSize)+"\tcluster.yaml")
	refs = fetch()
	if refs.Tip.String() != goodTip || refs.Refused == nil || refs.Refused.Hash.String() != git(t, remote, "", "rev-parse", "main") {
		t.Errorf("tip %s refused %+v: want the old tip kept and the bomb refused", refs.Tip, refs.Refused)
	}
	if refs.Reports["n3"].String() != git(t, remote, "", "rev-parse", "refs/keel/reports/n3") {
		t.Errorf("n3's new report was not fetched around the bombs")
	}

	// Fixed refs are fetched again, and the fetch is whole again.
	publish("refs/keel/reports/n2", reportBlob("n2"))
	publish("refs/heads/main", reportBlob("main"))
	refs = fetch()
	if refs.Refused != nil || len(refs.Skipped) != 0 || len(refs.Reports) != 3 || refs.Tip.String() != git(t, remote, "", "rev-parse", "main") {
		t.Errorf("after the fix: %+v", refs)
	}
}
