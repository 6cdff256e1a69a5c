package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/status"
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
		g, gitErr := status.OpenDir(*repo)
		if (*base != "" || *head != "" || rf.remote != "") && gitErr != nil {
			return gitErr
		}
		out := &planOutput{Base: *base, Head: *head}

		headSide, err := status.LoadSide(checkout, g, *head)
		if err != nil {
			return err
		}
		out.HeadCommit = headSide.Commit
		var baseSide *status.Side
		if *base != "" {
			if baseSide, err = status.LoadSide(checkout, g, *base); err != nil {
				return err
			}
			out.BaseCommit = baseSide.Commit
		}
		out.addErrors("head", headSide)
		if headSide.Invalid {
			if err := out.write(e.stdout, *format); err != nil {
				return err
			}
			return invalid(nil)
		}
		if baseSide != nil && baseSide.Invalid {
			// A change that fixes a broken base is what review is for: plan
			// the head alone and say why there is no comparison.
			errs := baseSide.Model.Diagnostics.Errors()
			msg := fmt.Sprintf("the base %s is invalid (%s), so this plan is not compared with it; first: %s", *base, plural(len(errs), "error"), errs[0])
			out.Warnings = append(out.Warnings, planner.Warning{Code: "invalid-base", Message: msg})
			baseSide = nil
		}

		reports, problems, err := e.readReports(rf, g, headSide.Model)
		if err != nil {
			return err
		}
		headPlan := planner.Compute(planner.Input{Model: headSide.Model, Commit: headSide.Commit, Reports: reports, Now: now, AssumeAlive: true})
		headPlan.Warnings = append(status.ProblemsAsWarnings(problems), headPlan.Warnings...)
		out.fill(headSide.Model, headPlan)
		for _, n := range headPlan.Nodes {
			if !n.ReportTime.IsZero() {
				out.Reports++
			}
		}
		out.Pending = planner.Pending(headSide.Model, headPlan, reports)
		out.Warnings = append(out.Warnings, status.LockWarnings(headSide.Model, headPlan)...)
		if baseSide != nil {
			basePlan := planner.Compute(planner.Input{Model: baseSide.Model, Commit: baseSide.Commit, Reports: reports, Now: now, AssumeAlive: true})
			out.Changes = planner.Diff(baseSide.Model, basePlan, headSide.Model, headPlan)
			out.Allocations = planner.DiffAllocations(status.LockFor(baseSide.Model, basePlan), status.LockFor(headSide.Model, headPlan))
			out.Compared = true
		}
		return out.write(e.stdout, *format)
	}
	return cmd
}
