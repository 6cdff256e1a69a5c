package cli

import (
	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
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

// readReports gathers reports as the flags say (status.ReadReports).
func (e *env) readReports(f *reportFlags, g *status.Repo, m *render.Model) ([]report.Report, []string, error) {
	return status.ReadReports(e.ctx, status.ReportSource{Dir: f.dir, Remote: f.remote}, g, m)
}
