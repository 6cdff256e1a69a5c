// Package proxy is the node's L4 data plane: for every Service it listens on
// the Service's VIP and port and relays each TCP connection to one of the
// Service's endpoints, round-robin, skipping endpoints that just failed.
//
// Listeners set SO_REUSEPORT, so several agents on one machine (the process
// driver's loopback cluster) can serve the same VIP:port and the kernel
// spreads connections between them. The package only proxies: it does not
// add the VIP to an interface, choose endpoints or read the plan; the
// reconciler does that and hands it the result through Manager.Set.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-dev/keel/internal/reuseport"
	"github.com/keel-dev/keel/internal/roundrobin"
)

// Defaults for Options.
const (
	DefaultDialTimeout  = time.Second
	DefaultUnhealthyFor = 2 * time.Second
	// DefaultMaxConnsPerService, DefaultMaxConns and DefaultIdleTimeout
	// bound what clients can hold (each relayed connection holds two file
	// descriptors: the client's and the backend's).
	DefaultMaxConnsPerService = 1024
	DefaultMaxConns           = 2048
	DefaultIdleTimeout        = time.Hour
)

// ErrClosed is returned by Set once the Manager is closed.
var ErrClosed = errors.New("proxy: manager closed")

// Service is one proxied Service: connections to VIP:Port are relayed to
// Endpoints.
type Service struct {
	Name      string
	VIP       netip.Addr
	Port      int
	Endpoints []netip.AddrPort
}

func (s Service) addr() netip.AddrPort { return netip.AddrPortFrom(s.VIP, uint16(s.Port)) }

func (s Service) validate() error {
	switch {
	case s.Name == "":
		return errors.New("empty name")
	case !s.VIP.IsValid():
		return errors.New("no VIP")
	case s.Port < 1 || s.Port > 65535:
		return fmt.Errorf("port %d out of range 1-65535", s.Port)
	}
	for _, ep := range s.Endpoints {
		if !ep.IsValid() || ep.Port() == 0 {
			return fmt.Errorf("invalid endpoint %q", ep)
		}
	}
	return nil
}

// Options configure a Manager. The zero value is usable.
type Options struct {
	// Logger receives listener starts and stops, endpoints marked
	// unhealthy and per-connection failures (at debug level). Nil discards.
	Logger *slog.Logger
	// DialTimeout bounds each connection attempt to an endpoint; a
	// connection makes at most two. Default DefaultDialTimeout.
	DialTimeout time.Duration
	// UnhealthyFor is how long an endpoint whose dial failed is skipped by
	// round-robin (unless every endpoint is skipped). Default
	// DefaultUnhealthyFor.
	UnhealthyFor time.Duration
	// Metrics, when set, receives the proxy's metrics (see NewMetrics).
	Metrics *Metrics
	// Limits bound the connections clients can hold open.
	Limits Limits
}

// Limits bound what the clients of the proxies can hold. Zero fields take
// the defaults.
type Limits struct {
	// MaxConnsPerService is how many client connections one Service holds
	// open at once; further clients wait in the kernel's accept queue.
	// Default DefaultMaxConnsPerService.
	MaxConnsPerService int
	// MaxConns is how many client connections all Services hold open at
	// once; a client over it is reset at once. Default DefaultMaxConns.
	MaxConns int
	// IdleTimeout closes a relayed connection on which neither side sent
	// a byte for that long. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
}

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxConnsPerService <= 0 {
		l.MaxConnsPerService = DefaultMaxConnsPerService
	}
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	return l
}

// FDs is the most file descriptors the proxies' clients can make the
// process hold: two per relayed connection.
func (l Limits) FDs() int { return 2 * l.WithDefaults().MaxConns }

// Manager runs the listeners and relays of a set of Services. Its methods
// are safe for concurrent use.
type Manager struct {
	log          *slog.Logger
	dialer       net.Dialer
	unhealthyFor time.Duration
	metrics      *Metrics
	limits       Limits
	// slots holds one token per client connection open, all Services
	// together (Limits.MaxConns).
	slots chan struct{}
	// now returns a monotonic time in nanoseconds; tests replace it.
	now func() int64

	// ctx is cancelled by Close so that dials in flight give up at once.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex // guards services and closed; held through Set and Close
	services map[string]*service
	closed   bool

	connsMu sync.Mutex
	conns   map[net.Conn]struct{} // every open client and backend conn; nil once closed

	// wg counts every goroutine the Manager starts: accept loops, relays
	// and their second copy direction.
	wg sync.WaitGroup
}

// service is a running listener and its current endpoints.
type service struct {
	name      string
	addr      netip.AddrPort
	ln        *net.TCPListener
	endpoints atomic.Pointer[roundrobin.Set] // swapped whole by Set
	next      atomic.Uint64                  // round-robin counter
	metrics   serviceMetrics
	// slots holds one token per client connection of this Service open
	// (Limits.MaxConnsPerService); closed listeners free their waiters
	// through done.
	slots chan struct{}
	done  chan struct{}
}

// New returns a Manager that proxies nothing until Set is called.
func New(opts Options) *Manager {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.UnhealthyFor <= 0 {
		opts.UnhealthyFor = DefaultUnhealthyFor
	}
	if opts.Metrics == nil {
		opts.Metrics = newMetrics() // unregistered: keeps the code free of nil checks
	}
	limits := opts.Limits.WithDefaults()
	epoch := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{
		log:          log,
		dialer:       net.Dialer{Timeout: opts.DialTimeout},
		unhealthyFor: opts.UnhealthyFor,
		metrics:      opts.Metrics,
		limits:       limits,
		slots:        make(chan struct{}, limits.MaxConns),
		now:          func() int64 { return int64(time.Since(epoch)) },
		ctx:          ctx,
		cancel:       cancel,
		services:     map[string]*service{},
		conns:        map[net.Conn]struct{}{},
	}
}

// Set makes the Manager proxy exactly services. It opens listeners for new
// Services, closes the listeners of Services no longer listed (their
// established connections go on until they end), replaces the listener of a
// Service whose VIP or port changed, and swaps the endpoints of the others
// in place: connections and listeners are untouched, and the passive health
// of endpoints still listed is kept.
//
// The returned error lists every Service that is invalid, duplicated, or
// whose listener could not be opened; the others are applied all the same.
// An invalid Service keeps what it had; a Service whose listener failed is
// not running and is tried again by the next Set.
func (m *Manager) Set(services []Service) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}

	var errs []error
	sorted := slices.Clone(services)
	slices.SortStableFunc(sorted, func(a, b Service) int { return strings.Compare(a.Name, b.Name) })
	want := make(map[string]Service, len(sorted))
	invalid := map[string]bool{}
	byAddr := map[netip.AddrPort]string{}
	for _, s := range sorted {
		if err := s.validate(); err != nil {
			errs = append(errs, fmt.Errorf("service %q: %w", s.Name, err))
			invalid[s.Name] = true
			continue
		}
		if _, dup := want[s.Name]; dup {
			errs = append(errs, fmt.Errorf("service %q: listed twice; the first is used", s.Name))
			continue
		}
		if other, dup := byAddr[s.addr()]; dup {
			errs = append(errs, fmt.Errorf("service %q: %s is already %q's", s.Name, s.addr(), other))
			invalid[s.Name] = true
			continue
		}
		want[s.Name] = s
		byAddr[s.addr()] = s.Name
	}

	// Close first, then open: a VIP:port that moves from one Service to
	// another must never be bound by both (with SO_REUSEPORT, both binds
	// would succeed and split its connections).
	for name, r := range m.services {
		if invalid[name] {
			continue
		}
		if s, ok := want[name]; !ok || s.addr() != r.addr {
			m.stop(r)
			delete(m.services, name)
		}
	}
	for _, s := range sorted {
		s, ok := want[s.Name]
		if !ok {
			continue
		}
		if r, ok := m.services[s.Name]; ok {
			r.setEndpoints(s.Endpoints)
			continue
		}
		r, err := m.start(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("service %q: %w", s.Name, err))
			continue
		}
		m.services[s.Name] = r
	}
	return errors.Join(errs...)
}

// Close closes every listener and every connection, and returns once every
// goroutine of the Manager has ended. The Manager cannot be used again.
func (m *Manager) Close() {
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		for _, r := range m.services {
			m.stop(r)
		}
		m.services = nil
		m.cancel()
		m.connsMu.Lock()
		conns := m.conns
		m.conns = nil
		m.connsMu.Unlock()
		for c := range conns {
			c.Close()
		}
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// start opens s's listener and starts its accept loop.
func (m *Manager) start(s Service) (*service, error) {
	ln, err := reuseport.Listen(m.ctx, s.addr().String())
	if err != nil {
		return nil, err
	}
	r := &service{
		name:    s.Name,
		addr:    s.addr(),
		ln:      ln,
		metrics: m.metrics.forService(s.Name),
		slots:   make(chan struct{}, m.limits.MaxConnsPerService),
		done:    make(chan struct{}),
	}
	r.setEndpoints(s.Endpoints)
	m.log.Info("proxy listening", "service", s.Name, "addr", r.addr, "endpoints", len(s.Endpoints))
	m.wg.Go(func() { m.serve(r) })
	return r, nil
}

// stop closes r's listener; its accept loop then ends by itself.
func (m *Manager) stop(r *service) {
	r.ln.Close()
	close(r.done)
	m.metrics.forget(r.name)
	m.log.Info("proxy stopped", "service", r.name, "addr", r.addr)
}

func (r *service) setEndpoints(addrs []netip.AddrPort) {
	r.endpoints.Store(roundrobin.NewSet(addrs, r.endpoints.Load()))
	r.metrics.endpoints.Set(float64(len(addrs)))
}

// serve accepts connections until r's listener is closed.
func (m *Manager) serve(r *service) {
	var delay time.Duration
	for {
		// Wait for a free slot of the Service before accepting: clients
		// over its limit wait in the kernel's queue, holding no
		// descriptor of the agent.
		select {
		case r.slots <- struct{}{}:
		case <-r.done:
			return
		}
		c, err := r.ln.AcceptTCP()
		if err != nil {
			<-r.slots
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or a connection aborted before it
			// was accepted: wait a little rather than spin (as net/http).
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			m.log.Warn("proxy accept failed", "service", r.name, "addr", r.addr, "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-m.ctx.Done():
				t.Stop()
			}
			continue
		}
		delay = 0
		select {
		case m.slots <- struct{}{}:
		default:
			// Every Service together holds MaxConns: reset this
			// client at once rather than take one more descriptor.
			<-r.slots
			r.metrics.rejected.Inc()
			c.SetLinger(0)
			c.Close()
			continue
		}
		m.wg.Go(func() {
			defer func() { <-m.slots; <-r.slots }()
			m.handle(r, c)
		})
	}
}

// track records c so that Close can close it; it reports false, and c must
// be closed, once the Manager is closed.
func (m *Manager) track(c net.Conn) bool {
	m.connsMu.Lock()
	defer m.connsMu.Unlock()
	if m.conns == nil {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *Manager) untrack(c net.Conn) {
	m.connsMu.Lock()
	defer m.connsMu.Unlock()
	if m.conns != nil {
		delete(m.conns, c)
	}
}
