// Command ingressbench runs the parts of bench/ingress.sh that are Go: a
// self-signed certificate, the backend every proxy forwards to, and Keel's
// ingress (nodeexec/ingress) as a standalone process. It is a benchmark
// harness, not part of keel.
//
//	ingressbench cert DIR HOST              write DIR/cert.pem and DIR/key.pem for HOST
//	ingressbench backend HTTP-ADDR HTTPS-ADDR DIR
//	                                        answer "hello\n" on both (HTTPS with DIR's certificate)
//	ingressbench keel HTTPS-ADDR HOST BACKEND-ADDR DIR
//	                                        Keel's ingress for HOST, to BACKEND-ADDR
//	ingressbench handshakes ADDR HOST CONNS DURATION
//	                                        CONNS clients each making a new connection
//	                                        with a full TLS handshake (no session
//	                                        resumption) per GET, for DURATION; prints
//	                                        "<connections/s> <errors>"
//
// The servers run until SIGINT or SIGTERM.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/keel-dev/keel/nodeexec/ingress"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ingressbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: ingressbench cert|backend|keel|handshakes ARGS (see the package doc)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch cmd, args := args[0], args[1:]; {
	case cmd == "cert" && len(args) == 2:
		return writeCert(args[0], args[1])
	case cmd == "backend" && len(args) == 3:
		return backend(ctx, args[0], args[1], args[2])
	case cmd == "keel" && len(args) == 4:
		return keel(ctx, args[0], args[1], args[2], args[3])
	case cmd == "handshakes" && len(args) == 4:
		conns, err := strconv.Atoi(args[2])
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(args[3])
		if err != nil {
			return err
		}
		return handshakes(args[0], args[1], conns, d)
	}
	return fmt.Errorf("bad arguments %q", args)
}

// writeCert writes a self-signed ECDSA P-256 certificate for host (what an
// ACME CA would issue, minus the chain).
func writeCert(dir, host string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
}

func loadCert(dir string) (tls.Certificate, error) {
	return tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
}

func hello(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "hello\n")
}

// backend serves hello over plain HTTP (for the proxies) and over TLS (the
// direct baseline).
func backend(ctx context.Context, httpAddr, httpsAddr, dir string) error {
	cert, err := loadCert(dir)
	if err != nil {
		return err
	}
	plain := &http.Server{Addr: httpAddr, Handler: http.HandlerFunc(hello)}
	secure := &http.Server{Addr: httpsAddr, Handler: http.HandlerFunc(hello), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	errc := make(chan error, 2)
	go func() { errc <- plain.ListenAndServe() }()
	go func() { errc <- secure.ListenAndServeTLS("", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	plain.Close()
	secure.Close()
	return nil
}

// fullHandshakes counts the handshakes that asked for the certificate:
// every one but resumptions.
var fullHandshakes atomic.Int64

// staticCert is a Certs of one host.
type staticCert struct {
	host string
	cert *tls.Certificate
}

func (c staticCert) Certificate(host string) *tls.Certificate {
	fullHandshakes.Add(1)
	if host == c.host {
		return c.cert
	}
	return nil
}

// keel runs the ingress with one route, host to the backend.
func keel(ctx context.Context, httpsAddr, host, backendAddr, dir string) error {
	cert, err := loadCert(dir)
	if err != nil {
		return err
	}
	be, err := netip.ParseAddrPort(backendAddr)
	if err != nil {
		return err
	}
	s, err := ingress.New(ingress.Options{
		HTTPSAddr: httpsAddr,
		Certs:     staticCert{host, &cert},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		// The load generator's connections all come from one address.
		Limits: ingress.Limits{MaxConns: 4096},
	})
	if err != nil {
		return err
	}
	if err := s.SetRoutes([]ingress.Route{{Host: host, Path: "/", Service: "bench", Endpoints: []netip.AddrPort{be}}}); err != nil {
		s.Close()
		return err
	}
	fmt.Fprintln(os.Stderr, "keel ingress on", s.HTTPSAddr())
	if f := os.Getenv("INGRESSBENCH_CPUPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			return err
		}
		defer out.Close()
		if err := pprof.StartCPUProfile(out); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "full handshakes:", fullHandshakes.Load())
	return s.Close()
}

// handshakes makes connections with a full TLS handshake each (the client
// keeps no session, so none is resumed) and one GET with "Connection:
// close" on each, from conns goroutines for d.
func handshakes(addr, host string, conns int, d time.Duration) error {
	cfg := &tls.Config{ServerName: host, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	req := "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
	var ok, failed atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for time.Now().Before(deadline) {
				if err := oneConn(addr, cfg, req, buf); err != nil {
					failed.Add(1)
					continue
				}
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	fmt.Printf("%.0f %d\n", float64(ok.Load())/d.Seconds(), failed.Load())
	return nil
}

func oneConn(addr string, cfg *tls.Config, req string, buf []byte) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	var got []byte
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if !strings.HasPrefix(string(got), "HTTP/1.1 200") {
		return fmt.Errorf("answer %.40q", got)
	}
	return nil
}
