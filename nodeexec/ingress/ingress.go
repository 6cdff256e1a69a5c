// Package ingress is the node's HTTPS data plane for the cluster's Ingress
// specs: an HTTPS listener that picks each host's certificate by SNI and
// reverse-proxies requests by host and path prefix to the backend Service's
// endpoints, and an HTTP listener that answers ACME HTTP-01 challenges and
// redirects everything else to HTTPS.
//
// The package only serves: it does not read the plan, choose endpoints,
// obtain certificates or answer for the challenges it serves. The agent
// hands it the route table (SetRoutes), and the certificate and challenge
// stores (Certs, Challenges) belong to the certificate manager.
//
// Listeners set SO_REUSEPORT (internal/reuseport), like the service
// proxies', so several agents on one machine can share an address.
package ingress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-dev/keel/internal/netlimit"
	"github.com/keel-dev/keel/internal/reuseport"
)

// Certs gives the certificate to present for a host. Certificate is called
// at every TLS handshake, from many goroutines at once, and must be fast
// (a map lookup); it returns nil when there is no certificate for host yet,
// and the handshake then fails with an unrecognized_name alert.
type Certs interface {
	Certificate(host string) *tls.Certificate
}

// Challenges gives the key authorization for an ACME HTTP-01 token, which
// the HTTP listener serves at /.well-known/acme-challenge/<token> for any
// host. KeyAuthorization is called from many goroutines at once.
type Challenges interface {
	KeyAuthorization(token string) (string, bool)
}

// Defaults for Limits and Options.
const (
	DefaultMaxConns             = 1024
	DefaultHeaderTimeout        = 10 * time.Second
	DefaultIdleTimeout          = 60 * time.Second
	DefaultDialTimeout          = 2 * time.Second
	DefaultBackendTimeout       = 60 * time.Second
	DefaultBackendIdleConns     = 1024
	DefaultBackendIdlePerTarget = 256
	DefaultGrace                = 10 * time.Second
	DefaultUnhealthyFor         = 2 * time.Second
	// MaxHeaderBytes bounds a request's header block (net/http's default
	// is 1 MiB; nginx's is 32 KiB).
	MaxHeaderBytes = 64 << 10
	// MaxConcurrentStreams is how many requests one HTTP/2 client
	// connection carries at once.
	MaxConcurrentStreams = 100
)

// Limits bound what clients and backends can make the ingress hold. Zero
// fields take the defaults.
type Limits struct {
	// MaxConns is how many client connections each listener (HTTP and
	// HTTPS) holds open at once; further clients wait in the kernel's
	// accept queue. One client address holds at most a quarter of them
	// (netlimit.PerHost): its further connections are closed at once.
	// Default DefaultMaxConns.
	MaxConns int
	// MaxRequests is how many requests are proxied at once, all clients
	// together (HTTP/2 carries several per connection); one over it is
	// answered 503 at once. Default 2 × MaxConns.
	MaxRequests int
	// HeaderTimeout bounds the TLS handshake and the reading of each
	// request's headers. Default DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive client connection that sends no
	// next request in time. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// DialTimeout bounds each connection attempt to a backend endpoint.
	// Default DefaultDialTimeout.
	DialTimeout time.Duration
	// BackendTimeout bounds the wait for a backend's response headers once
	// the request is sent; past it the client gets 504. Default
	// DefaultBackendTimeout.
	BackendTimeout time.Duration
	// BackendIdleConns is how many idle keep-alive connections to
	// backends are kept, all endpoints together, and BackendIdlePerTarget
	// how many per endpoint. Defaults DefaultBackendIdleConns,
	// DefaultBackendIdlePerTarget.
	BackendIdleConns     int
	BackendIdlePerTarget int
	// Grace is how long Close lets requests in flight finish. Default
	// DefaultGrace.
	Grace time.Duration
}

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxConns, DefaultMaxConns)
	def(&l.MaxRequests, 2*l.MaxConns)
	def(&l.BackendIdleConns, DefaultBackendIdleConns)
	def(&l.BackendIdlePerTarget, DefaultBackendIdlePerTarget)
	defDur(&l.HeaderTimeout, DefaultHeaderTimeout)
	defDur(&l.IdleTimeout, DefaultIdleTimeout)
	defDur(&l.DialTimeout, DefaultDialTimeout)
	defDur(&l.BackendTimeout, DefaultBackendTimeout)
	defDur(&l.Grace, DefaultGrace)
	return l
}

// FDs is the most file descriptors the ingress can make the process hold:
// the clients of both listeners, one backend connection per request in
// flight, and the idle backend connections.
func (l Limits) FDs() int {
	l = l.WithDefaults()
	return 2*l.MaxConns + l.MaxRequests + l.BackendIdleConns
}

// Options configure a Server.
type Options struct {
	// HTTPAddr and HTTPSAddr are the listeners' addresses (host:port);
	// an empty one is not served. At least one must be set.
	HTTPAddr, HTTPSAddr string
	// Certs picks the certificate of each TLS handshake; nil: none, every
	// handshake fails.
	Certs Certs
	// Challenges answers ACME HTTP-01 challenges; nil: none.
	Challenges Challenges
	// Logger receives listener starts and stops, and per-request backend
	// errors and TLS handshake failures at debug level. Nil discards.
	Logger *slog.Logger
	// Metrics, when set, receives the ingress's metrics (see NewMetrics).
	Metrics *Metrics
	// Limits bound connections, requests and timeouts.
	Limits Limits
	// UnhealthyFor is how long round-robin skips an endpoint whose dial
	// failed (unless every endpoint is skipped). Default
	// DefaultUnhealthyFor.
	UnhealthyFor time.Duration
}

// Server is a running ingress. Its methods are safe for concurrent use.
type Server struct {
	log          *slog.Logger
	errLog       *log.Logger // net/http's and the reverse proxy's own messages, at debug level
	certs        Certs
	challenges   Challenges
	metrics      *Metrics
	limits       Limits
	unhealthyFor int64
	// now returns a monotonic time in nanoseconds for passive health.
	now func() int64

	backend *backendClient
	// inflight holds one token per request being proxied
	// (Limits.MaxRequests).
	inflight chan struct{}
	bufs     bufferPool

	table      atomic.Pointer[table] // swapped whole by SetRoutes
	setMu      sync.Mutex            // serializes SetRoutes
	lastRoutes []Route               // the valid routes of the table in use (setMu)

	httpSrv, httpsSrv   *http.Server // nil when not served
	httpAddr, httpsAddr net.Addr
	conns               connSet

	// handlers counts the handlers running, so that Close waits for the
	// ones net/http does not (of hijacked, upgraded connections).
	// handlersMu orders their Add against Close's Wait: once closing is
	// set, no handler adds itself.
	handlersMu sync.RWMutex
	closing    bool
	handlers   sync.WaitGroup

	wg        sync.WaitGroup // the listeners' Serve loops
	closeOnce sync.Once
	closeErr  error
}

// New opens the listeners and starts serving an empty route table (every
// request gets 404 until SetRoutes). On error nothing is left open.
func New(opts Options) (*Server, error) {
	if opts.HTTPAddr == "" && opts.HTTPSAddr == "" {
		return nil, errors.New("ingress: neither an HTTP nor an HTTPS address")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = newMetrics() // unregistered: keeps the code free of nil checks
	}
	if opts.UnhealthyFor <= 0 {
		opts.UnhealthyFor = DefaultUnhealthyFor
	}
	limits := opts.Limits.WithDefaults()
	epoch := time.Now()
	s := &Server{
		log:          logger,
		certs:        opts.Certs,
		challenges:   opts.Challenges,
		metrics:      opts.Metrics,
		limits:       limits,
		unhealthyFor: int64(opts.UnhealthyFor),
		now:          func() int64 { return int64(time.Since(epoch)) },
		backend:      newBackendClient(limits),
		inflight:     make(chan struct{}, limits.MaxRequests),
		conns:        connSet{m: map[*trackedConn]struct{}{}},
	}
	s.errLog = slog.NewLogLogger(logger.Handler(), slog.LevelDebug)
	s.table.Store(s.newTable(nil, nil))

	var lns []net.Listener
	closeAll := func() {
		for _, l := range lns {
			l.Close()
		}
	}
	open := func(addr string) (net.Listener, net.Addr, error) {
		ln, err := reuseport.Listen(context.Background(), addr)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("ingress: %w", err)
		}
		lns = append(lns, ln)
		return &trackingListener{Listener: netlimit.Listener(ln, limits.MaxConns), s: s}, ln.Addr(), nil
	}
	var httpLn, httpsLn net.Listener
	if opts.HTTPSAddr != "" {
		l, addr, err := open(opts.HTTPSAddr)
		if err != nil {
			return nil, err
		}
		s.httpsAddr = addr
		s.httpsSrv = s.newServer(http.HandlerFunc(s.serveHTTPS))
		s.httpsSrv.TLSConfig = &tls.Config{
			MinVersion:     tls.VersionTLS12,
			NextProtos:     []string{"h2", "http/1.1"},
			GetCertificate: s.certificate,
		}
		httpsLn = tls.NewListener(l, s.httpsSrv.TLSConfig)
	}
	if opts.HTTPAddr != "" {
		l, addr, err := open(opts.HTTPAddr)
		if err != nil {
			return nil, err
		}
		s.httpAddr = addr
		s.httpSrv = s.newServer(http.HandlerFunc(s.serveHTTP))
		httpLn = l
	}
	for _, p := range []struct {
		srv  *http.Server
		ln   net.Listener
		addr net.Addr
		what string
	}{{s.httpsSrv, httpsLn, s.httpsAddr, "https"}, {s.httpSrv, httpLn, s.httpAddr, "http"}} {
		if p.srv == nil {
			continue
		}
		logger.Info("ingress listening", "listener", p.what, "addr", p.addr)
		s.wg.Go(func() {
			if err := p.srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
				logger.Error("ingress listener stopped", "listener", p.what, "addr", p.addr, "err", err)
			}
		})
	}
	return s, nil
}

func (s *Server) newServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.limits.HeaderTimeout,
		IdleTimeout:       s.limits.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: MaxConcurrentStreams},
		// TLS handshake failures and client errors: debug only, any
		// client can cause them.
		ErrorLog: s.errLog,
	}
}

// certificate is the TLS config's GetCertificate: the host's certificate
// from Certs, or none (nil, nil), which crypto/tls answers with an
// unrecognized_name alert.
func (s *Server) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	host := canonicalHost(hello.ServerName)
	if host == "" || s.certs == nil {
		return nil, nil
	}
	return s.certs.Certificate(host), nil
}

// HTTPAddr is the HTTP listener's address; nil when not served.
func (s *Server) HTTPAddr() net.Addr { return s.httpAddr }

// HTTPSAddr is the HTTPS listener's address; nil when not served.
func (s *Server) HTTPSAddr() net.Addr { return s.httpsAddr }

// Close stops accepting, lets requests in flight finish for up to
// Limits.Grace (HTTP/2 clients get a GOAWAY), then closes every connection
// left, upgraded ones (WebSockets) included, and returns once every
// goroutine of the Server has ended. Calling it again does nothing.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.limits.Grace)
		defer cancel()
		var wg sync.WaitGroup
		var cut atomic.Bool
		for _, srv := range []*http.Server{s.httpSrv, s.httpsSrv} {
			if srv == nil {
				continue
			}
			wg.Go(func() {
				if err := srv.Shutdown(ctx); err != nil {
					cut.Store(true)
					srv.Close()
				}
			})
		}
		wg.Wait()
		if cut.Load() {
			s.closeErr = fmt.Errorf("ingress: requests still in flight after the %s grace were cut", s.limits.Grace)
		}
		// Shutdown neither waits for nor closes hijacked connections.
		s.conns.closeAll()
		s.handlersMu.Lock()
		s.closing = true
		s.handlersMu.Unlock()
		s.handlers.Wait()
		s.wg.Wait()
		s.backend.closeIdle(true)
		s.log.Info("ingress stopped")
	})
	return s.closeErr
}

// enter counts a handler in; false once the Server is closing, when the
// handler must answer at once.
func (s *Server) enter() bool {
	s.handlersMu.RLock()
	defer s.handlersMu.RUnlock()
	if s.closing {
		return false
	}
	s.handlers.Add(1)
	return true
}

// canonicalHost is a Host header or SNI name as routes name hosts: the
// port and IPv6 brackets dropped, lower case, no trailing dot.
func canonicalHost(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i]
	}
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
	}
	h = strings.TrimSuffix(h, ".")
	return strings.ToLower(h)
}
