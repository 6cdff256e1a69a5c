package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"gopkg.in/yaml.v3"

	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/sync"
)

// ExitNotConverged is keel status --check's exit code while the cluster
// has not converged on the tip.
const ExitNotConverged = 3

// statusSource is where keel status and keel dashboard read the cluster
// from: a local clone, or a URL fetched read-only into a cache directory.
type statusSource struct {
	repo       string
	branch     string
	cacheDir   string
	sshKey     string
	knownHosts string
	tokenFile  string
}

func addStatusSourceFlags(cmd *cobra.Command) *statusSource {
	s := &statusSource{}
	f := cmd.Flags()
	f.StringVar(&s.repo, "repo", ".", "the cluster repository: a local clone's directory, or a URL (https://, ssh://, file://) fetched read-only")
	f.StringVar(&s.branch, "branch", "main", "the branch that holds the specs")
	f.StringVar(&s.cacheDir, "cache-dir", "", "where a URL's read-only mirror is kept (default: the user's cache directory)")
	f.StringVar(&s.sshKey, "ssh-key", "", "private key file for an ssh:// URL")
	f.StringVar(&s.knownHosts, "known-hosts", "", "known_hosts file for an ssh:// URL (required with --ssh-key)")
	f.StringVar(&s.tokenFile, "token-file", "", "file holding a read token for an https:// URL")
	return s
}

// open opens the repository; a URL is fetched at every call of read, a
// local clone is read as it is.
func (s *statusSource) open(ctx context.Context) (func(context.Context) (*status.Snapshot, error), error) {
	if !status.IsURL(s.repo) {
		dir, _ := sync.LocalPath(s.repo)
		if _, err := status.OpenDir(dir); err != nil {
			return nil, fmt.Errorf("--repo %s: %w", s.repo, err)
		}
		return func(ctx context.Context) (*status.Snapshot, error) { return status.ReadDir(ctx, dir, s.branch) }, nil
	}
	if err := sync.CheckURL(s.repo); err != nil {
		return nil, err
	}
	base := s.cacheDir
	if base == "" {
		var err error
		if base, err = os.UserCacheDir(); err != nil {
			return nil, fmt.Errorf("no cache directory (%v): give --cache-dir", err)
		}
	}
	dir := status.CacheDir(base, s.repo, s.branch)
	remote := sync.Remote{URL: s.repo, Branch: s.branch, SSHKeyFile: s.sshKey, KnownHostsFile: s.knownHosts, TokenFile: s.tokenFile}
	return func(ctx context.Context) (*status.Snapshot, error) {
		snap, err := status.FetchRead(ctx, dir, remote, s.branch)
		if err != nil {
			return nil, sync.RedactURL(err)
		}
		return snap, nil
	}, nil
}

func (e *env) statusCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the whole cluster at a glance, from the repository alone: nodes, services, what is missing",
		Long: `Status reads the specs at the branch's tip and every node's report from the
cluster repository (a local clone, or a URL fetched read-only), works out the
plan as the nodes do, and shows where the cluster stands: whether it has
converged on the tip or exactly what is missing, each node (alive or dead,
report age, commit, plan agreement, instances, resources, problems), each
Service (ready and updated replicas), the instances that need attention,
ingress hosts with their certificates, volumes, and warnings. It needs read
access only and never changes anything.

With --check it prints the headline only and exits 0 once the cluster has
converged on the tip, 3 while it has not (waiting up to --timeout for it:
a CI job's "wait for the deploy"). --watch redraws until interrupted.

Exit status: 0 success (converged, with --check), 2 usage or I/O error,
3 not converged (with --check).`,
		Example: `  keel status --repo ./cluster
  keel status --repo https://git.example.com/ops/cluster.git --token-file ~/.config/keel/token -o json
  keel status --check --timeout 5m`,
		Args: cobra.NoArgs,
	}
	src := addStatusSourceFlags(cmd)
	format := formatFlag(cmd, "table", "json", "yaml")
	watch := cmd.Flags().Bool("watch", false, "redraw in place every --interval until interrupted")
	interval := cmd.Flags().Duration("interval", 2*time.Second, "how often --watch and --check read the repository again")
	check := cmd.Flags().Bool("check", false, "print the headline; exit 0 when converged on the tip, 3 when not (after --timeout)")
	timeout := cmd.Flags().Duration("timeout", 0, "with --check: wait up to this long for the cluster to converge")
	width := cmd.Flags().Int("width", 0, "table width in columns (default: the terminal's, or 120)")
	cmd.MarkFlagsMutuallyExclusive("watch", "check")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *interval <= 0 {
			return fmt.Errorf("--interval %s: want a positive duration", *interval)
		}
		if *timeout < 0 {
			return fmt.Errorf("--timeout %s: want a positive duration", *timeout)
		}
		read, err := src.open(e.ctx)
		if err != nil {
			return err
		}
		tty := isTerminalWriter(e.stdout)
		opts := tableOptions{width: *width, color: tty && os.Getenv("NO_COLOR") == ""}
		if opts.width <= 0 {
			opts.width = terminalWidth(e.stdout)
		}
		get := func() (*status.Status, error) {
			snap, err := read(e.ctx)
			if err != nil {
				return nil, err
			}
			return status.Compute(status.Input{Snapshot: snap, Now: time.Now()}), nil
		}
		switch {
		case *check:
			return e.statusCheck(get, *interval, *timeout, opts)
		case *watch:
			return e.statusWatch(get, *interval, *format, opts, tty)
		}
		st, err := get()
		if err != nil {
			return err
		}
		return writeStatus(e.stdout, st, *format, opts)
	}
	return cmd
}

// statusCheck polls until the cluster converges or the timeout passes.
func (e *env) statusCheck(get func() (*status.Status, error), interval, timeout time.Duration, opts tableOptions) error {
	deadline := time.Now().Add(timeout)
	last := ""
	read := false
	for {
		st, err := get()
		switch {
		case err != nil && e.ctx.Err() != nil:
			return &exitError{code: ExitNotConverged, err: errors.New("interrupted before the cluster converged")}
		case err != nil && (!read || time.Until(deadline) <= 0):
			// The first read fails at once (a wrong URL, branch or
			// credential); a later one only when the time is up.
			return err
		case err != nil:
			// A forge or network that fails for a moment does not end a
			// wait for the deploy: read again.
			fmt.Fprintf(e.stderr, "keel: %s (reading again)\n", termText(err.Error(), maxTerminalText))
			if !e.sleep(min(interval, time.Until(deadline))) {
				return &exitError{code: ExitNotConverged, err: errors.New("interrupted before the cluster converged")}
			}
			continue
		}
		read = true
		headline := termText(st.Headline, maxTerminalText)
		if st.Converged {
			fmt.Fprintln(e.stdout, opts.paint(headline, colorGreen))
			return nil
		}
		if headline != last {
			fmt.Fprintln(e.stdout, opts.paint(headline, colorRed))
			last = headline
		}
		wait := min(interval, time.Until(deadline))
		if wait <= 0 {
			for _, m := range st.Missing[1:] {
				fmt.Fprintln(e.stdout, "  "+termText(m, maxTerminalText))
			}
			return &exitError{code: ExitNotConverged}
		}
		if !e.sleep(wait) {
			return &exitError{code: ExitNotConverged, err: errors.New("interrupted before the cluster converged")}
		}
	}
}

// sleep waits d, or until the command is interrupted (false).
func (e *env) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-e.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// statusWatch redraws the status until interrupted: in place on a
// terminal, one document after another otherwise.
func (e *env) statusWatch(get func() (*status.Status, error), interval time.Duration, format string, opts tableOptions, tty bool) error {
	for {
		st, err := get()
		if e.ctx.Err() != nil {
			return nil // Ctrl-C, maybe in the middle of a read: not an error
		}
		var buf strings.Builder
		if err != nil {
			fmt.Fprintf(&buf, "%s: %s\n", time.Now().Format(time.TimeOnly), termText(err.Error(), maxTerminalText))
		} else if err := writeStatus(&buf, st, format, opts); err != nil {
			return err
		}
		if tty {
			// Home, clear the screen: the new table in place of the old.
			io.WriteString(e.stdout, "\x1b[H\x1b[2J")
		}
		io.WriteString(e.stdout, buf.String())
		select {
		case <-e.ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

func writeStatus(w io.Writer, st *status.Status, format string, opts tableOptions) error {
	switch format {
	case "json":
		return writeJSON(w, st)
	case "yaml":
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(st); err != nil {
			return err
		}
		return enc.Close()
	default:
		_, err := io.WriteString(w, statusTable(st, opts))
		return err
	}
}

func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func terminalWidth(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			return cols
		}
	}
	return 120
}
