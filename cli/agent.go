package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/nodeexec/process"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/sync"
)

func (e *env) agentCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: pull the cluster repository, plan, reconcile, report",
		Long: `Agent runs on every node. It clones the cluster repository into the state
directory, fetches it every --poll (and at once when a local repository's refs
change), applies each new commit that renders without errors, works out from
the specs and the other nodes' reports which instances are its own, makes the
node match, and publishes its report on refs/keel/reports/<node>.

Credentials come from files (--ssh-key with --known-hosts, or --token-file),
never from the URL. Instances keep running when the agent stops; SIGTERM
stops the agent cleanly. See docs/agent.md.`,
		Example: `  keel agent --repo ssh://git@git.example.com/infra/cluster.git --node fra1 \
    --state-dir /var/db/keel --ssh-key /usr/local/etc/keel/id_ed25519 \
    --known-hosts /usr/local/etc/keel/known_hosts --metrics-listen :9273`,
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	repo := f.String("repo", "", "the cluster repository: a path, file://, https:// or ssh:// URL (required)")
	node := f.String("node", "", "this node's name, as in nodes/<name>.yaml (required)")
	stateDir := f.String("state-dir", "", "where the agent keeps its clone, state, instances and volumes (required)")
	branch := f.String("branch", "main", "the branch that holds the specs")
	driverName := f.String("driver", "process", "how instances run: process (Linux, no root), fake (in memory), freebsd")
	poll := f.Duration("poll", 10*time.Second, "how often to fetch the repository")
	metrics := f.String("metrics-listen", "", "serve /metrics, /healthz and /readyz on this address (e.g. :9273)")
	sshKey := f.String("ssh-key", "", "private key file for ssh:// repositories")
	knownHosts := f.String("known-hosts", "", "known_hosts file for ssh:// repositories (required with --ssh-key)")
	tokenFile := f.String("token-file", "", "file holding a token for https:// repositories")
	socket := f.String("socket", "", "the local API socket (default <state-dir>/keel.sock)")
	logFormat := f.String("log-format", "text", "log format: text or json")
	logLevel := f.String("log-level", "info", "log level: debug, info, warn or error")
	reconcile := f.Duration("reconcile-interval", 5*time.Second, "time between reconcile passes")
	stopGrace := f.Duration("stop-grace", 10*time.Second, "how long an instance has to stop before it is killed")
	noWatch := f.Bool("no-watch", false, "do not watch a local repository for changes (poll only)")
	verify := f.Bool("verify-signatures", false, "apply only commits signed by a key of --allowed-signers that descend from the last applied commit")
	allowedSigners := f.String("allowed-signers", "", "OpenSSH allowed_signers file of the keys that may sign deployable commits (with --verify-signatures)")
	reportKey := f.String("report-key", "", "this node's private SSH key that signs its reports (its public half is spec.reportKey in nodes/<name>.yaml)")
	pgpKeyring := f.String("pgp-keyring", "", "ASCII-armored OpenPGP public keyring of the keys that may sign deployable commits (with --verify-signatures)")
	allowRewind := f.Bool("allow-rewind", false, "with --verify-signatures, also accept a tip that does not descend from the last applied commit")
	webhookListen := f.String("webhook-listen", "", "serve push webhooks (POST /hook) on this address, so that a push is fetched at once")
	webhookSecret := f.String("webhook-secret-file", "", "file holding the webhook secret (required with --webhook-listen)")
	for _, name := range []string{"repo", "node", "state-dir"} {
		_ = cmd.MarkFlagRequired(name)
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := render.CheckName(*node); err != nil {
			return fmt.Errorf("--node: %w", err)
		}
		logger, err := newLogger(e.stderr, *logFormat, *logLevel)
		if err != nil {
			return err
		}
		abs, err := filepath.Abs(*stateDir)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return err
		}
		driver, err := newDriver(*driverName, abs, logger)
		if err != nil {
			return err
		}
		remote := sync.Remote{URL: *repo, Branch: *branch, SSHKeyFile: *sshKey, KnownHostsFile: *knownHosts, TokenFile: *tokenFile}
		// Refuse at once what would fail at every fetch.
		if err := sync.CheckURL(*repo); err != nil {
			return fmt.Errorf("--repo: %w", err)
		}
		if _, err := remote.Auth(); err != nil {
			return err
		}
		var trust *agent.Trust
		switch {
		case *verify:
			signers, err := sync.LoadSigners(*allowedSigners, *pgpKeyring)
			if err != nil {
				return fmt.Errorf("--verify-signatures: %w", err)
			}
			trust = &agent.Trust{Signers: signers, AllowRewind: *allowRewind}
		case *allowedSigners != "" || *pgpKeyring != "" || *allowRewind:
			return errors.New("--allowed-signers, --pgp-keyring and --allow-rewind need --verify-signatures")
		}
		var reportSigner ssh.Signer
		if *reportKey != "" {
			if reportSigner, err = sync.LoadReportSigner(*reportKey); err != nil {
				return fmt.Errorf("--report-key: %w", err)
			}
		}
		reg := prometheus.NewRegistry()
		a, err := agent.New(agent.Options{
			Node: *node, StateDir: abs, Driver: driver, Version: Version, Logger: logger, Registry: reg,
			Remote: remote,
			Poll:   *poll, Reconcile: *reconcile, StopGrace: *stopGrace, DisableWatch: *noWatch, Trust: trust, ReportSigner: reportSigner,
		})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(e.ctx)
		defer cancel()
		sock := *socket
		if sock == "" {
			sock = filepath.Join(abs, "keel.sock")
		}
		go func() {
			if err := a.ServeSocket(ctx, sock); err != nil {
				logger.Error("local API", "socket", sock, "err", err)
			}
		}()
		if *webhookListen != "" {
			if *webhookSecret == "" {
				return errors.New("--webhook-listen needs --webhook-secret-file: unauthenticated webhooks are never accepted")
			}
			data, err := os.ReadFile(*webhookSecret)
			if err != nil {
				return fmt.Errorf("--webhook-secret-file: %w", err)
			}
			secret := []byte(strings.TrimSpace(string(data)))
			if len(secret) < 16 {
				return errors.New("--webhook-secret-file: the secret must be at least 16 characters")
			}
			l, err := net.Listen("tcp", *webhookListen)
			if err != nil {
				return fmt.Errorf("--webhook-listen: %w", err)
			}
			mux := http.NewServeMux()
			mux.Handle("/hook", sync.WebhookHandler(sync.WebhookConfig{
				Secret: secret, Branch: *branch, ReportPrefix: a.ReportPrefix, Trigger: a.Trigger, Logger: logger,
			}))
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
			go func() { _ = srv.Serve(l) }()
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			logger.Info("webhooks", "listen", l.Addr().String(), "path", "/hook")
		}
		if *metrics != "" {
			l, err := net.Listen("tcp", *metrics)
			if err != nil {
				return fmt.Errorf("--metrics-listen: %w", err)
			}
			srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.Serve(l) }()
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			logger.Info("metrics", "listen", l.Addr().String())
		}
		return a.Run(ctx)
	}
	return cmd
}

func newDriver(name, stateDir string, logger *slog.Logger) (nodeexec.Driver, error) {
	switch name {
	case "process":
		return process.New(process.Options{StateDir: stateDir, Logger: logger})
	case "fake":
		return fake.New(), nil
	case "freebsd":
		return nil, errors.New("--driver freebsd: the FreeBSD driver is not part of this build yet; use process or fake")
	}
	return nil, fmt.Errorf("--driver %q: want process, fake or freebsd", name)
}

func newLogger(w interface{ Write([]byte) (int, error) }, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
