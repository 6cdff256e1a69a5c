package acme

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/internal/pebble/pebbletest"
	"github.com/keel-dev/keel/providers"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ca is a Pebble with an HTTP-01 responder on the port its validation
// authority connects to.
type ca struct {
	*pebble.Server
	http *httpSolver
}

// startCA starts a Pebble and the test's HTTP-01 responder, which listens
// first so no other process takes the port.
func startCA(t *testing.T, opts pebble.Options) *ca {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.HTTPPort = l.Addr().(*net.TCPAddr).Port
	hs := newHTTPSolver(t, l)
	return &ca{Server: pebbletest.Start(t, opts), http: hs}
}

func (c *ca) issuer(t *testing.T, stateDir string) *Issuer {
	t.Helper()
	i, err := NewIssuer(Options{
		Directory: c.DirectoryURL, Roots: c.DirectoryRoots, StateDir: stateDir,
		Logger: testLogger(t), UserAgent: "keel-test", RequestTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(i.http.CloseIdleConnections)
	return i
}

// httpSolver answers HTTP-01 the way every ingress node will: it serves
// the key authorizations presented to it on Pebble's HTTP port. It
// counts its calls and the most Presents in flight at once.
type httpSolver struct {
	mu               stdsync.Mutex
	answers          map[string]string // token -> key authorization
	presents, cleans int
	inFlight, most   int
	// wrong, while positive, is how many Presents still serve a wrong
	// answer (a node that answers stale content).
	wrong int
	// hold, if set, is waited on by Present while in flight.
	hold chan struct{}
}

func newHTTPSolver(t *testing.T, l net.Listener) *httpSolver {
	s := &httpSolver{answers: map[string]string{}}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return s
}

func (s *httpSolver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := strings.CutPrefix(r.URL.Path, "/.well-known/acme-challenge/")
	s.mu.Lock()
	answer, found := s.answers[token]
	s.mu.Unlock()
	if !ok || !found {
		http.NotFound(w, r)
		return
	}
	io.WriteString(w, answer)
}

func (s *httpSolver) Type() string { return ChallengeHTTP01 }

func (s *httpSolver) Present(ctx context.Context, host, token, keyAuth string) error {
	s.mu.Lock()
	s.presents++
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	if s.wrong > 0 {
		s.wrong--
		keyAuth = "stale" + keyAuth
	}
	s.answers[token] = keyAuth
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
	return nil
}

func (s *httpSolver) CleanUp(_ context.Context, _, token, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleans++
	delete(s.answers, token)
	return nil
}

func (s *httpSolver) counts() (presents, cleans, most, pending int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.presents, s.cleans, s.most, len(s.answers)
}

// challDNS is a DNS provider backed by challtestsrv, the DNS server
// Pebble resolves with. It records every call; fail, if set, decides
// whether Present fails for a domain.
type challDNS struct {
	srv *pebble.Server

	mu       stdsync.Mutex
	presents []time.Time
	cleans   int
	fail     func(domain string) error
	value    func(keyAuth string) string // DNS01Value unless set
}

func (d *challDNS) Present(_ context.Context, domain, keyAuth string) error {
	d.mu.Lock()
	d.presents = append(d.presents, time.Now())
	fail, value := d.fail, d.value
	d.mu.Unlock()
	if fail != nil {
		if err := fail(domain); err != nil {
			return err
		}
	}
	if value == nil {
		value = DNS01Value
	}
	return d.srv.SetTXT(DNS01Name(domain), value(keyAuth))
}

func (d *challDNS) CleanUp(_ context.Context, domain, _ string) error {
	d.mu.Lock()
	d.cleans++
	d.mu.Unlock()
	return d.srv.ClearTXT(DNS01Name(domain))
}

func (d *challDNS) calls() (presents []time.Time, cleans int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.presents...), d.cleans
}

// serveTLS serves b in a real TLS handshake on 127.0.0.1 to a client that
// trusts only roots, and returns the leaf the client verified.
func serveTLS(t *testing.T, b *providers.Bundle, roots *x509.CertPool) *x509.Certificate {
	t.Helper()
	cert, err := b.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.(*tls.Conn).Handshake(); err != nil {
			served <- err
			return
		}
		_, err = c.Write([]byte("ok"))
		served <- err
	}()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", l.Addr().String(),
		&tls.Config{RootCAs: roots, ServerName: b.Host})
	if err != nil {
		t.Fatalf("TLS client trusting only Pebble's root: %v", err)
	}
	defer conn.Close()
	buf := make([]byte, 2)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("reading over TLS: %q %v", buf, err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	return conn.ConnectionState().PeerCertificates[0]
}

// waitFor polls cond every 10 ms until it holds, failing t after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// issued collects OnIssued's bundles.
type issued struct {
	mu      stdsync.Mutex
	bundles []*providers.Bundle
}

func (i *issued) add(b *providers.Bundle) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.bundles = append(i.bundles, b)
}

func (i *issued) get() []*providers.Bundle {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]*providers.Bundle(nil), i.bundles...)
}

func (i *issued) forHost(host string) []*providers.Bundle {
	var out []*providers.Bundle
	for _, b := range i.get() {
		if b.Host == host {
			out = append(out, b)
		}
	}
	return out
}

var errDNSDown = errors.New("the DNS provider's API is down")

func statusOf(m *Manager, host string) (HostStatus, error) {
	for _, s := range m.Status() {
		if s.Host == host {
			return s, nil
		}
	}
	return HostStatus{}, fmt.Errorf("no status for %s", host)
}
