package ingress

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bodies of the answers the ingress gives itself: short and plain, so that
// a user (or curl) sees at once which part failed.
const (
	msgUnknownHost = "404 no such host on this ingress\n"
	msgNoRoute     = "404 no route for this path\n"
	msgNoEndpoint  = "503 no healthy endpoint for this service\n"
	msgOverloaded  = "503 too many requests in flight on this ingress node\n"
	msgClosing     = "503 this ingress node is shutting down\n"
	msgBadGateway  = "502 the backend could not be reached\n"
	msgTimeout     = "504 the backend did not answer in time\n"
	msgNoChallenge = "404 no such ACME challenge\n"
)

// statusClientGone is recorded (and written, to no one) when the client
// went away before the backend answered, as nginx logs it.
const statusClientGone = 499

const acmePrefix = "/.well-known/acme-challenge/"

// serveHTTPS routes one request to its backend.
func (s *Server) serveHTTPS(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		w.Header().Set("Connection", "close")
		plain(w, http.StatusServiceUnavailable, msgClosing)
		return
	}
	defer s.handlers.Done()
	start := time.Now()
	t := s.table.Load()
	h := t.hosts[canonicalHost(r.Host)]
	m := t.unknown
	if h != nil {
		m = h.metrics
	}
	sw := &statusWriter{ResponseWriter: w}
	// Deferred: the reverse proxy aborts a response whose body copy
	// fails by panicking with http.ErrAbortHandler.
	defer func() { m.observe(sw.code, time.Since(start)) }()
	if h == nil {
		plain(sw, http.StatusNotFound, msgUnknownHost)
		return
	}
	s.forward(sw, r, h)
}

// forward sends a request for host h to the backend of its route.
func (s *Server) forward(sw *statusWriter, r *http.Request, h *hostRoutes) {
	rt := h.match(cleanPath(r.URL.Path))
	switch {
	case rt == nil:
		plain(sw, http.StatusNotFound, msgNoRoute)
		return
	case len(rt.targets) == 0:
		plain(sw, http.StatusServiceUnavailable, msgNoEndpoint)
		return
	}
	select {
	case s.inflight <- struct{}{}:
	default:
		plain(sw, http.StatusServiceUnavailable, msgOverloaded)
		return
	}
	defer func() { <-s.inflight }()
	rt.proxy.ServeHTTP(sw, r)
}

// serveHTTP answers ACME HTTP-01 challenges and redirects the rest to
// HTTPS.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		w.Header().Set("Connection", "close")
		plain(w, http.StatusServiceUnavailable, msgClosing)
		return
	}
	defer s.handlers.Done()
	start := time.Now()
	t := s.table.Load()
	host := canonicalHost(r.Host)
	h := t.hosts[host]
	m := t.unknown
	if h != nil {
		m = h.metrics
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { m.observe(sw.code, time.Since(start)) }()
	if token, ok := strings.CutPrefix(r.URL.Path, acmePrefix); ok {
		s.answerChallenge(sw, token)
		return
	}
	if h == nil {
		// No redirect to a host this node has no certificate for: the
		// client would only get a failed handshake.
		plain(sw, http.StatusNotFound, msgUnknownHost)
		return
	}
	if h.insecure {
		// An Ingress without tls: served over plain HTTP.
		s.forward(sw, r, h)
		return
	}
	sw.Header().Set("Location", "https://"+host+r.URL.RequestURI())
	sw.WriteHeader(http.StatusPermanentRedirect)
}

// answerChallenge serves the key authorization of an HTTP-01 token, for
// any host: the CA asks for the host being validated, which may not be in
// the route table yet.
func (s *Server) answerChallenge(w http.ResponseWriter, token string) {
	if token == "" || strings.Contains(token, "/") || s.challenges == nil {
		plain(w, http.StatusNotFound, msgNoChallenge)
		return
	}
	ka, ok := s.challenges.KeyAuthorization(token)
	if !ok {
		plain(w, http.StatusNotFound, msgNoChallenge)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(ka)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(ka))
}

// plain writes a short plain-text answer.
func plain(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(msg)))
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg))
}

// cleanPath is the path routes are matched against: "." and ".." segments
// and repeated slashes resolved, as the backend would resolve them, so
// that "/api/../admin" is routed as "/admin". The request is forwarded as
// the client sent it.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	return path.Clean(p)
}

// rewrite makes the outgoing request: the backend is chosen later, by the
// route's RoundTrip; X-Forwarded-For gets the client's address appended,
// X-Forwarded-Host and X-Forwarded-Proto say what the client asked for.
// The Host header is kept.
func rewrite(pr *httputil.ProxyRequest) {
	pr.Out.URL.Scheme = "http"
	pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	pr.SetXForwarded()
}

// RoundTrip sends req to the next healthy endpoint of the route and, when
// the connection to it could not be made and the request has no body (so
// nothing of it reached the backend and it can be sent again), once more to
// the endpoint after it.
func (rt *route) RoundTrip(req *http.Request) (*http.Response, error) {
	set := rt.set
	i := set.Pick(rt.next.Add(1)-1, rt.s.now())
	req.URL.Host = rt.targets[i]
	res, err := rt.s.backend.RoundTrip(req)
	if err == nil {
		set.Endpoints[i].MarkUp()
		return res, nil
	}
	if !rt.dialFailed(i, err) || len(rt.targets) == 1 || (req.Body != nil && req.Body != http.NoBody) || req.Context().Err() != nil {
		return nil, err
	}
	j := set.After(i, rt.s.now())
	req.URL.Host = rt.targets[j]
	res, err = rt.s.backend.RoundTrip(req)
	if err == nil {
		set.Endpoints[j].MarkUp()
		return res, nil
	}
	rt.dialFailed(j, err)
	return nil, err
}

// dialFailed reports whether err is a failed connection to endpoint i,
// and if so marks it down.
func (rt *route) dialFailed(i int, err error) bool {
	var de *dialError
	if !errors.As(err, &de) {
		return false
	}
	if rt.set.Endpoints[i].MarkDown(rt.s.now(), rt.s.unhealthyFor) {
		rt.s.log.Warn("ingress endpoint unhealthy", "host", rt.host, "path", rt.path, "service", rt.service,
			"endpoint", rt.targets[i], "for", time.Duration(rt.s.unhealthyFor), "err", de.err)
	}
	return true
}

// proxyError answers a request whose backend failed: 504 on a timeout,
// 502 otherwise, and 499 (to no one) when the client went away first.
func (s *Server) proxyError(w http.ResponseWriter, out *http.Request, err error) {
	var ne net.Error
	switch {
	case out.Context().Err() != nil && errors.Is(err, context.Canceled):
		w.WriteHeader(statusClientGone)
	case errors.As(err, &ne) && ne.Timeout():
		plain(w, http.StatusGatewayTimeout, msgTimeout)
	default:
		plain(w, http.StatusBadGateway, msgBadGateway)
	}
	s.log.Debug("ingress backend error", "host", out.Host, "endpoint", out.URL.Host, "path", out.URL.Path, "err", err)
}

// statusWriter records the status code of the answer, for the metrics. It
// unwraps for http.ResponseController, through which the reverse proxy
// flushes and hijacks.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// dialError is a failed connection to an endpoint: nothing of the request
// reached it.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// bufferPool lends the reverse proxy its copy buffers.
type bufferPool struct{ p sync.Pool }

const copyBufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == copyBufferSize {
		buf = buf[:copyBufferSize]
		b.p.Put(&buf)
	}
}

// trackingListener counts the connections it accepts in the active
// connections gauge, and records them so that Close can close the ones
// net/http no longer tracks (hijacked for an upgrade).
type trackingListener struct {
	net.Listener
	s *Server
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, set: &l.s.conns, active: l.s.metrics.active}
	l.s.conns.add(tc)
	tc.active.Inc()
	return tc, nil
}

type trackedConn struct {
	net.Conn
	set    *connSet
	active prometheus.Gauge
	once   sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.set.remove(c)
		c.active.Dec()
	})
	return err
}

// connSet is every client connection open.
type connSet struct {
	mu sync.Mutex
	m  map[*trackedConn]struct{}
}

func (s *connSet) add(c *trackedConn) {
	s.mu.Lock()
	s.m[c] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) remove(c *trackedConn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *connSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := make([]*trackedConn, 0, len(s.m))
	for c := range s.m {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}
