package sync_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// server makes a bare repository with one commit on main, and a work tree to
// push more commits from.
func server(t *testing.T) (bare, work string) {
	t.Helper()
	work = commitTree(t, map[string]string{"cluster.yaml": "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n"})
	bare = filepath.Join(t.TempDir(), "cluster.git")
	git(t, work, "", "clone", "-q", "--bare", work, bare)
	git(t, work, "", "remote", "add", "server", bare)
	return bare, work
}

func TestMirrorFetchPublishAndForcePush(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bare, work := server(t)
	prefix := render.DefaultReportRefPrefix
	m1, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: "file://" + bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := m1.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := git(t, work, "", "rev-parse", "HEAD")
	if refs.Tip.String() != first {
		t.Fatalf("tip %s, want %s", refs.Tip, first)
	}
	c, err := m1.Commit(refs.Tip)
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "last-good")
	if err := m1.Snapshot(c, snap); err != nil {
		t.Fatal(err)
	}
	if got, _ := sync.SnapshotCommit(snap); got != first {
		t.Errorf("snapshot commit %q", got)
	}
	if _, err := os.Stat(filepath.Join(snap, "cluster.yaml")); err != nil {
		t.Errorf("snapshot lacks cluster.yaml: %v", err)
	}

	// A report published by one mirror is read by another.
	r := report.Report{Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC), AgentVersion: "test"}
	if _, err := m1.Publish(ctx, "n1", r.Marshal(), r.Time); err != nil {
		t.Fatal(err)
	}
	r.AgentVersion = "test2"
	if _, err := m1.Publish(ctx, "n1", r.Marshal(), r.Time); err != nil {
		t.Fatal("a second (force) push failed:", err)
	}
	m2, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	refs2, err := m2.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := refs2.Reports["n1"]; !ok {
		t.Fatalf("second mirror sees no report of n1: %v", refs2.Reports)
	}
	reports, problems, err := m2.Reports(nil)
	if err != nil || len(problems) > 0 || len(reports) != 1 || reports[0].AgentVersion != "test2" {
		t.Fatalf("reports %v problems %v err %v", reports, problems, err)
	}
	if n := strings.Count(git(t, bare, "", "rev-list", "--count", prefix+"n1"), "\n"); n != 0 {
		t.Errorf("report ref has history")
	}

	// A force-pushed branch is followed.
	git(t, work, "", "commit", "-q", "--amend", "-m", "rewritten")
	git(t, work, "", "push", "-q", "-f", "server", "main")
	rewritten := git(t, work, "", "rev-parse", "HEAD")
	refs3, err := m1.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if refs3.Tip.String() != rewritten {
		t.Fatalf("after a force push the tip is %s, want %s", refs3.Tip, rewritten)
	}
	// Unchanged refs compare equal; compaction keeps them.
	again, err := m1.Fetch(ctx)
	if err != nil || !again.Equal(refs3) {
		t.Fatalf("a no-op fetch changed refs: %v %v", again, err)
	}
	if err := m1.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := m1.Refs()
	if err != nil || after.Tip != refs3.Tip {
		t.Fatalf("compaction lost the tip: %v %v", after, err)
	}
}

func TestURLsWithCredentialsAreRefused(t *testing.T) {
	for _, u := range []string{"https://user:pw@example.com/c.git", "https://token@example.com/c.git"} {
		if err := sync.CheckURL(u); err == nil {
			t.Errorf("%s accepted", u)
		}
	}
	for _, u := range []string{"ssh://git@example.com/c.git", "git@example.com:c.git", "/srv/c.git", "file:///srv/c.git"} {
		if err := sync.CheckURL(u); err != nil {
			t.Errorf("%s refused: %v", u, err)
		}
	}
	if got := sync.Redacted("https://user:pw@example.com/c.git"); strings.Contains(got, "pw") {
		t.Errorf("Redacted kept the password: %s", got)
	}
}

// TestFetchRewritesOnlyChangedRefs: a fetch updates the refs that moved and
// deletes those gone from the remote, and leaves every other ref file as it
// was. (go-git's Prune reverses a forced refspec "+src:dst" into
// "dst:+src", finds none of the local refs on the remote under that name,
// and deletes them all before writing them again: files deleted and
// created at every fetch, on the path of every step of a rollout.)
func TestFetchRewritesOnlyChangedRefs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bare, _ := server(t)
	prefix := render.DefaultReportRefPrefix
	pub, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "publish"), sync.Remote{URL: bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	publish := func(node string, when time.Time) {
		t.Helper()
		r := report.Report{Node: node, Time: when, AgentVersion: "test"}
		if _, err := pub.Publish(ctx, node, r.Marshal(), r.Time); err != nil {
			t.Fatal(err)
		}
	}
	publish("n1", at)
	publish("n2", at)
	dir := filepath.Join(t.TempDir(), "repo")
	m, err := sync.OpenMirror(ctx, dir, sync.Remote{URL: bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() sync.Refs {
		t.Helper()
		refs, err := m.Fetch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return refs
	}
	inode := func(ref string) uint64 {
		t.Helper()
		info, err := os.Stat(filepath.Join(dir, filepath.FromSlash(ref)))
		if err != nil {
			t.Fatalf("ref %s: %v", ref, err)
		}
		return info.Sys().(*syscall.Stat_t).Ino
	}
	fetch()
	branch := inode("refs/heads/main")

	// n1 publishes again and n2's ref goes: only those two change.
	publish("n1", at.Add(time.Second))
	git(t, bare, "", "update-ref", "-d", prefix+"n2")
	refs := fetch()
	if want := git(t, bare, "", "rev-parse", prefix+"n1"); refs.Reports["n1"].String() != want {
		t.Errorf("n1's report ref at %s, want %s (its new publication)", refs.Reports["n1"], want)
	}
	if _, ok := refs.Reports["n2"]; ok {
		t.Errorf("n2's report ref, deleted on the remote, is still listed")
	}
	if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(prefix+"n2"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("n2's report ref, deleted on the remote, is still in the mirror: %v", err)
	}
	if got := inode("refs/heads/main"); got != branch {
		t.Errorf("the branch, unchanged, was written anew (inode %d, was %d)", got, branch)
	}

	// A fetch that brings nothing writes no ref.
	n1 := inode(prefix + "n1")
	if again := fetch(); !again.Equal(refs) {
		t.Fatalf("a no-op fetch changed refs: %v, was %v", again, refs)
	}
	if inode(prefix+"n1") != n1 || inode("refs/heads/main") != branch {
		t.Errorf("a fetch that brought nothing wrote refs anew")
	}
}
