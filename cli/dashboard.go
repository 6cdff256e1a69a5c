package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/dashboard"
	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/sync"
)

func (e *env) dashboardCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve a read-only web page of the cluster's status, from the repository alone",
		Long: `Dashboard serves the status keel status shows as a web page: the headline
(converged at the tip, or what is missing) in green or red, the tip commit
with a link to the forge, nodes, services, instances that need attention,
ingress certificates, volumes, the recent commits and how far each got, and a
page per node with its report. /api/status serves the keel status -o json
document, /healthz answers "ok".

It reads the repository (a local clone, or a URL fetched read-only into a
cache directory) in the background every --refresh, never per request, and
keeps showing the last status read, with its age and the error, while a
read fails. It answers GET and HEAD only, loads no script, and needs read
access only: give it a read-only token or deploy key.

Ctrl-C stops it. Exit status: 0 when stopped, 2 usage or I/O error.`,
		Example: `  keel dashboard --repo ./cluster --listen 127.0.0.1:8080
  keel dashboard --repo https://git.example.com/ops/cluster.git --token-file /etc/keel/read-token --listen :8080 --refresh 30s`,
		Args: cobra.NoArgs,
	}
	src := addStatusSourceFlags(cmd)
	listen := cmd.Flags().String("listen", "127.0.0.1:8080", "the address to serve on (host:port); put a reverse proxy in front for TLS and access control")
	refresh := cmd.Flags().Duration("refresh", dashboard.DefaultRefresh, "how often to read the repository again (and the page to reload)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *refresh < time.Second {
			return fmt.Errorf("--refresh %s: want at least 1s", *refresh)
		}
		logger := slog.New(slog.NewTextHandler(e.stderr, nil))
		source, err := src.dashboardSource(e.ctx)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		srv, err := startDashboard(ln, dashboard.Options{Source: source, Refresh: *refresh, RepoURL: src.webURL(), Version: Version, Logger: logger}, logger)
		if err != nil {
			ln.Close()
			return err
		}
		fmt.Fprintf(e.stdout, "keel dashboard: serving %s on %s (Ctrl-C stops)\n", src.repo, srv.URL)
		select {
		case <-e.ctx.Done():
		case err = <-srv.done:
			srv.done <- err // for stop
		}
		if stopErr := srv.stop(); err == nil {
			err = stopErr
		}
		return err
	}
	return cmd
}

// dashboardSource reads the status as keel status does (a local clone is
// opened afresh at each read, status.ReadDir).
func (s *statusSource) dashboardSource(ctx context.Context) (dashboard.Source, error) {
	read, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (*status.Status, error) {
		snap, err := read(ctx)
		if err != nil {
			return nil, err
		}
		return status.Compute(status.Input{Snapshot: snap, Now: time.Now()}), nil
	}, nil
}

// webURL is the URL the dashboard derives forge links from: --repo when it
// is a URL, else the local clone's origin (dashboard.CommitURL links only
// an https or a known forge's ssh URL).
func (s *statusSource) webURL() string {
	if status.IsURL(s.repo) {
		return s.repo
	}
	dir, _ := sync.LocalPath(s.repo)
	g, err := status.OpenDir(dir)
	if err != nil {
		return ""
	}
	origin, err := g.Git.Remote("origin")
	if err != nil || len(origin.Config().URLs) == 0 {
		return ""
	}
	return origin.Config().URLs[0]
}

// servingDashboard is a dashboard serving on a listener; stop shuts it
// down and waits for its goroutines.
type servingDashboard struct {
	URL  string
	d    *dashboard.Dashboard
	srv  *http.Server
	done chan error // the server's end, one value
}

// startDashboard serves a dashboard over opts on ln.
func startDashboard(ln net.Listener, opts dashboard.Options, logger *slog.Logger) (*servingDashboard, error) {
	d, err := dashboard.New(opts)
	if err != nil {
		return nil, err
	}
	s := &servingDashboard{URL: "http://" + ln.Addr().String() + "/", d: d, srv: dashboard.NewServer(d, logger), done: make(chan error, 1)}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s, nil
}

// stop ends the server (letting requests in flight finish for a few
// seconds), then the dashboard's reads, and waits for both.
func (s *servingDashboard) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; err == nil {
		err = serr
	}
	s.d.Close()
	return err
}

// startDemoDashboard serves the dashboard of the demo's repository on a
// free port of 127.0.0.1 and prints its URL with the keel status command.
func (e *env) startDemoDashboard(bare, keel string) (*servingDashboard, error) {
	src := &statusSource{repo: bare, branch: "main"}
	source, err := src.dashboardSource(e.ctx)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, nil))
	// A short refresh: the demo is for watching a change land.
	dash, err := startDashboard(ln, dashboard.Options{Source: source, Refresh: 2 * time.Second, Version: Version, Logger: logger}, logger)
	if err != nil {
		ln.Close()
		return nil, err
	}
	fmt.Fprintf(e.stdout, `The whole cluster at a glance, read-only from the repository:
  %s status --repo %s
  dashboard: %s

`, shellQuote(keel), shellQuote(bare), dash.URL)
	return dash, nil
}
