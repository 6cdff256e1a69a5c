package status_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"testing"

	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
	"github.com/keel-dev/keel/sync"
)

// fixtureRepo makes a git repository holding the fixture cluster on main
// and returns its file:// URL.
func fixtureRepo(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@example.test", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@example.test")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "-b", "main")
	for name, f := range statustest.Specs {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("add", "-A")
	git("commit", "-q", "-m", "fixture")
	return "file://" + src
}

// TestSharedCacheDir: keel status runs (and a dashboard) that share a
// cache directory, started together on a new one, each read the cluster:
// none meets the mirror half made by another ("repository already exists",
// "remote not found").
func TestSharedCacheDir(t *testing.T) {
	url := fixtureRepo(t)
	for round := range 8 {
		dir := status.CacheDir(t.TempDir(), url, "main")
		var wg gosync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				snap, err := status.FetchRead(context.Background(), dir, sync.Remote{URL: url, Branch: "main"}, "main")
				if err == nil && snap.Tree.Model.Cluster.Name != "fixture" {
					t.Errorf("read cluster %q", snap.Tree.Model.Cluster.Name)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d, reader %d: %v", round, i, err)
			}
		}
	}
}

// TestCacheMirrorCompacts: a cache mirror grown past its bound (each
// report published is a new commit, kept in the packs after the next
// replaces it) is replaced by a fresh clone at the next read.
func TestCacheMirrorCompacts(t *testing.T) {
	url := fixtureRepo(t)
	dir := status.CacheDir(t.TempDir(), url, "main")
	remote := sync.Remote{URL: url, Branch: "main"}
	if _, err := status.FetchRead(context.Background(), dir, remote, "main"); err != nil {
		t.Fatal(err)
	}
	// Garbage that counts as the mirror's size (a sparse file: no disk).
	junk := filepath.Join(dir, "objects", "pack", "grown")
	f, err := os.Create(junk)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(sync.MinCompactSize + 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	snap, err := status.FetchRead(context.Background(), dir, remote, "main")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(junk); err == nil {
		t.Errorf("the mirror past its bound was not compacted")
	}
	if snap.Tree.Model.Cluster.Name != "fixture" || !strings.HasPrefix(snap.Tip.Subject, "fixture") {
		t.Errorf("after compaction: %+v", snap.Tip)
	}
}
