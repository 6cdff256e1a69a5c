package ingress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Tests in this package do not call t.Parallel: each checks, once its
// Servers, backends and clients are closed, that none of their goroutines
// is left.

// testCA is a certificate authority made for the test process, whose
// certificates the test clients trust.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

var (
	caOnce sync.Once
	ca     *testCA
)

func theCA(t testing.TB) *testCA {
	t.Helper()
	caOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "keel ingress test CA"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(24 * time.Hour),
			KeyUsage:              x509.KeyUsageCertSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			panic(err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		ca = &testCA{cert: cert, key: key, pool: pool, leaves: map[string]*tls.Certificate{}}
	})
	return ca
}

// leaf returns a certificate for host signed by the CA (one per host).
func (c *testCA) leaf(t testing.TB, host string) *tls.Certificate {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok {
		return l
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	c.leaves[host] = l
	return l
}

// certStore is a Certs whose certificates the test sets.
type certStore struct {
	mu    sync.Mutex
	certs map[string]*tls.Certificate
}

func newCertStore(t testing.TB, hosts ...string) *certStore {
	s := &certStore{certs: map[string]*tls.Certificate{}}
	for _, h := range hosts {
		s.certs[h] = theCA(t).leaf(t, h)
	}
	return s
}

func (s *certStore) Certificate(host string) *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.certs[host]
}

// challengeStore is a Challenges whose tokens the test sets.
type challengeStore map[string]string

func (c challengeStore) KeyAuthorization(token string) (string, bool) {
	ka, ok := c[token]
	return ka, ok
}

// testLogger writes the Server's log to t.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// checkLeaks registers, as the test's first cleanup and so its last, a
// check that no goroutine of a Server, of its reverse proxies and
// backend connections, or of the test's HTTP servers and clients is left.
func checkLeaks(t *testing.T) {
	t.Cleanup(func() {
		var leaked []string
		deadline := time.Now().Add(5 * time.Second)
		for {
			leaked = leftGoroutines()
			if len(leaked) == 0 {
				return
			}
			if time.Now().After(deadline) {
				break
			}
			runtime.Gosched()
			time.Sleep(5 * time.Millisecond)
		}
		t.Errorf("%d goroutines left:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
	})
}

func leftGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for _, f := range []string{"nodeexec/ingress.", "httputil.", "net/http.(*conn).serve", "net/http.(*persistConn)", "net/http.(*Server).Serve", "net/http.(*http2serverConn)"} {
			if strings.Contains(g, f) && !strings.Contains(g, "nodeexec/ingress.leftGoroutines") {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// newServer starts a Server on 127.0.0.1, closed when the test ends.
func newServer(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = "127.0.0.1:0"
	}
	if opts.HTTPSAddr == "" {
		opts.HTTPSAddr = "127.0.0.1:0"
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// backend is a real HTTP server on 127.0.0.1 that names itself and echoes
// what it got, or runs handle when set.
type backend struct {
	name     string
	srv      *http.Server
	ln       net.Listener
	requests atomic.Int64
	conns    atomic.Int64 // connections accepted
	closed   atomic.Int64 // connections closed
	done     chan struct{}
}

func newBackend(t testing.TB, name string, handle http.HandlerFunc, configure ...func(*http.Server)) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, ln: ln, done: make(chan struct{})}
	if handle == nil {
		handle = b.echo
	}
	b.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.requests.Add(1)
			handle(w, r)
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				b.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				b.closed.Add(1)
			}
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	for _, f := range configure {
		f(b.srv)
	}
	go func() {
		defer close(b.done)
		b.srv.Serve(ln)
	}()
	t.Cleanup(b.close)
	return b
}

// echo answers with the backend's name, the path and query it got, and
// the headers the tests look at.
func (b *backend) echo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "backend=%s\nuri=%s\nhost=%s\nxff=%s\nxfh=%s\nxfp=%s\n", b.name, r.RequestURI, r.Host,
		r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Forwarded-Proto"))
}

func (b *backend) addr() netip.AddrPort { return b.ln.Addr().(*net.TCPAddr).AddrPort() }

func (b *backend) close() {
	b.srv.Close()
	<-b.done
}

// deadAddr returns a loopback address where nothing listens: connecting is
// refused at once.
func deadAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// newClient returns an HTTP client that trusts the test CA and sends
// every request to port 80 to the Server's HTTP listener and every other
// one to its HTTPS listener, whatever the URL's host (as curl --resolve):
// the URL's host is the SNI name and the Host header. It does not follow
// redirects. h2 selects HTTP/2 (over TLS); otherwise HTTP/1.1.
func newClient(t testing.TB, s *Server, h2 bool) *http.Client {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			target := s.HTTPSAddr().String()
			if strings.HasSuffix(addr, ":80") {
				target = s.HTTPAddr().String()
			}
			return d.DialContext(ctx, network, target)
		},
		TLSClientConfig:     &tls.Config{RootCAs: theCA(t).pool},
		ForceAttemptHTTP2:   h2,
		MaxIdleConnsPerHost: 100,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// get does a GET and returns the status code and body.
func get(t testing.TB, c *http.Client, url string, header ...string) (int, string) {
	t.Helper()
	res, body, err := do(c, url, header...)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode, body
}

func do(c *http.Client, url string, header ...string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, "", err
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Add(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

// field returns the value of "key=value" line in an echo body.
func field(body, key string) string {
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return v
		}
	}
	return ""
}

// waitFor polls cond until it holds, failing t after half a minute (a
// generous deadline: the machine may be busy).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawHTTP1 opens a TLS connection speaking HTTP/1.1 to the Server for
// host, for tests that write requests by hand.
func rawHTTP1(t testing.TB, s *Server, host string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", s.HTTPSAddr().String(),
		&tls.Config{RootCAs: theCA(t).pool, ServerName: host, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}
