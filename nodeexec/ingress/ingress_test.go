package ingress

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// The certificate comes from Certs by SNI; a host without one fails the
// handshake at once with an alert; HTTP/2 and HTTP/1.1 are offered; TLS
// below 1.2 is refused.
func TestTLS(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	s := newServer(t, Options{Certs: newCertStore(t, "web.test", "api.test")})
	routes := []Route{
		{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}},
		{Host: "api.test", Path: "/", Service: "api", Endpoints: []netip.AddrPort{a.addr()}},
		{Host: "nocert.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}},
	}
	if err := s.SetRoutes(routes); err != nil {
		t.Fatal(err)
	}

	t.Run("certificate by SNI", func(t *testing.T) {
		for _, host := range []string{"web.test", "api.test", "WEB.test"} {
			c, err := tls.Dial("tcp", s.HTTPSAddr().String(), &tls.Config{RootCAs: theCA(t).pool, ServerName: host})
			if err != nil {
				t.Fatalf("%s: %v", host, err)
			}
			got := c.ConnectionState().PeerCertificates[0].DNSNames
			c.Close()
			if len(got) != 1 || got[0] != strings.ToLower(host) {
				t.Errorf("%s: served the certificate of %v", host, got)
			}
		}
	})

	t.Run("no certificate: an alert, not a hang", func(t *testing.T) {
		for _, host := range []string{"nocert.test", "unknown.test", ""} {
			d := &net.Dialer{Deadline: time.Now().Add(30 * time.Second)}
			c, err := tls.DialWithDialer(d, "tcp", s.HTTPSAddr().String(),
				&tls.Config{RootCAs: theCA(t).pool, ServerName: host, InsecureSkipVerify: host == ""})
			if err == nil {
				c.Close()
				t.Fatalf("%q: the handshake succeeded", host)
			}
			if !strings.Contains(err.Error(), "unrecognized name") {
				t.Errorf("%q: %v, want the server's unrecognized_name alert", host, err)
			}
		}
	})

	t.Run("HTTP/2 and HTTP/1.1", func(t *testing.T) {
		for _, h2 := range []bool{true, false} {
			res, body, err := do(newClient(t, s, h2), "https://web.test/")
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[h2]
			if res.Proto != want || res.StatusCode != 200 || field(body, "backend") != "a" {
				t.Errorf("h2=%v: %s %d %q", h2, res.Proto, res.StatusCode, body)
			}
		}
	})

	t.Run("TLS 1.1 refused", func(t *testing.T) {
		c, err := tls.Dial("tcp", s.HTTPSAddr().String(), &tls.Config{RootCAs: theCA(t).pool, ServerName: "web.test", MaxVersion: tls.VersionTLS11})
		if err == nil {
			c.Close()
			t.Fatal("a TLS 1.1 handshake succeeded")
		}
	})
}

// The HTTP listener answers ACME HTTP-01 challenges for any host, and
// redirects a routed host to HTTPS with its path and query.
func TestHTTPListener(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	s := newServer(t, Options{Challenges: challengeStore{"tok-EN_1": "tok-EN_1.thumbprint"}})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, false)
	tests := []struct {
		name, url, host string
		code            int
		location, body  string
	}{
		{"redirect keeps path and query", "http://web.test/a/b?x=1&y=%20", "", 308, "https://web.test/a/b?x=1&y=%20", ""},
		{"redirect drops the port and lower-cases", "http://web.test/", "WEB.Test:8080", 308, "https://web.test/", ""},
		{"redirect of an escaped path", "http://web.test/a%2Fb/c%20d", "", 308, "https://web.test/a%2Fb/c%20d", ""},
		{"unknown host: no redirect", "http://other.test/", "", 404, "", msgUnknownHost},
		{"challenge answered", "http://web.test/.well-known/acme-challenge/tok-EN_1", "", 200, "", "tok-EN_1.thumbprint"},
		{"challenge answered for any host", "http://not-routed.test/.well-known/acme-challenge/tok-EN_1", "", 200, "", "tok-EN_1.thumbprint"},
		{"unknown token", "http://web.test/.well-known/acme-challenge/nope", "", 404, "", msgNoChallenge},
		{"empty token", "http://web.test/.well-known/acme-challenge/", "", 404, "", msgNoChallenge},
		{"token with a slash", "http://web.test/.well-known/acme-challenge/tok-EN_1/x", "", 404, "", msgNoChallenge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.host != "" {
				hdr = []string{"Host", tt.host}
			}
			res, body, err := do(c, tt.url, hdr...)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tt.code || res.Header.Get("Location") != tt.location || (tt.body != "" && body != tt.body) {
				t.Errorf("got %d Location=%q body=%q; want %d %q %q", res.StatusCode, res.Header.Get("Location"), body, tt.code, tt.location, tt.body)
			}
			if tt.code == 200 && res.Header.Get("Content-Type") != "text/plain" {
				t.Errorf("Content-Type %q", res.Header.Get("Content-Type"))
			}
		})
	}
	if n := a.requests.Load(); n != 0 {
		t.Errorf("the backend got %d requests over plain HTTP", n)
	}
}

// An Ingress without tls is served over plain HTTP, with the headers of
// a plain request; a host with one route that asks for TLS is redirected
// whole.
func TestInsecureRoutesServedOverHTTP(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	s := newServer(t, Options{})
	err := s.SetRoutes([]Route{
		{Host: "plain.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}, Insecure: true},
		{Host: "mixed.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}, Insecure: true},
		{Host: "mixed.test", Path: "/secure", Service: "web", Endpoints: []netip.AddrPort{a.addr()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, false)
	res, body, err := do(c, "http://plain.test/x")
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || !strings.Contains(body, "a") || a.requests.Load() != 1 {
		t.Fatalf("plain host: %d %q, backend requests %d", res.StatusCode, body, a.requests.Load())
	}
	if res, _, err := do(c, "http://mixed.test/x"); err != nil || res.StatusCode != 308 {
		t.Fatalf("a host with a TLS route: %v %v, want a redirect", res, err)
	}
}

// Hosts match exactly, case-insensitively, without the port; paths match
// by whole segments, the longest prefix first.
func TestRouting(t *testing.T) {
	checkLeaks(t)
	root, api, v2, only := newBackend(t, "root", nil), newBackend(t, "api", nil), newBackend(t, "v2", nil), newBackend(t, "only", nil)
	s := newServer(t, Options{Certs: newCertStore(t, "web.test", "other.test")})
	ep := func(b *backend) []netip.AddrPort { return []netip.AddrPort{b.addr()} }
	err := s.SetRoutes([]Route{
		{Host: "web.test", Path: "/", Service: "root", Endpoints: ep(root)},
		{Host: "web.test", Path: "/api/v2/", Service: "v2", Endpoints: ep(v2)}, // trailing slash dropped
		{Host: "Web.Test.", Path: "/api", Service: "api", Endpoints: ep(api)},
		{Host: "other.test", Path: "/only", Service: "only", Endpoints: ep(only)},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, true)
	tests := []struct {
		name, url, host string
		code            int
		backend, uri    string
	}{
		{"root", "https://web.test/", "", 200, "root", "/"},
		{"prefix itself", "https://web.test/api", "", 200, "api", "/api"},
		{"under the prefix", "https://web.test/api/x?q=1", "", 200, "api", "/api/x?q=1"},
		{"not a whole segment", "https://web.test/apix", "", 200, "root", "/apix"},
		{"longest prefix wins", "https://web.test/api/v2/users", "", 200, "v2", "/api/v2/users"},
		{"longest prefix, exact", "https://web.test/api/v2", "", 200, "v2", "/api/v2"},
		{"sibling of the longer prefix", "https://web.test/api/v3", "", 200, "api", "/api/v3"},
		{"host case and port ignored", "https://web.test/api", "WEB.TEST:8443", 200, "api", "/api"},
		{"dot segments resolved for matching, forwarded as sent", "https://web.test/api/v2/../../x", "", 200, "root", "/api/v2/../../x"},
		{"no route on the host", "https://other.test/", "", 404, "", ""},
		{"the other host's route", "https://other.test/only/x", "", 200, "only", "/only/x"},
		{"unknown host", "https://web.test/", "unknown.test", 404, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.host != "" {
				hdr = []string{"Host", tt.host}
			}
			// The client sends the URL's path as written, dot segments too.
			res, body, err := do(c, tt.url, hdr...)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tt.code || field(body, "backend") != tt.backend || (tt.uri != "" && field(body, "uri") != tt.uri) {
				t.Errorf("got %d %q, want %d from %q with uri %q", res.StatusCode, body, tt.code, tt.backend, tt.uri)
			}
		})
	}
	if got := s.table.Load().hosts["web.test"]; got == nil || len(got.routes) != 3 {
		t.Fatalf("web.test routes: %+v", got)
	}
}

// Requests spread over the endpoints in turn, over kept-alive backend
// connections; the backend sees the client's Host and the X-Forwarded
// headers.
func TestRoundRobinKeepAliveAndHeaders(t *testing.T) {
	checkLeaks(t)
	bs := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)}
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{bs[0].addr(), bs[1].addr(), bs[2].addr()}}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, false)
	var order []string
	for range 30 {
		code, body := get(t, c, "https://web.test/x", "X-Forwarded-For", "203.0.113.7")
		if code != 200 {
			t.Fatalf("%d %q", code, body)
		}
		order = append(order, field(body, "backend"))
		for k, want := range map[string]string{"xff": "203.0.113.7, 127.0.0.1", "xfh": "web.test", "xfp": "https", "host": "web.test"} {
			if got := field(body, k); got != want {
				t.Fatalf("backend saw %s=%q, want %q", k, got, want)
			}
		}
	}
	for i := 3; i < len(order); i++ {
		if order[i] != order[i-3] {
			t.Fatalf("request %d went to %s, not in round-robin order: %v", i, order[i], order)
		}
	}
	for _, b := range bs {
		if n := b.requests.Load(); n != 10 {
			t.Errorf("backend %s got %d requests, want 10", b.name, n)
		}
		if n := b.conns.Load(); n != 1 {
			t.Errorf("backend %s accepted %d connections for 10 sequential requests, want 1 (kept alive)", b.name, n)
		}
	}
}

// Each failure has its own status and a short plain body.
func TestErrors(t *testing.T) {
	checkLeaks(t)
	release := make(chan struct{})
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	live := newBackend(t, "live", nil)
	s := newServer(t, Options{Certs: newCertStore(t, "web.test"), Limits: Limits{BackendTimeout: 300 * time.Millisecond}})
	dead := deadAddr(t)
	err := s.SetRoutes([]Route{
		{Host: "web.test", Path: "/none", Service: "none"},
		{Host: "web.test", Path: "/refused", Service: "refused", Endpoints: []netip.AddrPort{dead}},
		{Host: "web.test", Path: "/slow", Service: "slow", Endpoints: []netip.AddrPort{slow.addr()}},
		{Host: "web.test", Path: "/retry", Service: "retry", Endpoints: []netip.AddrPort{dead, live.addr()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, true)
	tests := []struct {
		name, path string
		code       int
		body       string
	}{
		{"no endpoint", "/none", 503, msgNoEndpoint},
		{"refused", "/refused", 502, msgBadGateway},
		{"timeout", "/slow", 504, msgTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, body, err := do(c, "https://web.test"+tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tt.code || body != tt.body || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
				t.Errorf("got %d %q (%s), want %d %q", res.StatusCode, body, res.Header.Get("Content-Type"), tt.code, tt.body)
			}
		})
	}

	t.Run("oversized headers", func(t *testing.T) {
		// net/http allows 4 KiB of slack over MaxHeaderBytes.
		res, _, err := do(newClient(t, s, false), "https://web.test/retry", "X-Big", strings.Repeat("x", MaxHeaderBytes+8192))
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("headers over %d bytes got %d", MaxHeaderBytes, res.StatusCode)
		}
	})

	t.Run("a refused dial is retried on the next endpoint", func(t *testing.T) {
		for i := range 6 {
			code, body := get(t, c, "https://web.test/retry")
			if code != 200 || field(body, "backend") != "live" {
				t.Fatalf("request %d: %d %q", i, code, body)
			}
		}
	})

	t.Run("a request with a body is not sent twice", func(t *testing.T) {
		// The dead endpoint is skipped while marked down; mark the live
		// one down instead so the dead one's turn comes.
		rt := s.table.Load().hosts["web.test"].match("/retry")
		rt.set.Endpoints[0].MarkUp()
		rt.set.Endpoints[1].MarkDown(s.now(), int64(time.Hour))
		var codes []int
		for range 2 {
			res, err := c.Post("https://web.test/retry", "text/plain", strings.NewReader("body"))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			codes = append(codes, res.StatusCode)
		}
		if codes[0] != 502 {
			t.Errorf("POSTs got %v; the first, sent to the dead endpoint, should get 502", codes)
		}
	})
}

// A WebSocket-style upgrade is relayed both ways over the client's
// connection, and Close ends it.
func TestUpgrade(t *testing.T) {
	checkLeaks(t)
	up := newBackend(t, "ws", func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Seen-Proto: "+r.Header.Get("X-Forwarded-Proto")+"\r\n\r\n")
		brw.Flush()
		// Echo, upper-cased so that the test knows the backend answered.
		buf := make([]byte, 1024)
		for {
			n, err := brw.Read(buf)
			if n > 0 {
				c.Write([]byte(strings.ToUpper(string(buf[:n]))))
			}
			if err != nil {
				return
			}
		}
	})
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/ws", Service: "ws", Endpoints: []netip.AddrPort{up.addr()}}}); err != nil {
		t.Fatal(err)
	}
	c, r := rawHTTP1(t, s, "web.test")
	io.WriteString(c, "GET /ws/echo HTTP/1.1\r\nHost: web.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 101 || res.Header.Get("X-Seen-Proto") != "https" {
		t.Fatalf("upgrade answered %s %v", res.Status, res.Header)
	}
	for _, msg := range []string{"hello", "again"} {
		io.WriteString(c, msg)
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(r, buf); err != nil || string(buf) != strings.ToUpper(msg) {
			t.Fatalf("echo of %q: %q, %v", msg, buf, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the upgraded connection is still open after Close: %v", err)
	}
}
