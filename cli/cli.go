// Package cli implements the keel command line: flag parsing, reading the
// repository from disk, and printing results. The work itself lives in the
// render, planner, sync and nodeexec packages; nothing here is imported by
// them.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/sync"
)

// Exit codes shared by every command.
const (
	ExitOK      = 0 // success
	ExitInvalid = 1 // the input (specs, lock) is invalid or stale
	ExitUsage   = 2 // bad usage, or an I/O error
)

// Version is keel's version: the agent reports it (agentVersion) and
// compares it with the cluster's minAgentVersion. It is set at build time
// with -ldflags "-X github.com/keel-dev/keel/cli.Version=..." (make build
// and make release stamp a semantic version, see the Makefile); a binary
// built by go install reports its module version instead. The default is
// the version under development; the Makefile reads it from this line.
var Version = "0.1.0-dev"

// Commit is the source commit, set at build time like Version (make does);
// otherwise what Go recorded (vcs.revision), if anything.
var Commit = ""

func init() {
	if Version != "0.1.0-dev" {
		return
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		Version = strings.TrimPrefix(bi.Main.Version, "v")
	}
}

// exitError carries an exit code; its message (if any) is printed on stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// invalid marks an error as bad input (exit 1); silent when err is nil,
// because the command already printed the details.
func invalid(err error) error { return &exitError{code: ExitInvalid, err: err} }

// env is what a command may touch: its streams and the context.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// Run runs keel with args (without the program name) and returns the exit
// code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr}
	root := e.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "keel:", errorText(ee.err))
		}
		return ee.code
	}
	// Anything else is a usage error from cobra or an I/O failure.
	fmt.Fprintln(stderr, "keel:", errorText(err))
	if cmd, _, findErr := root.Find(args); findErr == nil && isUsageError(err) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return ExitUsage
}

// errorText is err's message for the terminal: an error may quote a
// remote (a git server's ERR line, an HTTP answer), so each of its lines is
// made terminal-safe (termSafe).
func errorText(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = termSafe(l)
	}
	return strings.Join(lines, "\n")
}

func (e *env) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "keel",
		Short: "Keel runs FreeBSD jails on a fleet of nodes from a git repository",
		Long: `Keel is a GitOps pull agent for FreeBSD servers. Every node clones one
cluster git repository, works out which workloads are its own, and reconciles
them as jails with ZFS volumes, routes, service proxies and HTTPS ingress.
git push is the deploy command; keel plan shows what a change will do.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.AddCommand(
		e.validateCommand(),
		e.renderCommand(),
		e.lockCommand(),
		e.planCommand(),
		e.statusCommand(),
		e.dashboardCommand(),
		e.agentCommand(),
		e.nodeCommand(),
		e.volumeCommand(),
		e.imageCommand(),
		e.demoWebCommand(),
		e.demoImageCommand(),
		e.demoLoadCommand(),
		e.demoCommand(),
		e.signCheckCommand(),
		e.versionCommand(),
	)
	return root
}

func (e *env) versionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print keel's version (what minAgentVersion is compared with)",
		Long: `Prints keel's version, the one this binary's agent reports and compares with
the cluster's minAgentVersion, then the commit it was built from, the Go
version and the platform. -o json prints the same as an object.`,
		Args: cobra.NoArgs,
	}
	format := formatFlag(cmd, "text", "json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		info := buildInfo()
		if *format == "json" {
			return writeJSON(e.stdout, info)
		}
		commit := info.Commit
		if commit == "" {
			commit = "unknown"
		}
		_, err := fmt.Fprintf(e.stdout, "keel %s (commit %s, %s, %s/%s)\n", info.Version, commit, info.Go, info.OS, info.Arch)
		return err
	}
	return cmd
}

// versionInfo is keel version -o json, a stable schema (docs/cli.md).
type versionInfo struct {
	Version string `json:"version"` // what minAgentVersion is compared with
	Commit  string `json:"commit"`  // the source commit, "" when unknown
	Go      string `json:"go"`      // the Go release that built it
	OS      string `json:"os"`      // GOOS
	Arch    string `json:"arch"`    // GOARCH
}

func buildInfo() versionInfo {
	v := versionInfo{Version: Version, Commit: Commit, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok && v.Commit == "" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v.Commit = s.Value
			}
		}
	}
	return v
}

// repoFS opens the cluster repository directory through the one reader
// of a checkout (sync.OpenDir): nothing outside it, nothing but regular
// files of bounded size. Close it when done.
func repoFS(dir string) (*sync.DirFS, error) { return sync.OpenDir(dir) }

// isUsageError tells cobra's complaints about the command line apart from
// I/O failures, which need no pointer to --help.
func isUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown flag", "unknown shorthand flag", "unknown command", "flag needs an argument", "invalid argument", "accepts ", "--format", "--now", "required flag", "if any flags in the group"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
