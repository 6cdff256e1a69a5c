package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/status"
)

func (e *env) lockCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lock",
		Short: "Write keel.lock: pin node subnets, service VIPs and stateful instances so they never move",
		Long: `Lock writes keel.lock at the root of the cluster repository with every
node's subnet, every Service's VIP, and the node of every stateful instance
(a pin: where the planner places it, using the reports it can read, as keel
plan does). Existing entries never change; entries of deleted nodes,
Services and instances are dropped; running it twice changes nothing.
Commit keel.lock and review its changes like go.sum.

With --check nothing is written: the command exits 1 and prints what would
change when keel.lock is missing or stale (for CI).

Exit status: 0 success (or up to date), 1 invalid repository or stale lock,
2 usage or I/O error.`,
		Example: "  keel lock --repo ./cluster\n  keel lock --check",
		Args:    cobra.NoArgs,
	}
	repo := repoFlag(cmd)
	check := cmd.Flags().Bool("check", false, "change nothing; exit 1 if keel.lock is missing or stale")
	rf := addReportFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		m, err := loadRepo(*repo)
		if isInvalid(err) {
			printDiagnostics(e.stderr, m.Diagnostics.Errors())
			return invalid(fmt.Errorf("%s is invalid; fix the errors above first", *repo))
		}
		if err != nil {
			return err
		}
		path := filepath.Join(*repo, render.LockFile)
		current, err := readCheckoutFile(*repo, render.LockFile)
		exists := err == nil
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		// Stateful instances are pinned where the planner places them, with
		// the reports this repository holds (or all nodes alive without any).
		g, _ := status.OpenDir(*repo)
		reports, problems, err := e.readReports(rf, g, m)
		if err != nil {
			return err
		}
		for _, p := range problems {
			fmt.Fprintln(e.stderr, "warning:", p)
		}
		plan := planner.Compute(planner.Input{Model: m, Reports: reports, Now: time.Now().UTC(), AssumeAlive: true})
		if plan.AssumedAlive && len(status.NewPins(m, plan)) > 0 {
			fmt.Fprintln(e.stderr, "warning: no node has reported: new pins are placed as if every node were alive (use --reports-remote or --reports to plan with the nodes' reports)")
		}
		for _, u := range plan.Unschedulable {
			if inst := m.Instance(u.Instance); inst != nil && inst.Stateful {
				fmt.Fprintf(e.stderr, "warning: %s is not pinned: it cannot be placed (%s)\n", u.Instance, u.Reason)
			}
		}
		want := status.LockFor(m, plan)
		diff := m.Lock.Diff(want)
		upToDate := exists && len(diff) == 0
		if *check {
			if upToDate {
				fmt.Fprintf(e.stdout, "%s is up to date\n", path)
				return nil
			}
			if !exists {
				fmt.Fprintf(e.stdout, "%s is missing\n", path)
			}
			for _, line := range diff {
				fmt.Fprintln(e.stdout, line)
			}
			return invalid(fmt.Errorf("%s is stale; run keel lock and commit it", path))
		}
		data := want.Marshal()
		if upToDate && bytes.Equal(current, data) {
			fmt.Fprintf(e.stdout, "%s is up to date\n", path)
			return nil
		}
		if err := writeFileAtomic(path, data); err != nil {
			return err
		}
		for _, line := range diff {
			fmt.Fprintln(e.stdout, line)
		}
		fmt.Fprintf(e.stdout, "wrote %s\n", path)
		return nil
	}
	return cmd
}

// readCheckoutFile reads the file name of the repository in dir through
// the checkout reader, with its limits.
func readCheckoutFile(dir, name string) ([]byte, error) {
	fsys, err := repoFS(dir)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	return fsys.ReadFile(name)
}

// writeFileAtomic replaces path with data so that a reader sees either the
// old or the new content, never a torn file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".keel.lock.*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
