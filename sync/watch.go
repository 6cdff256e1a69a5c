package sync

import (
	"context"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// LocalPath returns the directory of a repository URL that names one on
// this machine (a path or file://), and false for network URLs.
func LocalPath(raw string) (string, bool) {
	if strings.HasPrefix(raw, "file://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "", false
		}
		return u.Path, true
	}
	if strings.Contains(raw, "://") || (strings.Contains(raw, ":") && !strings.HasPrefix(raw, "/") && !strings.HasPrefix(raw, ".")) {
		return "", false
	}
	return raw, true
}

// Watch calls trigger whenever a ref of the local repository at dir may
// have moved (a push to it, a report published), until ctx ends, except
// for the refs ignore names (such as "refs/keel/reports/n1", the node's
// own report: its push need not make it fetch); ignore may be nil. It
// watches the directories git updates refs in; new ones are added as they
// appear. Bursts of events are the caller's to coalesce (trigger should not
// block).
func Watch(ctx context.Context, dir string, logger *slog.Logger, ignore func(ref string) bool, trigger func()) error {
	gitDir := dir
	if st, err := os.Stat(filepath.Join(dir, ".git")); err == nil && st.IsDir() {
		gitDir = filepath.Join(dir, ".git")
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	refs := filepath.Join(gitDir, "refs")
	add := func(path string) {
		if err := w.Add(path); err != nil {
			logger.Debug("cannot watch", "path", path, "err", err)
		}
	}
	add(gitDir) // packed-refs, HEAD
	// addTree watches dir and every directory under it. A new directory is
	// walked too: git makes refs/keel/reports/ in one go, before the watch
	// on refs/keel/ can see reports/ appear.
	addTree := func(dir string) {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				add(p)
			}
			return nil
		})
	}
	addTree(refs)
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Has(fsnotify.Create) && strings.HasPrefix(ev.Name, refs) {
					if st, err := os.Stat(ev.Name); err == nil && st.IsDir() {
						addTree(ev.Name)
					}
				}
				if strings.HasSuffix(ev.Name, ".lock") && !ev.Has(fsnotify.Rename) && !ev.Has(fsnotify.Remove) {
					continue // git is still writing; the rename that follows counts
				}
				if rel, err := filepath.Rel(gitDir, strings.TrimSuffix(ev.Name, ".lock")); err == nil && ignore != nil && ignore(filepath.ToSlash(rel)) {
					continue
				}
				trigger()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				logger.Warn("watching the repository", "err", err)
			}
		}
	}()
	return nil
}
