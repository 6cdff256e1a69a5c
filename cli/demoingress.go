package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/providers"
)

// demoACME is the demo's certificate authority: a Pebble on 127.0.0.1,
// and the ports every node's ingress listens on.
type demoACME struct {
	peb         *pebble.Server
	http, https int
	// dirRoots verify Pebble's directory (the agents'
	// --acme-ca-roots); issuingRoots the certificates it issues (curl's
	// --cacert).
	dirRoots, issuingRoots string
	nodes                  []string
}

// demoNodeIP is the address localcluster gives the i-th node.
func demoNodeIP(i int) string { return fmt.Sprintf("127.0.1.%d", i+1) }

// startDemoACME builds Pebble (once, into the user's cache, with go from
// the module proxy) and starts it; its DNS answers the demo host with
// every node's address, so any node may be asked for an HTTP-01 answer.
func startDemoACME(root string, nodes []string) (*demoACME, error) {
	pebbleBin, challBin, err := pebble.Build(pebble.DefaultDir())
	if err != nil {
		return nil, err
	}
	d := &demoACME{nodes: nodes}
	if d.http, err = freeLoopbackPort(); err != nil {
		return nil, err
	}
	if d.https, err = freeLoopbackPort(); err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "pebble")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d.peb, err = pebble.Start(pebble.Options{Dir: dir, PebbleBin: pebbleBin, ChallBin: challBin, HTTPPort: d.http})
	if err != nil {
		return nil, err
	}
	var ips []string
	for i := range nodes {
		ips = append(ips, demoNodeIP(i))
	}
	d.dirRoots, d.issuingRoots = filepath.Join(dir, "directory-roots.pem"), filepath.Join(root, "pebble-roots.pem")
	for _, step := range []func() error{
		func() error { return d.peb.AddA(demoHost, ips...) },
		func() error { return os.WriteFile(d.dirRoots, d.peb.DirectoryRootsPEM, 0o600) },
		func() error { return os.WriteFile(d.issuingRoots, d.peb.IssuingRootsPEM, 0o644) },
	} {
		if err := step(); err != nil {
			d.peb.Close()
			return nil, err
		}
	}
	return d, nil
}

// freeLoopbackPort returns a TCP port free on loopback now.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitServed waits until every node serves the demo host over HTTPS with a
// certificate that chains to Pebble's root.
func (d *demoACME) waitServed(ctx context.Context, n int) error {
	var last error
	for {
		served := 0
		for i := range n {
			if _, err := d.get(ctx, demoNodeIP(i)); err != nil {
				last = err
				break
			}
			served++
		}
		if served == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// get fetches https://demoHost/ from the node at ip, trusting Pebble's
// root only, and returns the certificate's serial.
func (d *demoACME) get(ctx context.Context, ip string) (string, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(d.peb.IssuingRootsPEM)
	addr := net.JoinHostPort(ip, strconv.Itoa(d.https))
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: demoHost},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "https://"+demoHost+"/", nil)
	if err != nil {
		return "", err
	}
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s answered %s", ip, res.Status)
	}
	return providers.Serial(res.TLS.PeerCertificates[0]), nil
}

// printDemoIngress shows how to reach the Ingress on every node, and how
// to see that the owner's death changes nothing a client sees.
func (e *env) printDemoIngress(c *localcluster.Cluster, d *demoACME) {
	owner := ""
	if m, err := c.Model(); err == nil {
		for _, in := range planner.Compute(planner.Input{Model: m, Now: time.Now(), AssumeAlive: true}).Ingresses {
			if in.Name == "www" {
				owner = in.Owner
			}
		}
	}
	serial, _ := d.get(context.Background(), demoNodeIP(0))
	fmt.Fprintf(e.stdout, "\nHTTPS: every node serves https://%s/ with one certificate from Pebble (serial %s):\n", demoHost, serial)
	for i, n := range d.nodes {
		fmt.Fprintf(e.stdout, "  %s  curl --cacert %s --resolve %s:%d:%s https://%s:%d/\n", n,
			shellQuote(d.issuingRoots), demoHost, d.https, demoNodeIP(i), demoHost, d.https)
	}
	if owner != "" {
		other := demoNodeIP((slices.Index(d.nodes, owner) + 1) % len(d.nodes))
		fmt.Fprintf(e.stdout, `
%s obtained it and shared it, sealed to the nodes' keys, on refs/keel/certs/%s.
Kill its agent: the other nodes keep serving the same certificate, and the
next owner takes it over without ordering another:
  kill -9 %d
  curl --cacert %s --resolve %s:%d:%s https://%s:%d/
  openssl s_client -connect %s:%d -servername %s </dev/null 2>/dev/null | openssl x509 -noout -serial
`, owner, demoHost, c.PID(owner), shellQuote(d.issuingRoots), demoHost, d.https, other, demoHost, d.https, other, d.https, demoHost)
	}
	fmt.Fprintln(e.stdout, "\nPress Ctrl-C to stop the demo.")
}
