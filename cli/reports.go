package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// reportFlags are the flags that say where reports come from.
type reportFlags struct {
	dir    string
	remote string
}

func addReportFlags(cmd *cobra.Command) *reportFlags {
	f := &reportFlags{}
	cmd.Flags().StringVar(&f.dir, "reports", "", "read reports from this directory (one YAML report per file) instead of the repository's report refs")
	cmd.Flags().StringVar(&f.remote, "reports-remote", "", "fetch the report refs from this git remote first (CI checkouts do not fetch them), into refs/keel/remotes/NAME/reports/")
	cmd.MarkFlagsMutuallyExclusive("reports", "reports-remote")
	_ = cmd.MarkFlagDirname("reports")
	return f
}

// gitRepo is the git repository holding a cluster repository directory.
type gitRepo struct {
	repo   *git.Repository
	root   string // the worktree's root directory
	subdir string // the cluster repository's directory within the worktree
}

// openGit opens the git repository that holds dir; nil when there is none.
func openGit(dir string) (*gitRepo, error) {
	repo, err := sync.OpenRepo(dir)
	if err != nil {
		return nil, err
	}
	g := &gitRepo{repo: repo, root: dir}
	if wt, err := repo.Worktree(); err == nil {
		abs, _ := filepath.Abs(dir)
		root, _ := filepath.EvalSymlinks(wt.Filesystem.Root())
		g.root = root
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		if rel, err := filepath.Rel(root, abs); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			g.subdir = filepath.ToSlash(rel)
		}
	}
	return g, nil
}

// readReports gathers reports as the flags say: from a directory, or from
// the report refs of the repository (fetched from a remote first if asked).
// Problems with single reports become warnings, not errors.
func (e *env) readReports(f *reportFlags, g *gitRepo, m *render.Model) ([]report.Report, []string, error) {
	keys, err := sync.ReportKeysOf(m)
	if err != nil {
		return nil, nil, err
	}
	prefix := m.Cluster.ReportRefPrefix
	if f.dir != "" {
		return readReportDir(f.dir, keys)
	}
	if g == nil {
		if f.remote != "" {
			return nil, nil, fmt.Errorf("--reports-remote needs --repo to be in a git repository")
		}
		return nil, nil, nil
	}
	if f.remote != "" {
		if err := sync.FetchReports(e.ctx, g.repo, g.root, f.remote, prefix); err != nil {
			return nil, nil, err
		}
	}
	return sync.ReadVerifiedReports(g.repo, prefix, keys)
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

// newPins returns the pins keel lock adds: every stateful instance that the
// plan places and that has no pin yet, on the node it is placed on.
func newPins(m *render.Model, plan *planner.Plan) map[string]string {
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

// lockFor is the lock keel lock would write for m with plan.
func lockFor(m *render.Model, plan *planner.Plan) render.Lock {
	l := render.NewLock(m)
	for inst, node := range newPins(m, plan) {
		l.Pins[inst] = node
	}
	return l
}

func problemsAsWarnings(problems []string) []planner.Warning {
	var out []planner.Warning
	for _, p := range slices.Sorted(slices.Values(problems)) {
		out = append(out, planner.Warning{Code: planner.WarnReportIgnored, Message: p})
	}
	return out
}
