package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/internal/netlimit"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/ingress"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/process"
	"github.com/keel-dev/keel/nodeexec/proxy"
	"github.com/keel-dev/keel/providers/acme"
	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/providers/dns01"
	"github.com/keel-dev/keel/providers/forge"
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
	maxParallelOps := f.Int("max-parallel-ops", nodeexec.DefaultMaxParallel, "instance operations (create, start, stop, destroy) that run at once, off the agent's loop")
	registryConfig := f.String("registry-config", "", "Docker-style config.json with the credentials of the registries OCI images are pulled from (mode 600; docs/images.md); anonymous when empty")
	maxPulls := f.Int("max-pulls", nodeexec.DefaultMaxPulls, "OCI image pulls that run at once, off the agent's loop")
	imageMax := f.Int64("image-max-size", oci.DefaultMaxCompressed, "the most an OCI image's layers may weigh, compressed, and an artifact, in bytes")
	imageMaxUnpacked := f.Int64("image-max-unpacked", oci.DefaultMaxUnpacked, "the most an OCI image's files, or an artifact archive's, may weigh unpacked, in bytes")
	imageGrace := f.Duration("image-gc-grace", nodeexec.DefaultImageGrace, "an unused OCI image added less than this long ago is never collected on the agent's own")
	imageCacheMax := f.Int64("image-cache-max", 0, "collect unused OCI images and artifacts when the images and the cached layers and artifacts take more bytes than this (0: no limit)")
	imageMinFree := f.Float64("image-min-free", 100*nodeexec.DefaultImageMinFree, "collect unused OCI images when less than this percentage of the state directory's file system is free (0: never)")
	noWatch := f.Bool("no-watch", false, "do not watch a local repository for changes (poll only)")
	verify := f.Bool("verify-signatures", false, "apply only commits signed by a key of --allowed-signers that descend from the last applied commit")
	allowedSigners := f.String("allowed-signers", "", "OpenSSH allowed_signers file of the keys that may sign deployable commits (with --verify-signatures)")
	gossipKey := f.String("gossip-key", "", "file with the gossip ring's keys, one base64 key per line, the first encrypts (needed when cluster.yaml sets spec.gossip; docs/agent.md#gossip)")
	reportKey := f.String("report-key", "", "this node's private SSH key that signs its reports (its public half is spec.reportKey in nodes/<name>.yaml)")
	pgpKeyring := f.String("pgp-keyring", "", "ASCII-armored OpenPGP public keyring of the keys that may sign deployable commits (with --verify-signatures)")
	allowRewind := f.Bool("allow-rewind", false, "with --verify-signatures, also accept a tip that does not descend from the last applied commit")
	webhookListen := f.String("webhook-listen", "", "serve push webhooks (POST /hook) on this address, so that a push is fetched at once")
	webhookSecret := f.String("webhook-secret-file", "", "file holding the webhook secret (required with --webhook-listen)")
	metricsMaxConns := f.Int("metrics-max-conns", netlimit.DefaultMaxConns, "connections the metrics listener holds open at once; further clients wait")
	webhookMaxConns := f.Int("webhook-max-conns", netlimit.DefaultMaxConns, "connections the webhook listener holds open at once; further clients wait")
	headerTimeout := f.Duration("http-header-timeout", netlimit.DefaultHeaderTimeout, "how long the metrics and webhook listeners wait for a request's headers")
	idleTimeout := f.Duration("http-idle-timeout", netlimit.DefaultIdleTimeout, "how long the metrics and webhook listeners keep an idle keep-alive connection")
	proxyPerService := f.Int("proxy-max-conns-per-service", proxy.DefaultMaxConnsPerService, "client connections one service proxy holds open at once; further clients wait")
	proxyMax := f.Int("proxy-max-conns", proxy.DefaultMaxConns, "client connections all service proxies hold open at once; further clients are reset")
	proxyIdle := f.Duration("proxy-idle-timeout", proxy.DefaultIdleTimeout, "close a proxied connection on which neither side sent anything for this long")
	var ing ingressFlags
	f.StringVar(&ing.http, "ingress-http", "", "serve the Ingresses' plain HTTP (redirects to HTTPS, ACME HTTP-01 answers) on this address, e.g. :80 or 127.0.0.1:8080 behind pf")
	f.StringVar(&ing.https, "ingress-https", "", "serve the Ingresses over HTTPS on this address, e.g. :443 or 127.0.0.1:8443 behind pf")
	f.StringVar(&ing.directory, "acme-directory", acme.LetsEncrypt, "the ACME directory certificates are ordered from; \"staging\" is Let's Encrypt's staging directory")
	f.StringVar(&ing.dns, "dns-provider", "", "file naming the DNS provider and its credentials (docs/ingress.md): certificates are then obtained over DNS-01 rather than HTTP-01")
	f.StringVar(&ing.roots, "acme-ca-roots", "", "PEM file of extra roots the ACME directory's TLS certificate may chain to (a private CA, Pebble)")
	f.DurationVar(&ing.retryMin, "acme-retry-min", 5*time.Minute, "the first wait after a failed ACME order; each next wait doubles, up to a day (within Let's Encrypt's failed-validation limits)")
	f.DurationVar(&ing.http01Wait, "acme-http01-wait", 0, "how long an HTTP-01 answer published in git is given to reach the other ingress nodes before the CA looks (default two --poll and a second)")
	f.IntVar(&ing.limits.MaxConns, "ingress-max-conns", ingress.DefaultMaxConns, "client connections each ingress listener holds open at once; further clients wait")
	f.DurationVar(&ing.limits.HeaderTimeout, "ingress-header-timeout", ingress.DefaultHeaderTimeout, "how long the ingress waits for a TLS handshake and a request's headers")
	f.DurationVar(&ing.limits.IdleTimeout, "ingress-idle-timeout", ingress.DefaultIdleTimeout, "how long the ingress keeps an idle keep-alive client connection")
	f.DurationVar(&ing.limits.BackendTimeout, "ingress-backend-timeout", ingress.DefaultBackendTimeout, "how long the ingress waits for a backend's response headers before answering 504")
	var fg forgeFlags
	f.StringVar(&fg.kind, "forge-kind", "", "post this node's deploy status on the commits it applies or refuses, to this forge: github, gitea, forgejo or gitlab (docs/forge.md); off when empty")
	f.StringVar(&fg.url, "forge-url", "", "with --forge-kind: the forge's root URL, e.g. https://git.example.com (GitHub: the API root, default "+forge.DefaultGitHubAPI+")")
	f.StringVar(&fg.repo, "forge-repo", "", "with --forge-kind: the cluster repository on the forge, owner/name (GitLab: also the project ID or its full path)")
	f.StringVar(&fg.tokenFile, "forge-token-file", "", "with --forge-kind: file holding the forge token that may write commit statuses (mode 600)")
	f.StringVar(&fg.targetURL, "forge-target-url", "", "with --forge-kind: the link each status carries, e.g. the dashboard's URL")
	var fbsd freebsdFlags
	f.StringVar(&fbsd.pool, "pool", freebsd.DefaultPool, "with --driver freebsd: the ZFS pool whose keel/ dataset holds images, jails and volumes")
	f.StringVar(&fbsd.bridge, "bridge", freebsd.DefaultBridge, "with --driver freebsd: the node's bridge, keel<N>")
	f.StringVar(&fbsd.publicIface, "public-iface", "", "with --driver freebsd: the interface whose ports 80 and 443 pf redirects to the ingress")
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
		metricsLim := netlimit.HTTP{MaxConns: *metricsMaxConns, HeaderTimeout: *headerTimeout, IdleTimeout: *idleTimeout}
		webhookLim := netlimit.HTTP{MaxConns: *webhookMaxConns, HeaderTimeout: *headerTimeout, IdleTimeout: *idleTimeout}
		proxyLim := proxy.Limits{MaxConnsPerService: *proxyPerService, MaxConns: *proxyMax, IdleTimeout: *proxyIdle}
		if err := checkLimits(metricsLim, webhookLim, proxyLim); err != nil {
			return err
		}
		if *maxParallelOps < 1 {
			return fmt.Errorf("--max-parallel-ops: %d: at least one operation must be able to run", *maxParallelOps)
		}
		// Clients of the listeners may never take the descriptors the
		// reconciler, git and the instances need.
		budget := netlimit.Budget{Reserve: fdReserve}
		budget.Add("local API", agent.SocketLimits.MaxConns)
		if *metrics != "" {
			budget.Add("--metrics-max-conns", metricsLim.MaxConns)
		}
		if *webhookListen != "" {
			budget.Add("--webhook-max-conns", webhookLim.MaxConns)
		}
		budget.Add("2 × --proxy-max-conns", proxyLim.FDs())
		if ing.http != "" || ing.https != "" {
			budget.Add("the ingress (--ingress-max-conns)", ing.limits.FDs())
		}
		fdLimit, err := budget.Fit()
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
		if err := agent.ClearListenFiles(abs); err != nil {
			return err
		}
		for _, name := range []string{"pool", "bridge", "public-iface"} {
			if f.Changed(name) && *driverName != "freebsd" {
				return fmt.Errorf("--%s is for --driver freebsd", name)
			}
		}
		driver, err := newDriver(e.ctx, *driverName, abs, logger, fbsd)
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
		if *gossipKey != "" {
			// Read once now, so that a bad key file stops the agent at
			// once rather than when a commit turns gossip on.
			if _, err := gossip.ReadKeys(*gossipKey); err != nil {
				return fmt.Errorf("--gossip-key: %w", err)
			}
			if *gossipKey, err = filepath.Abs(*gossipKey); err != nil {
				return err
			}
		}
		ingressOpts, err := ing.options(f, *reportKey)
		if err != nil {
			return err
		}
		forgeOpts, err := fg.options(f)
		if err != nil {
			return err
		}
		var regConfig []byte
		if *registryConfig != "" {
			if regConfig, err = readSecretFile(*registryConfig, maxRegistryConfig); err != nil {
				return fmt.Errorf("--registry-config: %w", err)
			}
			if _, err := oci.KeychainFromConfig(regConfig); err != nil {
				return fmt.Errorf("--registry-config %s: %w", *registryConfig, err)
			}
		}
		if *maxPulls < 1 || *imageMax < 1 || *imageMaxUnpacked < 1 {
			return errors.New("--max-pulls, --image-max-size and --image-max-unpacked must be positive")
		}
		if *imageGrace < 0 || *imageCacheMax < 0 || *imageMinFree < 0 || *imageMinFree >= 100 {
			return errors.New("--image-gc-grace and --image-cache-max must not be negative, --image-min-free is a percentage from 0 to under 100")
		}
		imageGC := nodeexec.ImageGC{Grace: max(*imageGrace, time.Nanosecond), MaxSize: *imageCacheMax, MinFree: *imageMinFree / 100}
		if *imageMinFree == 0 {
			imageGC.MinFree = -1 // never
		}
		reg := prometheus.NewRegistry()
		a, err := agent.New(agent.Options{
			RegistryConfig: regConfig, MaxPulls: *maxPulls, ImageMaxCompressed: *imageMax, ImageMaxUnpacked: *imageMaxUnpacked, ImageGC: imageGC,
			Ingress: ingressOpts, Forge: forgeOpts,
			Node: *node, StateDir: abs, Driver: driver, Version: Version, Logger: logger, Registry: reg,
			Remote: remote,
			Poll:   *poll, Reconcile: *reconcile, StopGrace: *stopGrace, DisableWatch: *noWatch, Trust: trust, ReportSigner: reportSigner,
			ProxyLimits: proxyLim, MaxParallelOps: *maxParallelOps, GossipKeyFile: *gossipKey,
		})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(e.ctx)
		// The listeners end with ctx; wait for their servers to return.
		var servers []<-chan error
		defer func() {
			cancel()
			for _, done := range servers {
				<-done
			}
		}()
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
			mux := http.NewServeMux()
			mux.Handle("/hook", sync.WebhookHandler(sync.WebhookConfig{
				Secret: secret, Branch: *branch, ReportPrefix: a.ReportPrefix, Trigger: a.Trigger, Logger: logger,
			}))
			done, err := serveLimited(ctx, abs, "webhook", *webhookListen, webhookLim, mux, logger)
			if err != nil {
				return err
			}
			servers = append(servers, done)
		}
		if *metrics != "" {
			done, err := serveLimited(ctx, abs, "metrics", *metrics, metricsLim, a.Handler(), logger)
			if err != nil {
				return err
			}
			servers = append(servers, done)
		}
		if addr := a.IngressAddrs(); addr != nil {
			for name, a := range addr {
				if err := agent.WriteListenFile(abs, name, a); err != nil {
					return err
				}
				logger.Info("ingress listening", "listener", name, "addr", a)
			}
		}
		logger.Info("file descriptors", "limit", fdLimit, "budget", budget.Total())
		return a.Run(ctx)
	}
	return cmd
}

// ingressFlags are the flags of the ingress and its certificates.
type ingressFlags struct {
	http, https, directory, roots, dns string
	http01Wait, retryMin               time.Duration
	limits                             ingress.Limits
}

// options checks the ingress flags and returns the agent's ingress
// options; nil when neither listener is set.
func (g ingressFlags) options(f interface{ Changed(string) bool }, reportKey string) (*agent.IngressOptions, error) {
	if g.http == "" && g.https == "" {
		for _, name := range []string{"acme-directory", "acme-ca-roots", "acme-http01-wait", "acme-retry-min", "dns-provider", "ingress-max-conns", "ingress-header-timeout", "ingress-idle-timeout", "ingress-backend-timeout"} {
			if f.Changed(name) {
				return nil, fmt.Errorf("--%s is for an agent with an ingress (--ingress-http, --ingress-https)", name)
			}
		}
		return nil, nil
	}
	o := &agent.IngressOptions{HTTPAddr: g.http, HTTPSAddr: g.https, Directory: g.directory, HTTP01Wait: g.http01Wait, Limits: g.limits, RetryBase: g.retryMin}
	if o.Directory == "staging" {
		o.Directory = acme.LetsEncryptStaging
	}
	switch l := o.Limits; {
	case l.MaxConns <= 0:
		return nil, errors.New("--ingress-max-conns must be positive")
	case l.HeaderTimeout <= 0 || l.IdleTimeout <= 0 || l.BackendTimeout <= 0:
		return nil, errors.New("--ingress-header-timeout, --ingress-idle-timeout and --ingress-backend-timeout must be positive")
	case g.http01Wait < 0:
		return nil, errors.New("--acme-http01-wait must not be negative")
	case g.retryMin < time.Second:
		return nil, errors.New("--acme-retry-min must be at least a second")
	case g.http == "" && g.dns == "":
		// The CA validates HTTP-01 on port 80 of whichever ingress node
		// the host's DNS names: every one must answer there.
		return nil, errors.New("--ingress-https needs --ingress-http, which answers the CA's HTTP-01 validations (and redirects to HTTPS); or --dns-provider, for DNS-01")
	}
	if g.roots != "" {
		data, err := readConfigFile(g.roots, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("--acme-ca-roots: %w", err)
		}
		o.Roots = x509.NewCertPool()
		if !o.Roots.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("--acme-ca-roots: %s holds no PEM certificate", g.roots)
		}
	}
	if g.dns != "" {
		p, err := dns01.Load(g.dns)
		if err != nil {
			return nil, fmt.Errorf("--dns-provider: %w", err)
		}
		o.DNS = p
	}
	if reportKey != "" {
		id, err := certshare.LoadIdentity(reportKey)
		if err != nil {
			// An ECDSA key signs reports but cannot open what age sealed:
			// the node obtains its own certificates (keel validate warns).
			return o, nil
		}
		o.Identity = id
	}
	return o, nil
}

// forgeFlags are the flags of the commit statuses on the forge.
type forgeFlags struct {
	kind, url, repo, tokenFile, targetURL string
}

// maxTokenFile bounds a token file.
const maxTokenFile = 4 << 10

// maxRegistryConfig bounds --registry-config (a Docker config.json).
const maxRegistryConfig = 1 << 20

// options checks the forge flags and returns the agent's forge options;
// nil without --forge-kind.
func (g forgeFlags) options(f interface{ Changed(string) bool }) (*agent.ForgeOptions, error) {
	if g.kind == "" {
		for _, name := range []string{"forge-url", "forge-repo", "forge-token-file", "forge-target-url"} {
			if f.Changed(name) {
				return nil, fmt.Errorf("--%s is for an agent that posts commit statuses (--forge-kind)", name)
			}
		}
		return nil, nil
	}
	kind, err := forge.ParseKind(g.kind)
	if err != nil {
		return nil, fmt.Errorf("--forge-kind: %w", err)
	}
	switch {
	case g.repo == "":
		return nil, errors.New("--forge-kind needs --forge-repo")
	case g.tokenFile == "":
		return nil, errors.New("--forge-kind needs --forge-token-file")
	case g.url == "" && kind != forge.GitHub:
		return nil, fmt.Errorf("--forge-kind %s needs --forge-url, the forge's root URL", kind)
	}
	if g.targetURL != "" {
		u, err := url.Parse(g.targetURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
			return nil, errors.New("--forge-target-url: want an http(s) URL without credentials")
		}
	}
	data, err := readSecretFile(g.tokenFile, maxTokenFile)
	if err != nil {
		return nil, fmt.Errorf("--forge-token-file: %w", err)
	}
	c, err := forge.New(forge.Config{Kind: kind, URL: g.url, Repo: g.repo, Token: strings.TrimSpace(string(data))})
	if err != nil {
		return nil, fmt.Errorf("--forge-*: %w", err)
	}
	return &agent.ForgeOptions{Poster: c, TargetURL: g.targetURL}, nil
}

// readConfigFile reads a node-local file given by a flag: a regular file
// of at most limit bytes, its size checked before it is read.
func readConfigFile(path string, limit int64) ([]byte, error) {
	return readNodeFile(path, limit, false)
}

// readSecretFile is readConfigFile for a credential: a file that other
// users may read or change is refused too.
func readSecretFile(path string, limit int64) ([]byte, error) {
	return readNodeFile(path, limit, true)
}

func readNodeFile(path string, limit int64, secret bool) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO must not hang the agent's start; the
	// checks below are on what was opened.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file", path)
	case secret && fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("%s has mode %04o: other users may read or change the credential it holds; chmod 600 it", path, fi.Mode().Perm())
	case fi.Size() > limit:
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", path, fi.Size(), limit)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// fdReserve is how many file descriptors the listeners' clients can never
// take: the reconciler's, git's and the instances' own.
const fdReserve = 256

func checkLimits(metrics, webhook netlimit.HTTP, p proxy.Limits) error {
	if err := metrics.Check(); err != nil {
		return fmt.Errorf("--metrics-max-conns, --http-header-timeout, --http-idle-timeout: %w", err)
	}
	if err := webhook.Check(); err != nil {
		return fmt.Errorf("--webhook-max-conns: %w", err)
	}
	switch {
	case p.MaxConnsPerService <= 0:
		return errors.New("--proxy-max-conns-per-service must be positive")
	case p.MaxConns <= 0:
		return errors.New("--proxy-max-conns must be positive")
	case p.IdleTimeout <= 0:
		return errors.New("--proxy-idle-timeout must be positive")
	}
	return nil
}

// serveLimited binds addr (port 0 picks a free port), records the address
// bound in <state>/listen/<name>, and serves handler there within lim until
// ctx ends; the channel it returns is closed once the server has stopped.
func serveLimited(ctx context.Context, stateDir, name, addr string, lim netlimit.HTTP, handler http.Handler, logger *slog.Logger) (<-chan error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s-listen: %w", name, err)
	}
	if err := agent.WriteListenFile(stateDir, name, l.Addr().String()); err != nil {
		l.Close()
		return nil, err
	}
	srv, served := lim.Serve(l, handler)
	done := make(chan error)
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			_ = srv.Close()
			<-served
		case err := <-served:
			logger.Error(name+" listener stopped", "err", err)
		}
	}()
	logger.Info(name, "listen", l.Addr().String(), "max_conns", lim.MaxConns)
	return done, nil
}

// freebsdFlags are the agent flags of the freebsd driver.
type freebsdFlags struct {
	pool, bridge, publicIface string
}

func newDriver(ctx context.Context, name, stateDir string, logger *slog.Logger, fbsd freebsdFlags) (nodeexec.Driver, error) {
	switch name {
	case "process":
		return process.New(process.Options{StateDir: stateDir, Logger: logger})
	case "fake":
		return fake.New(), nil
	case "freebsd":
		return newFreeBSDDriver(ctx, stateDir, logger, fbsd)
	}
	return nil, fmt.Errorf("--driver %q: want process, fake or freebsd", name)
}

// newFreeBSDDriver runs FreeBSD's commands by their absolute paths, with
// an environment of their own (the C locale, whose output the driver
// parses); the agent runs its host checks. Two environment variables
// point it at the simulator's executables instead, for the end-to-end
// tests on any OS: KEEL_FREEBSD_BINDIR (the commands) and
// KEEL_FREEBSD_ROOT (the simulated file system's root).
func newFreeBSDDriver(ctx context.Context, stateDir string, logger *slog.Logger, fbsd freebsdFlags) (nodeexec.Driver, error) {
	runner := freebsd.ExecRunner{
		BinDir: os.Getenv("KEEL_FREEBSD_BINDIR"),
		Env:    []string{"PATH=/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL=C"},
	}
	if tz, ok := os.LookupEnv("TZ"); ok {
		runner.Env = append(runner.Env, "TZ="+tz)
	}
	switch {
	case runner.BinDir != "":
		runner.Env = append(os.Environ(), "LC_ALL=C")
	case runtime.GOOS != "freebsd":
		return nil, errors.New("--driver freebsd runs on FreeBSD only")
	}
	d, err := freebsd.New(ctx, freebsd.Options{
		Runner: runner, Root: os.Getenv("KEEL_FREEBSD_ROOT"), StateDir: stateDir,
		Pool: fbsd.pool, Bridge: fbsd.bridge, PublicIface: fbsd.publicIface, Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	return d, nil
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
