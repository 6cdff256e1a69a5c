//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/internal/pebble/pebbletest"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

const ingressHost = "www.keel.test"

// ingressYAML is an Ingress for the web Service with a certificate.
const ingressYAML = `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: ` + ingressHost + `
  backend:
    service: web
  tls:
    email: ops@keel.test
`

// Issue 10: three agents, every one an ingress node, serve one Ingress
// over HTTPS with one certificate, issued once by Pebble over HTTP-01 to
// the owner and answered by another node (the CA's A record points at a
// node that is not the owner, so the answer must come from the shared
// ref); the key is in git only sealed to the nodes. The owner's agent is
// killed: the others keep serving the same certificate (same serial), and
// the new owner does not order another.
func TestIngressSharedCertificate(t *testing.T) {
	t.Parallel()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	httpPort, httpsPort := freePort(t), freePort(t)
	peb := pebbletest.Start(t, pebble.Options{HTTPPort: httpPort})
	dir := t.TempDir()
	roots := filepath.Join(dir, "pebble-roots.pem")
	if err := os.WriteFile(roots, peb.DirectoryRootsPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	nodes := []string{"n1", "n2", "n3"}
	args := map[string][]string{}
	for i, n := range nodes {
		ip := fmt.Sprintf("127.0.1.%d", i+1)
		args[n] = []string{"--ingress-http", net.JoinHostPort(ip, itoa(httpPort)), "--ingress-https", net.JoinHostPort(ip, itoa(httpsPort)),
			"--acme-directory", peb.DirectoryURL, "--acme-ca-roots", roots, "--acme-http01-wait", "3s", "--acme-retry-min", "2s", "--log-level", "debug"}
	}
	c := newCluster(t, 4*time.Minute, localcluster.Options{
		Dir: dir, Nodes: nodes, IngressNodes: nodes, ReportKeys: true, NodeArgs: args,
		Files: map[string]string{"apps/web.yaml": webService(2, "base/demo", "hello")},
	})
	c.converge("web")
	c.waitEndpoints("web", webPort)

	// The owner is the planner's choice; the CA is sent to another node.
	if err := os.WriteFile(filepath.Join(c.Work, "apps", "www.yaml"), []byte(ingressYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	owner := c.ingressOwner()
	other := nodes[(slices.Index(nodes, owner)+1)%len(nodes)]
	if err := peb.AddA(ingressHost, nodeIP(nodes, other)); err != nil {
		t.Fatal(err)
	}
	c.commit("an Ingress with a certificate", map[string]string{"apps/www.yaml": ingressYAML})
	t.Logf("owner %s; Pebble validates at %s", owner, other)

	// Every node serves the page over HTTPS with the one certificate.
	var serial string
	c.waitFor("every ingress node serves the host with one Pebble certificate", func() (bool, string) {
		serials := map[string]string{}
		for _, n := range nodes {
			s, body, err := httpsGet(c.ctx, nodeIP(nodes, n), httpsPort, peb.IssuingRoots)
			if err != nil {
				return false, n + ": " + err.Error()
			}
			if !strings.HasPrefix(body, "hello from web-") {
				return false, n + " answered " + body
			}
			serials[n] = s
		}
		serial = serials[nodes[0]]
		for n, s := range serials {
			if s != serial {
				return false, fmt.Sprintf("serials differ: %v (%s)", serials, n)
			}
		}
		return true, ""
	})
	if issued := c.renewals(owner, "issued"); issued != 1 {
		t.Fatalf("the owner %s issued %v certificates, want 1", owner, issued)
	}
	for _, n := range nodes {
		if n != owner && c.renewals(n, "issued") != 0 {
			t.Fatalf("%s, not the owner, issued a certificate", n)
		}
	}
	c.checkReportedCertificate(nodes, serial)
	c.checkSealed(ingressHost)
	checkRedirect(t, c.ctx, nodeIP(nodes, other), httpPort)

	// The owner's agent dies: the others keep serving the same certificate,
	// and the new owner takes it over without ordering another.
	c.killAgent(owner)
	var alive []string
	for _, n := range nodes {
		if n != owner {
			alive = append(alive, n)
		}
	}
	c.waitFor("another node owns the Ingress", func() (bool, string) {
		o := c.ingressOwner()
		return o != owner && o != "", "owner " + o
	})
	newOwner := c.ingressOwner()
	// Give the new owner time to order one, if it wrongly would.
	deadline := time.Now().Add(scaled(5 * time.Second))
	for time.Now().Before(deadline) {
		for _, n := range alive {
			s, body, err := httpsGet(c.ctx, nodeIP(nodes, n), httpsPort, peb.IssuingRoots)
			if err != nil || s != serial || !strings.HasPrefix(body, "hello from web-") {
				t.Fatalf("after the owner died, %s: serial %s (want %s), %q, %v", n, s, serial, body, err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if issued := c.renewals(newOwner, "issued"); issued != 0 {
		t.Fatalf("the new owner %s issued %v certificates after the failover, want 0 (the shared one is reused)", newOwner, issued)
	}

	// The operator deletes the shared copy to force a new key: every node
	// stops serving the old certificate, and the owner orders a new one.
	ref, err := sync.CertRef(ingressHost)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", c.Bare, "update-ref", "-d", ref.String()).CombinedOutput(); err != nil {
		t.Fatalf("delete %s: %v: %s", ref, err, out)
	}
	c.waitFor("the nodes alive serve a new certificate", func() (bool, string) {
		for _, n := range alive {
			s, _, err := httpsGet(c.ctx, nodeIP(nodes, n), httpsPort, peb.IssuingRoots)
			if err != nil {
				return false, n + ": " + err.Error()
			}
			if s == serial {
				return false, n + " still serves the withdrawn certificate " + s
			}
		}
		return true, ""
	})
	if issued := c.renewals(newOwner, "issued"); issued != 1 {
		t.Fatalf("the owner %s issued %v certificates after the shared one was withdrawn, want 1", newOwner, issued)
	}
}

// freePort returns a TCP port free on the loopback addresses now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// nodeIP is the address localcluster gives node.
func nodeIP(nodes []string, node string) string {
	return fmt.Sprintf("127.0.1.%d", slices.Index(nodes, node)+1)
}

// ingressOwner is the owner of Ingress www by the plan of the work tree's
// specs and the published reports, as every agent computes it.
func (c *cluster) ingressOwner() string {
	c.t.Helper()
	var pub map[string]report.Report
	c.waitFor("the published reports", func() (bool, string) {
		var err error
		pub, err = c.published() // a ref read as a push writes it fails
		return err == nil, fmt.Sprint(err)
	})
	var reports []report.Report
	var names []string
	for _, r := range pub {
		reports = append(reports, r)
	}
	m := c.model()
	for _, n := range m.Nodes {
		names = append(names, n.Name)
	}
	now := time.Now()
	in := planner.Input{Model: m, Reports: reports, Now: now}
	if len(reports) == 0 {
		in.PresumeAlive = names
	}
	for _, i := range planner.Compute(in).Ingresses {
		if i.Name == "www" {
			return i.Owner
		}
	}
	return ""
}

// renewals reads node's keel_certificate_renewals_total for the host.
func (c *cluster) renewals(node, result string) float64 {
	c.t.Helper()
	v, err := c.metric(node, fmt.Sprintf(`keel_certificate_renewals_total{host=%q,result=%q}`, ingressHost, result))
	if err != nil {
		return 0 // no series: no order ended that way
	}
	return v
}

// checkReportedCertificate checks that every node reports serving the
// certificate of the given serial.
func (c *cluster) checkReportedCertificate(nodes []string, serial string) {
	c.t.Helper()
	c.waitFor("every node reports the certificate", func() (bool, string) {
		pub, err := c.published()
		if err != nil {
			return false, err.Error()
		}
		for _, n := range nodes {
			r, ok := pub[n]
			if !ok {
				return false, n + " has no report"
			}
			i := slices.IndexFunc(r.Certificates, func(cr report.Certificate) bool { return cr.Host == ingressHost })
			if i < 0 || r.Certificates[i].Serial != serial || r.Certificates[i].Expires.IsZero() || r.Certificates[i].Issuer == "" {
				return false, fmt.Sprintf("%s reports %+v", n, r.Certificates)
			}
		}
		return true, ""
	})
}

// checkSealed checks that the shared certificate in the repository holds
// no private key in the clear, and that a key that is not a node's
// cannot open it.
func (c *cluster) checkSealed(host string) {
	c.t.Helper()
	ref, err := sync.CertRef(host)
	if err != nil {
		c.t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", c.Bare, "ls-tree", "-r", ref.String()).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(certshare.BundleFile)) {
		c.t.Fatalf("no sealed bundle on %s: %s %v", ref, out, err)
	}
	all, err := exec.Command("git", "-C", c.Bare, "cat-file", "--batch-all-objects", "--batch").Output()
	if err != nil {
		c.t.Fatal(err)
	}
	if bytes.Contains(all, []byte("PRIVATE KEY")) {
		c.t.Fatal("a private key is in the repository in the clear")
	}
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		c.t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		c.t.Fatal(err)
	}
	stranger, err := certshare.ParseIdentity(pem.EncodeToMemory(block))
	if err != nil {
		c.t.Fatal(err)
	}
	bundle, err := exec.Command("git", "-C", c.Bare, "show", ref.String()+":"+certshare.BundleFile).Output()
	if err != nil {
		c.t.Fatal(err)
	}
	meta, err := exec.Command("git", "-C", c.Bare, "show", ref.String()+":"+certshare.MetaFile).Output()
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := certshare.ParseMeta(meta)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := certshare.Open(certshare.Sealed{Meta: m, Bundle: bundle}, stranger); err == nil {
		c.t.Fatal("a key that is no node's opened the shared certificate")
	}
}

// httpsGet gets / of host over HTTPS at ip:port, trusting roots only, and
// returns the certificate's serial and the body.
func httpsGet(ctx context.Context, ip string, port int, roots *x509.CertPool) (serial, body string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addr := net.JoinHostPort(ip, itoa(port))
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: ingressHost},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, "GET", "https://"+ingressHost+"/", nil)
	if err != nil {
		return "", "", err
	}
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return "", "", err
	}
	if res.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("%s: %s", res.Status, b)
	}
	return providers.Serial(res.TLS.PeerCertificates[0]), string(b), nil
}

// checkRedirect checks that plain HTTP is redirected to HTTPS.
func checkRedirect(t *testing.T, ctx context.Context, ip string, port int) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+net.JoinHostPort(ip, itoa(port))+"/a?b=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = ingressHost
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusPermanentRedirect || res.Header.Get("Location") != "https://"+ingressHost+"/a?b=1" {
		t.Fatalf("plain HTTP: %s Location %q, want 308 to https://%s/a?b=1", res.Status, res.Header.Get("Location"), ingressHost)
	}
}
