package ingress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Requests and answers of every shape go through unchanged, one after the
// other on one kept-alive backend connection.
func TestProxiedMessages(t *testing.T) {
	checkLeaks(t)
	be := newBackend(t, "msgs", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/head":
			w.Header().Set("Content-Length", "1234")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/stream":
			w.Header().Set("Trailer", "X-Sum")
			for i := range 5 {
				fmt.Fprintf(w, "part %d\n", i)
				w.(http.Flusher).Flush()
			}
			w.Header().Set("X-Sum", "five")
		case "/upload":
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
		case "/hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "after hints")
		default:
			http.NotFound(w, r)
		}
	})
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{be.addr()}}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, false)

	t.Run("HEAD", func(t *testing.T) {
		res, err := c.Head("https://web.test/head")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.ContentLength != 1234 {
			t.Errorf("HEAD: %d, length %d", res.StatusCode, res.ContentLength)
		}
	})
	t.Run("204", func(t *testing.T) {
		if code, body := get(t, c, "https://web.test/empty"); code != 204 || body != "" {
			t.Errorf("%d %q", code, body)
		}
	})
	t.Run("streamed, chunked, with a trailer", func(t *testing.T) {
		res, err := c.Get("https://web.test/stream")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(string(b), "part 0\n") || !strings.HasSuffix(string(b), "part 4\n") || res.Trailer.Get("X-Sum") != "five" {
			t.Errorf("%d %q trailer %v", res.StatusCode, b, res.Trailer)
		}
	})
	t.Run("1 MiB upload", func(t *testing.T) {
		data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
		res, err := c.Post("https://web.test/upload", "application/octet-stream", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if want := fmt.Sprintf("%d %x", len(data), sha256.Sum256(data)); string(b) != want {
			t.Errorf("the backend got %q, want %q", b, want)
		}
	})
	t.Run("103 Early Hints relayed", func(t *testing.T) {
		var hints []string
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			hints = append(hints, fmt.Sprint(code, " ", h.Get("Link")))
			return nil
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, "https://web.test/hints", nil)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(b) != "after hints" || len(hints) != 1 || hints[0] != "103 </style.css>; rel=preload" {
			t.Errorf("%d %q, hints %q", res.StatusCode, b, hints)
		}
	})
	if n := be.conns.Load(); n != 1 {
		t.Errorf("the backend accepted %d connections for sequential requests, want 1", n)
	}
}

// A backend that closes its idle keep-alive connections (as many do after
// a few seconds) costs no request: a GET found on a closed connection is
// sent again on a new one, and a request with a body is not sent on one.
func TestBackendClosesIdleConnections(t *testing.T) {
	checkLeaks(t)
	be := newBackend(t, "closer", nil, func(srv *http.Server) { srv.IdleTimeout = 100 * time.Millisecond })
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{be.addr()}}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, false)
	for i, method := range []string{"GET", "GET", "POST", "POST"} {
		waitFor(t, "the backend to close its idle connections", func() bool { return be.closed.Load() == be.conns.Load() })
		req, _ := http.NewRequest(method, "https://web.test/x", nil)
		if method == "POST" {
			req, _ = http.NewRequest(method, "https://web.test/x", strings.NewReader("some body"))
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || field(string(b), "backend") != "closer" {
			t.Fatalf("request %d (%s) after the backend closed its idle connection: %d %q", i, method, res.StatusCode, b)
		}
	}
	if n := be.conns.Load(); n != 4 {
		t.Errorf("%d backend connections, want 4 (one per request, each closed while idle)", n)
	}
}

// A client that goes away cancels its request at the backend, and is
// counted as 499.
func TestClientGoneCancelsTheBackendRequest(t *testing.T) {
	checkLeaks(t)
	entered, cancelled := make(chan struct{}, 1), make(chan struct{}, 1)
	be := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done()
		cancelled <- struct{}{}
	})
	reg := prometheus.NewRegistry()
	s := newServer(t, Options{Certs: newCertStore(t, "web.test"), Metrics: NewMetrics(reg)})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{be.addr()}}}); err != nil {
		t.Fatal(err)
	}
	for _, h2 := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://web.test/", nil)
		done := make(chan error, 1)
		go func() {
			res, err := newClient(t, s, h2).Do(req)
			if err == nil {
				res.Body.Close()
			}
			done <- err
		}()
		<-entered
		cancel()
		if err := <-done; err == nil {
			t.Fatal("the cancelled request got an answer")
		}
		select {
		case <-cancelled:
		case <-time.After(30 * time.Second):
			t.Fatalf("h2=%v: the backend's request was not cancelled", h2)
		}
	}
	waitFor(t, "two requests counted as 499", func() bool {
		return testutil.ToFloat64(s.metrics.requests.WithLabelValues("web.test", "499")) == 2
	})
}
