package ingress

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// benchBackend answers every request with a small plain body.
func benchBackend(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "hello\n")
}

// BenchmarkKeepAliveTLS sends small GETs over kept-alive TLS connections,
// from parallel clients: straight to a backend serving TLS itself
// ("direct", the baseline), and through the ingress to the same backend's
// plain HTTP port, over HTTP/1.1 and HTTP/2. Client, ingress and backend
// share the machine, so the ratio, not the figures, is the result.
func BenchmarkKeepAliveTLS(b *testing.B) {
	be := newBackend(b, "bench", benchBackend)
	// The same handler over TLS, for the direct baseline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	direct := &http.Server{Handler: http.HandlerFunc(benchBackend), TLSConfig: &tls.Config{Certificates: []tls.Certificate{*theCA(b).leaf(b, "bench.test")}}}
	go direct.ServeTLS(ln, "", "")
	b.Cleanup(func() { direct.Close() })

	s, err := New(Options{HTTPSAddr: "127.0.0.1:0", Certs: newCertStore(b, "bench.test"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.SetRoutes([]Route{{Host: "bench.test", Path: "/", Service: "bench", Endpoints: []netip.AddrPort{be.addr()}}}); err != nil {
		b.Fatal(err)
	}
	for _, target := range []struct {
		name string
		addr string
		h2   bool
	}{
		{"direct/h1", ln.Addr().String(), false},
		{"ingress/h1", s.HTTPSAddr().String(), false},
		{"direct/h2", ln.Addr().String(), true},
		{"ingress/h2", s.HTTPSAddr().String(), true},
	} {
		b.Run(target.name, func(b *testing.B) {
			tr := &http.Transport{
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, target.addr)
				},
				TLSClientConfig:     &tls.Config{RootCAs: theCA(b).pool},
				ForceAttemptHTTP2:   target.h2,
				MaxIdleConnsPerHost: 64,
			}
			if !target.h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			start := time.Now()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := c.Get("https://bench.test/")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
