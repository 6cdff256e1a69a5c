// Package dashboard serves a read-only web page over the cluster's read
// model (package status): the headline, the tip commit, nodes, services,
// instances needing attention, ingress certificates, volumes, history and
// warnings, a page per node with its report, and /api/status with the
// document keel status -o json prints.
//
// It only reads: its Source reads the repository (status.Fetch never
// pushes), in the background at a fixed interval and never per request, and
// every handler answers GET and HEAD only. It must never hold a credential
// that can write, render anything from reports or specs unescaped, or load
// a script.
package dashboard

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-dev/keel/status"
)

// Source reads the cluster's current status. The Dashboard calls it from
// one goroutine only, never two at once.
type Source func(ctx context.Context) (*status.Status, error)

// Defaults.
const (
	DefaultRefresh = 10 * time.Second
	DefaultTimeout = time.Minute
)

// Options configure a Dashboard.
type Options struct {
	// Source reads the status; required.
	Source Source
	// Refresh is how long after a read ends the next one starts
	// (DefaultRefresh when zero); the page reloads itself as often.
	Refresh time.Duration
	// Timeout bounds each read (DefaultTimeout when zero).
	Timeout time.Duration
	// RepoURL is the cluster repository's URL: when it names a forge
	// (CommitURL), commits link to their page there.
	RepoURL string
	// Version is keel's version, shown in the footer.
	Version string
	// Logger logs failed reads (once per distinct error) and recoveries.
	Logger *slog.Logger
	// Now is the clock for the ages the page shows (time.Now when nil).
	Now func() time.Time
}

// Dashboard is the web page's http.Handler. It owns the goroutine that
// reads the status; Close stops it and waits. ServeHTTP is safe for
// concurrent use and never reads the repository itself.
type Dashboard struct {
	opts    Options
	handler http.Handler

	// state is the last read's outcome, swapped whole: handlers load it
	// without locking and never modify it.
	state atomic.Pointer[state]

	loaded    chan struct{} // closed once the first read has ended
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the refresh goroutine
	closeOnce sync.Once
}

// state is what the handlers show.
type state struct {
	// st is the last status read (nil until a read succeeds); read is
	// when that read ended.
	st   *status.Status
	read time.Time
	// err is the last read's error (nil when it succeeded), at errTime;
	// st is then older than errTime.
	err     error
	errTime time.Time
}

// New returns a Dashboard and starts reading the status in the background.
func New(opts Options) (*Dashboard, error) {
	if opts.Source == nil {
		return nil, errors.New("dashboard: no status source")
	}
	if opts.Refresh < 0 || opts.Timeout < 0 {
		return nil, errors.New("dashboard: negative refresh interval or timeout")
	}
	opts.Refresh = cmp.Or(opts.Refresh, DefaultRefresh)
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Dashboard{opts: opts, loaded: make(chan struct{}), cancel: cancel}
	d.state.Store(&state{})
	d.handler = d.routes()
	d.wg.Go(func() { d.run(ctx) })
	return d, nil
}

// Loaded is closed once the first read has ended, successfully or not.
func (d *Dashboard) Loaded() <-chan struct{} { return d.loaded }

// Close stops the background reads and waits for the one in progress to
// end. The handler still serves the last status afterwards.
func (d *Dashboard) Close() {
	d.closeOnce.Do(func() {
		d.cancel()
		d.wg.Wait()
	})
}

// run reads the status now and then Refresh after each read ends, so that
// reads never overlap, until ctx ends.
func (d *Dashboard) run(ctx context.Context) {
	var lastErr string
	for first := true; ; first = false {
		err := d.refresh(ctx)
		if first {
			close(d.loaded)
		}
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && err.Error() != lastErr:
			d.opts.Logger.Warn("dashboard: cannot read the cluster's status; showing the last one read", "err", err)
			lastErr = err.Error()
		case err == nil && lastErr != "":
			d.opts.Logger.Info("dashboard: reading the cluster's status again")
			lastErr = ""
		}
		t := time.NewTimer(d.opts.Refresh)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// refresh reads the status once and publishes the outcome.
func (d *Dashboard) refresh(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	st, err := d.opts.Source(rctx)
	cancel()
	if err == nil && st == nil {
		err = errors.New("the status source returned nothing")
	}
	now := d.opts.Now()
	prev := d.state.Load()
	next := &state{st: st, read: now}
	if err != nil {
		if ctx.Err() != nil {
			// Closing: the read was cut short, not failed.
			return err
		}
		next = &state{st: prev.st, read: prev.read, err: err, errTime: now}
	}
	d.state.Store(next)
	return err
}
