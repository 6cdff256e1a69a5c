package status

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem/dotgit"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// Repo is the git repository that holds a cluster repository: a local
// clone (the cluster repository may be a directory within its worktree),
// or a read-only mirror of a URL in a cache directory.
type Repo struct {
	Git    *git.Repository
	Root   string // the worktree's root directory ("" for a mirror)
	Subdir string // the cluster repository's directory within the worktree
	// mirror is set when the repository is a fetched URL.
	mirror *sync.Mirror
}

// OpenDir opens the git repository that holds dir.
func OpenDir(dir string) (*Repo, error) {
	repo, err := sync.OpenRepo(dir)
	if err != nil {
		// A bare repository (a server's, or the demo's cluster.git).
		bare, berr := git.PlainOpen(dir)
		if berr != nil {
			return nil, err
		}
		return &Repo{Git: bare}, nil
	}
	g := &Repo{Git: repo, Root: dir}
	if wt, err := repo.Worktree(); err == nil {
		abs, _ := filepath.Abs(dir)
		root, _ := filepath.EvalSymlinks(wt.Filesystem.Root())
		g.Root = root
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		if rel, err := filepath.Rel(root, abs); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			g.Subdir = filepath.ToSlash(rel)
		}
	}
	return g, nil
}

// IsURL reports whether s names a remote repository rather than a local
// directory: a URL with a scheme, or git's scp-like user@host:path.
func IsURL(s string) bool {
	_, local := sync.LocalPath(s)
	return !local
}

// CacheDir is where the mirror of url is kept under base: one directory
// per URL and branch, named by their hash so that nothing from the URL
// reaches a path.
func CacheDir(base, url, branch string) string {
	sum := sha256.Sum256([]byte(url + "\x00" + branch))
	return filepath.Join(base, "keel", "status", hex.EncodeToString(sum[:12]))
}

// FetchRead brings the read-only mirror of remote in dir up to date, as
// Fetch does, and takes a snapshot of branch in it, holding the cache's
// lock throughout: two keel status runs (or a dashboard) sharing one
// cache directory take turns instead of making, fetching into or
// compacting the mirror under each other.
func FetchRead(ctx context.Context, dir string, remote sync.Remote, branch string) (*Snapshot, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g, err := fetch(ctx, dir, remote)
	if err != nil {
		return nil, err
	}
	return Read(g, branch)
}

// Fetch brings the read-only mirror of remote in dir up to date (making
// it on first use) with the branch's history and every report and
// certificate ref, and returns it. It never pushes. A mirror grown past
// sync.CompactBound of its size when made (every report a node publishes
// is a new commit, and the old ones stay in the packs) is replaced by a
// fresh clone, as the agents' are. Fetch holds the cache's lock while it
// works; FetchRead holds it over the read too.
func Fetch(ctx context.Context, dir string, remote sync.Remote) (*Repo, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return fetch(ctx, dir, remote)
}

func fetch(ctx context.Context, dir string, remote sync.Remote) (*Repo, error) {
	remote.FullHistory = true
	prefix := render.DefaultReportRefPrefix
	for range 2 {
		m, err := sync.OpenMirror(ctx, dir, remote, prefix)
		if err != nil {
			return nil, err
		}
		refs, err := m.Fetch(ctx)
		if err != nil {
			return nil, err
		}
		if m.NeedsCompaction() {
			// A failed compaction leaves the mirror as it was: read that.
			if err := m.Compact(ctx); err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if refs, err = m.Refs(); err != nil {
				return nil, err
			}
		}
		r := &Repo{Git: m.Repository(), mirror: m}
		// The cluster may keep its reports elsewhere: read it from the
		// specs at the tip, and fetch again if so.
		if refs.Tip.IsZero() {
			return r, nil
		}
		c, err := m.Commit(refs.Tip)
		if err != nil {
			return nil, err
		}
		fsys, err := m.CommitFS(c)
		if err != nil {
			return nil, err
		}
		model, _ := render.Render(fsys)
		if model == nil || model.Cluster.ReportRefPrefix == "" || model.Cluster.ReportRefPrefix == prefix {
			return r, nil
		}
		prefix = model.Cluster.ReportRefPrefix
	}
	return nil, errors.New("the cluster's report prefix changed while fetching")
}

// Side is one revision's specs, rendered.
type Side struct {
	Commit  string
	Model   *render.Model
	Invalid bool
}

// LoadSide renders the cluster repository at rev; with rev "", it renders
// worktree instead (a checkout's files, which may not be committed).
func LoadSide(worktree fs.FS, g *Repo, rev string) (*Side, error) {
	fsys := worktree
	s := &Side{}
	if rev != "" {
		if g == nil {
			return nil, fmt.Errorf("%s: not a git repository", rev)
		}
		c, err := sync.ResolveCommit(g.Git, rev)
		if err != nil {
			return nil, err
		}
		if fsys, err = sync.CommitFS(g.Git, c, g.Subdir); err != nil {
			return nil, err
		}
		s.Commit = c.Hash.String()
	}
	m, err := render.Render(fsys)
	var ie *render.InvalidError
	switch {
	case errors.As(err, &ie):
		s.Invalid = true
	case err != nil:
		return nil, err
	}
	s.Model = m
	return s, nil
}

// ReportSource says where reports come from: a directory of report files,
// a git remote whose report refs are fetched first, or (both empty) the
// repository's own report refs.
type ReportSource struct {
	Dir    string
	Remote string
}

// ReadReports gathers the reports of m's cluster as src says. A report
// that cannot be read, or is not signed by its node's key, is left out
// and described in problems (shown as warnings, not errors).
func ReadReports(ctx context.Context, src ReportSource, g *Repo, m *render.Model) ([]report.Report, []string, error) {
	keys, err := sync.ReportKeysOf(m)
	if err != nil {
		return nil, nil, err
	}
	prefix := m.Cluster.ReportRefPrefix
	if src.Dir != "" {
		return readReportDir(src.Dir, keys)
	}
	if g == nil {
		if src.Remote != "" {
			return nil, nil, fmt.Errorf("--reports-remote needs --repo to be in a git repository")
		}
		return nil, nil, nil
	}
	if src.Remote != "" {
		if err := sync.FetchReports(ctx, g.Git, g.Root, src.Remote, prefix); err != nil {
			return nil, nil, err
		}
	}
	return sync.ReadVerifiedReports(g.Git, prefix, keys)
}

// readReportDir reads every *.yaml / *.yml file of dir as a report; the
// report of a node with a reportKey needs its signature beside it, in the
// file's name plus ".sig".
func readReportDir(dir string, keys sync.ReportKeys) ([]report.Report, []string, error) {
	// The same reader as for a checkout: no links, FIFOs or devices, and
	// nothing larger than a spec file is read.
	fsys, err := sync.OpenDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("reports: %w", err)
	}
	defer fsys.Close()
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, nil, fmt.Errorf("reports: %w", err)
	}
	var out []report.Report
	var problems []string
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		data, err := fsys.ReadFile(e.Name())
		if err == nil {
			var r report.Report
			if r, err = report.ParseFile(data); err == nil {
				if key := keys[r.Node]; key != nil {
					var sig []byte
					// A missing signature is "not signed", from VerifyReport.
					sig, err = fsys.ReadFile(e.Name() + ".sig")
					if err == nil || errors.Is(err, fs.ErrNotExist) {
						err = sync.VerifyReport(data, sig, key)
					}
				}
				if err == nil {
					out = append(out, r)
					continue
				}
			}
		}
		problems = append(problems, fmt.Sprintf("report %s ignored: %v", e.Name(), err))
	}
	return out, problems, nil
}

// NewPins returns the pins keel lock adds: every stateful instance that the
// plan places and that has no pin yet, on the node it is placed on.
func NewPins(m *render.Model, plan *planner.Plan) map[string]string {
	out := map[string]string{}
	for _, pl := range plan.Placements {
		inst := m.Instance(pl.Instance)
		if inst == nil || !inst.Stateful {
			continue
		}
		if _, pinned := m.Lock.Pins[pl.Instance]; !pinned {
			out[pl.Instance] = pl.Node
		}
	}
	return out
}

// LockFor is the lock keel lock would write for m with plan.
func LockFor(m *render.Model, plan *planner.Plan) render.Lock {
	l := render.NewLock(m)
	for inst, node := range NewPins(m, plan) {
		l.Pins[inst] = node
	}
	return l
}

// LockWarnings says when keel.lock is stale against m.
func LockWarnings(m *render.Model, plan *planner.Plan) []planner.Warning {
	var out []planner.Warning
	if diff := m.Lock.Diff(LockFor(m, plan)); len(diff) > 0 {
		out = append(out, planner.Warning{Code: "stale-lock", Message: fmt.Sprintf("keel.lock is stale (%d entries to add, change or drop): run keel lock and commit it", len(diff))})
	}
	return out
}

// ProblemsAsWarnings turns the problems of reading reports into warnings,
// in a stable order.
func ProblemsAsWarnings(problems []string) []planner.Warning {
	var out []planner.Warning
	for _, p := range slices.Sorted(slices.Values(problems)) {
		out = append(out, planner.Warning{Code: planner.WarnReportIgnored, Message: p})
	}
	return out
}

// Snapshot is everything the status views read from the repository: the
// branch's tip, its specs, the branch's recent history and every report.
type Snapshot struct {
	Branch   string
	Tip      Commit
	Tree     *Side
	History  []Commit
	Reports  []report.Report
	Problems []string
}

// HistoryLength is how many of the branch's newest commits a snapshot
// holds (first parents only).
const HistoryLength = 10

// ReadDir opens the repository that holds dir afresh (a long-running
// reader must see the packs that pushes and git gc add after it started)
// and takes a snapshot of branch. go-git writes a ref in place (truncate,
// then write), so a reader of a repository that agents push to through a
// path (keel demo) may find one empty for a moment: that read is tried
// again, twice at most.
func ReadDir(ctx context.Context, dir, branch string) (*Snapshot, error) {
	for try := 1; ; try++ {
		g, err := OpenDir(dir)
		if err != nil {
			return nil, err
		}
		snap, err := Read(g, branch)
		if err == nil || !errors.Is(err, dotgit.ErrEmptyRefFile) || try == 3 {
			return snap, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Read takes a snapshot of branch in g.
func Read(g *Repo, branch string) (*Snapshot, error) {
	ref, err := g.Git.Reference(plumbing.NewBranchReferenceName(branch), true)
	if err != nil {
		return nil, fmt.Errorf("branch %q: %w", branch, err)
	}
	c, err := g.Git.CommitObject(ref.Hash())
	if err != nil {
		return nil, fmt.Errorf("branch %q: %w", branch, err)
	}
	snap := &Snapshot{Branch: branch, Tip: commitOf(c)}
	fsys, err := sync.CommitFS(g.Git, c, g.Subdir)
	if err != nil {
		return nil, err
	}
	m, err := render.Render(fsys)
	var ie *render.InvalidError
	switch {
	case errors.As(err, &ie):
		snap.Tree = &Side{Commit: c.Hash.String(), Model: m, Invalid: true}
	case err != nil:
		return nil, err
	default:
		snap.Tree = &Side{Commit: c.Hash.String(), Model: m}
	}
	for h := c; len(snap.History) < HistoryLength; {
		snap.History = append(snap.History, commitOf(h))
		if h.NumParents() == 0 {
			break
		}
		if h, err = h.Parent(0); err != nil {
			break // a shallow history ends here
		}
	}
	keys, err := sync.ReportKeysOf(m)
	if err != nil {
		return nil, err
	}
	snap.Reports, snap.Problems, err = sync.ReadVerifiedReports(g.Git, m.Cluster.ReportRefPrefix, keys)
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// commitOf is c as the status shows it: the subject line only, bounded.
func commitOf(c *object.Commit) Commit {
	subject, _, _ := strings.Cut(c.Message, "\n")
	return Commit{Hash: c.Hash.String(), Subject: clip(subject, maxSubject), Author: clip(c.Author.Name, maxSubject), Time: c.Committer.When.UTC()}
}
