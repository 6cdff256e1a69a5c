package sync_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-dev/keel/sync"
)

// TestWatchNestedRefDirs: git makes refs/keel/reports/ in one go when the
// first report is pushed, faster than a watch on refs/keel/ can be added;
// later reports written there must still trigger.
func TestWatchNestedRefDirs(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "refs", "heads"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	triggered := make(chan struct{}, 1)
	err := sync.Watch(ctx, dir, slog.New(slog.DiscardHandler), nil, func() {
		select {
		case triggered <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-triggered:
		case <-time.After(10 * time.Second):
			t.Fatalf("no trigger after %s", what)
		}
	}
	reports := filepath.Join(dir, "refs", "keel", "reports")
	if err := os.MkdirAll(reports, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(reports, "n1"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("the first report")
	// Let the watcher take in every event of the first report, then drain.
	time.Sleep(200 * time.Millisecond)
	select {
	case <-triggered:
	default:
	}
	if err := os.WriteFile(filepath.Join(reports, "n2"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("a report written in the new directory")
}

// TestWatchIgnoresOwnRef: a ref the caller ignores (the node's own report)
// moving, through git's lock file and rename, triggers nothing; any other
// ref still does.
func TestWatchIgnoresOwnRef(t *testing.T) {
	dir := t.TempDir()
	reports := filepath.Join(dir, "refs", "keel", "reports")
	if err := os.MkdirAll(reports, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	triggered := make(chan struct{}, 16)
	own := func(ref string) bool { return ref == "refs/keel/reports/n1" }
	err := sync.Watch(ctx, dir, slog.New(slog.DiscardHandler), own, func() { triggered <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	// As git updates a ref: write ref.lock, rename it over the ref.
	update := func(node, content string) {
		t.Helper()
		lock := filepath.Join(reports, node+".lock")
		if err := os.WriteFile(lock, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(lock, filepath.Join(reports, node)); err != nil {
			t.Fatal(err)
		}
	}
	update("n1", "1\n")
	update("n1", "2\n")
	// The other node's update comes after the own ones: once its trigger
	// is seen, every event of the own ones has been taken in.
	update("n2", "1\n")
	select {
	case <-triggered:
	case <-time.After(10 * time.Second):
		t.Fatal("no trigger after another node's report moved")
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(triggered); n > 1 {
		t.Fatalf("%d more triggers after one update of another node's ref (the own ref's must trigger nothing)", n)
	}
}
