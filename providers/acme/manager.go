package acme

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	stdsync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keel-dev/keel/providers"
)

// Obtainer runs one ACME order for a host; *Issuer is one.
type Obtainer interface {
	Obtain(ctx context.Context, host, email string, s Solver) (*providers.Bundle, error)
}

// Want is a host whose certificate the Manager keeps current.
type Want struct {
	Host  string
	Email string // the ACME account's contact, if the order registers it
	// Current is the certificate this node serves for Host now (the
	// shared one, which another node may have issued), nil if none. The
	// Manager renews it when it is due, and keeps the newer of it and
	// the last one it issued itself.
	Current *providers.Bundle
	Solver  Solver
}

// HostStatus is what the Manager knows of one host's certificate.
type HostStatus struct {
	Host string
	// NotAfter, Issuer and Serial describe the current certificate: zero
	// when there is none.
	NotAfter time.Time
	Issuer   string
	Serial   string
	// LastError is the last order's failure, "" once one succeeds or
	// another node's certificate makes an order unnecessary.
	LastError string
	// Failures counts the orders that failed in a row.
	Failures int
	// LastAttempt is when the last order ended.
	LastAttempt time.Time
	// NextAttempt is when the next order starts: the certificate's
	// renewal time, or the end of the backoff after a failure. Zero while
	// an order runs or waits for its turn.
	NextAttempt time.Time
}

// ManagerOptions configures a Manager.
type ManagerOptions struct {
	Issuer Obtainer // required
	// OnIssued receives every certificate the Manager obtains, from the
	// host's goroutine: never twice at once for one host, possibly at
	// once for two. It should publish and serve it and return.
	OnIssued func(*providers.Bundle)
	// Registry, if set, gets keel_certificate_renewals_total. (The
	// expiry of the certificate served is its server's to export: the
	// agent's, on every node that serves one, not only on those that
	// order.)
	Registry prometheus.Registerer
	Logger   *slog.Logger // slog.Default() if nil
	// Now is the clock that decides when a certificate is due; time.Now
	// if nil. Waits are real time: after moving an injected clock, call
	// Set to have every host look again.
	Now func() time.Time
	// MaxConcurrent bounds the orders running at once; 2 if zero.
	MaxConcurrent int
	// RetryBase is the first wait after a failed order, RetryMax the
	// longest; each wait doubles, jittered by ±50 %: 5 min and 24 h if
	// zero, which keeps a failing host within Let's Encrypt's limit of 5
	// failed validations per hour. A longer Retry-After from the CA wins.
	RetryBase, RetryMax time.Duration
	// OrderTimeout bounds one order, CleanUp aside; 10 min if zero.
	OrderTimeout time.Duration
}

// Manager keeps the certificates of a set of hosts current, each host on
// a goroutine of its own, off the caller's loop: one host's failure never
// delays another's order beyond the MaxConcurrent bound. A failed order
// is retried with backoff while the current certificate stays as it is.
// Its methods are safe for concurrent use; Close stops every goroutine
// and waits for them.
type Manager struct {
	opts    ManagerOptions
	log     *slog.Logger
	metrics *metrics
	sem     chan struct{} // one slot per running order
	wg      stdsync.WaitGroup

	mu    stdsync.Mutex // guards hosts, leaving and closed, and each host's fields marked so
	hosts map[string]*host
	// leaving holds the done channels of removed hosts' goroutines, which
	// may still be cleaning up a challenge: a host added again waits for
	// its predecessor before it presents one of its own.
	leaving map[string]chan struct{}
	closed  bool
}

// host is one host's state. Its goroutine owns the order; want, current
// and status are shared with Set and Status under Manager.mu.
type host struct {
	name   string
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // one slot: Set's wake-ups collapse
	done   chan struct{} // closed when the goroutine returns

	want    Want              // mu
	current *providers.Bundle // mu: the newer of want.Current and the last issued
	status  HostStatus        // mu
}

// NewManager returns a Manager with no hosts.
func NewManager(opts ManagerOptions) (*Manager, error) {
	if opts.Issuer == nil {
		return nil, errors.New("acme: ManagerOptions.Issuer is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 2
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = 5 * time.Minute
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 24 * time.Hour
	}
	opts.RetryMax = max(opts.RetryMax, opts.RetryBase)
	if opts.OrderTimeout <= 0 {
		opts.OrderTimeout = 10 * time.Minute
	}
	m := &Manager{
		opts:    opts,
		log:     opts.Logger,
		metrics: newMetrics(),
		sem:     make(chan struct{}, opts.MaxConcurrent),
		hosts:   map[string]*host{},
		leaving: map[string]chan struct{}{},
	}
	if opts.Registry != nil {
		if err := m.metrics.register(opts.Registry); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Set makes wants the hosts the Manager keeps current: it starts the new
// ones, updates the others (and has each look again whether its
// certificate is due) and cancels the hosts not in wants. It does not
// wait for an order.
func (m *Manager) Set(wants []Want) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for name, done := range m.leaving {
		select {
		case <-done:
			delete(m.leaving, name)
		default:
		}
	}
	seen := map[string]bool{}
	for _, w := range wants {
		if w.Host == "" || w.Solver == nil || seen[w.Host] {
			continue
		}
		seen[w.Host] = true
		h := m.hosts[w.Host]
		if h == nil {
			h = m.start(w.Host, m.leaving[w.Host])
			delete(m.leaving, w.Host)
		}
		h.want = w
		if w.Current != nil && w.Current.Host == w.Host {
			h.current = newer(h.current, w.Current)
		}
		h.setCurrentLocked(m)
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	for name, h := range m.hosts {
		if !seen[name] {
			h.cancel()
			delete(m.hosts, name)
			m.leaving[name] = h.done
			m.metrics.forget(name)
		}
	}
}

// start starts the goroutine of a host; m.mu is held. prev is the done
// channel of an earlier goroutine for the same name, still cleaning up.
func (m *Manager) start(name string, prev chan struct{}) *host {
	ctx, cancel := context.WithCancel(context.Background())
	h := &host{
		name: name, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	h.status.Host = name
	m.hosts[name] = h
	m.wg.Add(1)
	go m.run(h, prev)
	return h
}

// newer returns the bundle that expires later (a when equal).
func newer(a, b *providers.Bundle) *providers.Bundle {
	switch {
	case a == nil:
		return b
	case b == nil || !b.NotAfter.After(a.NotAfter):
		return a
	}
	return b
}

// setCurrentLocked updates the status from h.current; m.mu is held.
func (h *host) setCurrentLocked(m *Manager) {
	if c := h.current; c != nil {
		h.status.NotAfter, h.status.Issuer, h.status.Serial = c.NotAfter, c.Issuer, c.Serial
	}
}

// Forget drops the certificate the Manager holds as host's current (one
// withdrawn: its shared copy deleted to force a new key), so that it is
// due at once: an order starts unless the next Set brings another.
func (m *Manager) Forget(host string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.hosts[host]
	if h == nil {
		return
	}
	h.current = nil
	h.want.Current = nil
	h.status.NotAfter, h.status.Issuer, h.status.Serial = time.Time{}, "", ""
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Status returns every host's status, sorted by host.
func (m *Manager) Status() []HostStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]HostStatus, 0, len(m.hosts))
	for _, h := range m.hosts {
		out = append(out, h.status)
	}
	slices.SortFunc(out, func(a, b HostStatus) int { return cmp.Compare(a.Host, b.Host) })
	return out
}

// Close cancels every host's order and waits for every goroutine. The
// Manager takes no more hosts.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	for _, h := range m.hosts {
		h.cancel()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// maxWait bounds a wait for a renewal time, so a host looks again at
// least this often whatever happened to the clock meanwhile (a suspended
// machine, a stepped clock).
const maxWait = time.Hour

// run is a host's goroutine: it waits until the certificate is due, runs
// an order, and starts over, until the host is cancelled.
func (m *Manager) run(h *host, prev chan struct{}) {
	defer m.wg.Done()
	defer close(h.done)
	if prev != nil {
		select {
		case <-prev:
		case <-h.ctx.Done():
			return
		}
	}
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = m.opts.RetryBase
	retry.MaxInterval = m.opts.RetryMax
	retry.Multiplier = 2
	retry.RandomizationFactor = 0.5
	retry.MaxElapsedTime = 0
	retry.Reset()
	var notBefore time.Time // after a failure: no order before this
	timer := time.NewTimer(maxWait)
	defer timer.Stop()
	for {
		now := m.opts.Now()
		m.mu.Lock()
		want, cur := h.want, h.current
		dueAt := now
		if cur != nil && cur.NotAfter.After(now) {
			dueAt = cur.RenewAt()
		}
		if dueAt.After(now) && !notBefore.IsZero() {
			// A certificate that is not due arrived (another node renewed
			// it): the failures no longer matter.
			notBefore = time.Time{}
			retry.Reset()
			h.status.LastError, h.status.Failures = "", 0
		}
		if notBefore.After(dueAt) {
			dueAt = notBefore
		}
		if dueAt.After(now) {
			h.status.NextAttempt = dueAt
		} else {
			h.status.NextAttempt = time.Time{}
		}
		m.mu.Unlock()

		if dueAt.After(now) {
			timer.Reset(min(dueAt.Sub(now), maxWait))
			select {
			case <-h.ctx.Done():
				return
			case <-h.wake:
				timer.Stop() // Go 1.23 timers: no stale tick after Stop or Reset
			case <-timer.C:
			}
			continue
		}

		select {
		case m.sem <- struct{}{}:
		case <-h.ctx.Done():
			return
		}
		b, err := m.obtain(h.ctx, want)
		<-m.sem
		now = m.opts.Now()

		m.mu.Lock()
		if h.ctx.Err() != nil {
			// Removed meanwhile: its metrics are gone, leave them so.
			m.mu.Unlock()
			return
		}
		h.status.LastAttempt = now
		if err != nil {
			wait := min(retry.NextBackOff(), m.opts.RetryMax)
			var ce *Error
			if errors.As(err, &ce) && ce.RetryAfter > wait {
				wait = ce.RetryAfter
			}
			notBefore = now.Add(wait)
			h.status.LastError = err.Error()
			h.status.Failures++
			failures := h.status.Failures
			m.metrics.renewals.WithLabelValues(h.name, resultFailed).Inc()
			m.mu.Unlock()
			m.log.Warn("obtaining a certificate failed; the current one stays",
				"host", h.name, "failures", failures, "retry_in", wait.Round(time.Millisecond), "err", err)
			continue
		}
		notBefore = time.Time{}
		retry.Reset()
		h.current = newer(b, h.current)
		h.status.LastError, h.status.Failures = "", 0
		h.setCurrentLocked(m)
		m.metrics.renewals.WithLabelValues(h.name, resultIssued).Inc()
		m.mu.Unlock()
		m.log.Info("obtained a certificate", "host", h.name, "serial", b.Serial,
			"not_after", b.NotAfter.Format(time.RFC3339))
		if m.opts.OnIssued != nil {
			m.opts.OnIssued(b)
		}
	}
}

// obtain runs one order with its own timeout, and checks that the CA
// answered for the host asked.
func (m *Manager) obtain(ctx context.Context, w Want) (*providers.Bundle, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.OrderTimeout)
	defer cancel()
	b, err := m.opts.Issuer.Obtain(ctx, w.Host, w.Email, w.Solver)
	if err != nil {
		return nil, err
	}
	if b == nil || b.Host != w.Host {
		return nil, fmt.Errorf("acme: the issuer returned no certificate for %s", w.Host)
	}
	return b, nil
}

// The values of keel_certificate_renewals_total's result label.
const (
	resultIssued = "issued"
	resultFailed = "failed"
)

type metrics struct {
	renewals *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_certificate_renewals_total",
			Help: "ACME orders for a host's certificate, by result (issued, failed).",
		}, []string{"host", "result"}),
	}
}

func (mt *metrics) register(reg prometheus.Registerer) error {
	if err := reg.Register(mt.renewals); err != nil {
		return fmt.Errorf("acme: registering metrics: %w", err)
	}
	return nil
}

// forget drops a host's series.
func (mt *metrics) forget(host string) {
	mt.renewals.DeletePartialMatch(prometheus.Labels{"host": host})
}
