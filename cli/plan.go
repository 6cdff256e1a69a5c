package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/sync"
)

func (e *env) planCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show what a change will do: placements, moves, replacements, VIPs, and what is still pending",
		Long: `Plan computes, the way every agent does, where each instance runs, and shows
what a change does. With --base, it compares the plan of the base revision
with the plan of the head (both with the same reports): instances created,
removed, replaced, restarted, moved, scaled; VIPs, subnets and pins
allocated. It also shows what is pending in the cluster (the head plan
against what the reports show running) and warnings.

Specs are read at --head (default: the working tree of --repo) and at
--base, from the git history of --repo. Reports come from the repository's
report refs (local, and fetched from remotes), from --reports-remote (fetched
first), or from --reports DIR. With no report at all, it plans as if every
node were alive, and says so.

Exit status: 0 valid (changes or not), 1 invalid specs, 2 usage or I/O error.`,
		Example: `  keel plan
  keel plan --base origin/main --head HEAD --reports-remote origin -o markdown
  keel plan --reports ./reports --now 2026-11-29T14:00:00Z -o json`,
		Args: cobra.NoArgs,
	}
	repo := repoFlag(cmd)
	base := cmd.Flags().String("base", "", "the revision to compare with (e.g. main, origin/main, HEAD~1)")
	head := cmd.Flags().String("head", "", "the revision to plan (default: the working tree)")
	nowFlag := cmd.Flags().String("now", "", "plan at this time (RFC 3339) instead of the clock's")
	rf := addReportFlags(cmd)
	format := formatFlag(cmd, "text", "markdown", "json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		now := time.Now().UTC()
		if *nowFlag != "" {
			t, err := time.Parse(time.RFC3339, *nowFlag)
			if err != nil {
				return fmt.Errorf("--now %q: want RFC 3339, e.g. 2026-11-29T14:00:00Z", *nowFlag)
			}
			now = t
		}
		checkout, err := repoFS(*repo)
		if err != nil {
			return err
		}
		defer checkout.Close()
		g, gitErr := openGit(*repo)
		if (*base != "" || *head != "" || rf.remote != "") && gitErr != nil {
			return gitErr
		}
		out := &planOutput{Base: *base, Head: *head}

		headSide, err := loadSide(checkout, g, *head)
		if err != nil {
			return err
		}
		out.HeadCommit = headSide.commit
		var baseSide *side
		if *base != "" {
			if baseSide, err = loadSide(checkout, g, *base); err != nil {
				return err
			}
			out.BaseCommit = baseSide.commit
		}
		out.addErrors("head", headSide)
		if headSide.invalid {
			if err := out.write(e.stdout, *format); err != nil {
				return err
			}
			return invalid(nil)
		}
		if baseSide != nil && baseSide.invalid {
			// A change that fixes a broken base is what review is for: plan
			// the head alone and say why there is no comparison.
			errs := baseSide.model.Diagnostics.Errors()
			msg := fmt.Sprintf("the base %s is invalid (%s), so this plan is not compared with it; first: %s", *base, plural(len(errs), "error"), errs[0])
			out.Warnings = append(out.Warnings, planner.Warning{Code: "invalid-base", Message: msg})
			baseSide = nil
		}

		reports, problems, err := e.readReports(rf, g, headSide.model)
		if err != nil {
			return err
		}
		headPlan := planner.Compute(planner.Input{Model: headSide.model, Commit: headSide.commit, Reports: reports, Now: now, AssumeAlive: true})
		headPlan.Warnings = append(problemsAsWarnings(problems), headPlan.Warnings...)
		out.fill(headSide.model, headPlan)
		for _, n := range headPlan.Nodes {
			if !n.ReportTime.IsZero() {
				out.Reports++
			}
		}
		out.Pending = planner.Pending(headSide.model, headPlan, reports)
		out.Warnings = append(out.Warnings, lockWarnings(headSide.model, headPlan)...)
		if baseSide != nil {
			basePlan := planner.Compute(planner.Input{Model: baseSide.model, Commit: baseSide.commit, Reports: reports, Now: now, AssumeAlive: true})
			out.Changes = planner.Diff(baseSide.model, basePlan, headSide.model, headPlan)
			out.Allocations = planner.DiffAllocations(lockFor(baseSide.model, basePlan), lockFor(headSide.model, headPlan))
			out.Compared = true
		}
		return out.write(e.stdout, *format)
	}
	return cmd
}

// side is one revision's specs, rendered.
type side struct {
	commit  string
	model   *render.Model
	invalid bool
}

// loadSide renders the working tree (rev == "") or a revision.
func loadSide(checkout *sync.DirFS, g *gitRepo, rev string) (*side, error) {
	var fsys fs.FS = checkout
	s := &side{}
	if rev != "" {
		c, err := sync.ResolveCommit(g.repo, rev)
		if err != nil {
			return nil, err
		}
		if fsys, err = sync.CommitFS(g.repo, c, g.subdir); err != nil {
			return nil, err
		}
		s.commit = c.Hash.String()
	}
	m, err := render.Render(fsys)
	var ie *render.InvalidError
	switch {
	case errors.As(err, &ie):
		s.invalid = true
	case err != nil:
		return nil, err
	}
	s.model = m
	return s, nil
}

// lockWarnings says when keel.lock is stale against the head.
func lockWarnings(m *render.Model, plan *planner.Plan) []planner.Warning {
	var out []planner.Warning
	if diff := m.Lock.Diff(lockFor(m, plan)); len(diff) > 0 {
		out = append(out, planner.Warning{Code: "stale-lock", Message: fmt.Sprintf("keel.lock is stale (%d entries to add, change or drop): run keel lock and commit it", len(diff))})
	}
	return out
}
