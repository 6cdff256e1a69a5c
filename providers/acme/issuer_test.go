package acme

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/providers"
)

func TestObtainHTTP01ServesToAClientTrustingOnlyPebble(t *testing.T) {
	c := startCA(t, pebble.Options{})
	i := c.issuer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	b, err := i.Obtain(ctx, "web.example.com", "ops@example.com", c.http)
	if err != nil {
		t.Fatal(err)
	}
	leaf := serveTLS(t, b, c.IssuingRoots)
	if providers.Serial(leaf) != b.Serial || b.Host != "web.example.com" {
		t.Fatalf("served serial %x, bundle %+v", leaf.SerialNumber, b)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("certificate key %T, want ECDSA P-256", leaf.PublicKey)
	}
	presents, cleans, _, pending := c.http.counts()
	if presents != 1 || cleans != 1 || pending != 0 {
		t.Fatalf("presents %d, clean-ups %d, answers left %d; want 1, 1, 0", presents, cleans, pending)
	}

	// A second certificate has a key of its own.
	b2, err := i.Obtain(ctx, "web.example.com", "ops@example.com", c.http)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(b.KeyPEM, b2.KeyPEM) || b.Serial == b2.Serial {
		t.Fatal("two certificates share a key or a serial")
	}
}

func TestObtainDNS01RemovesTheRecordAfterwards(t *testing.T) {
	c := startCA(t, pebble.Options{})
	i := c.issuer(t, t.TempDir())
	dns := &challDNS{srv: c.Server}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// No A record at all: DNS-01 must not depend on reaching the host.
	if err := c.SetDefaultIPv4(""); err != nil {
		t.Fatal(err)
	}
	b, err := i.Obtain(ctx, "api.example.org", "", DNS01(dns))
	if err != nil {
		t.Fatal(err)
	}
	serveTLS(t, b, c.IssuingRoots)
	presents, cleans := dns.calls()
	if len(presents) != 1 || cleans != 1 {
		t.Fatalf("presents %d, clean-ups %d; want 1 and 1", len(presents), cleans)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", c.DNSAddr)
	}}
	if txt, err := r.LookupTXT(ctx, DNS01Name("api.example.org")+"."); err == nil {
		t.Fatalf("the challenge record is still there: %v", txt)
	}
	if _, err := i.Obtain(ctx, "api.example.org", "", c.http); err == nil {
		t.Fatal("HTTP-01 succeeded with no address for the host")
	}
}

func TestFailedValidationCleansUpAndSaysWhy(t *testing.T) {
	c := startCA(t, pebble.Options{})
	i := c.issuer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	dns := &challDNS{srv: c.Server, value: func(string) string { return "not-the-answer" }}
	_, err := i.Obtain(ctx, "bad.example.com", "", DNS01(dns))
	var ce *Error
	if !errors.As(err, &ce) || ce.Type != "unauthorized" || !strings.Contains(ce.Op, "dns-01 validation of bad.example.com") {
		t.Fatalf("err = %v, want an unauthorized dns-01 validation *Error", err)
	}
	if strings.Contains(err.Error(), "http") || strings.Contains(err.Error(), "PRIVATE") {
		t.Fatalf("error names a URL or a key: %v", err)
	}
	if _, cleans := dns.calls(); cleans != 1 {
		t.Fatalf("clean-ups %d after a failed validation, want 1", cleans)
	}

	// Present failing cleans up too, and the CA is not asked to validate.
	dns = &challDNS{srv: c.Server, fail: func(string) error { return errDNSDown }}
	_, err = i.Obtain(ctx, "bad.example.com", "", DNS01(dns))
	if !errors.Is(err, errDNSDown) {
		t.Fatalf("err = %v, want the provider's", err)
	}
	if _, cleans := dns.calls(); cleans != 1 {
		t.Fatalf("clean-ups %d after a failed Present, want 1", cleans)
	}

	// A challenge type the CA does not offer.
	if _, err := i.Obtain(ctx, "x.example.com", "", otherSolver{}); err == nil || !strings.Contains(err.Error(), "offers no tls-alpn-01x challenge") {
		t.Fatalf("err = %v", err)
	}
}

type otherSolver struct{}

func (otherSolver) Type() string { return "tls-alpn-01x" }
func (otherSolver) Present(context.Context, string, string, string) error {
	panic("Present called for a challenge the CA did not offer")
}
func (otherSolver) CleanUp(context.Context, string, string, string) error { return nil }

func TestAccountKeyIsPrivateAndReused(t *testing.T) {
	c := startCA(t, pebble.Options{})
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	i1 := c.issuer(t, state)
	if want := AccountKeyPath(state, c.DirectoryURL); i1.AccountKeyFile() != want ||
		!strings.HasPrefix(want, filepath.Join(state, "acme", "127.0.0.1_")) {
		t.Fatalf("account key at %s, want %s under acme/127.0.0.1_<port>-<hash>", i1.AccountKeyFile(), want)
	}
	fi, err := os.Stat(i1.AccountKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("account key mode %#o, want 0600", fi.Mode().Perm())
	}
	key1, _ := os.ReadFile(i1.AccountKeyFile())
	if block, _ := pem.Decode(key1); block == nil || block.Type != "PRIVATE KEY" {
		t.Fatal("account key is not a PKCS #8 PEM block")
	} else if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err != nil {
		t.Fatal(err)
	} else if ek, ok := k.(*ecdsa.PrivateKey); !ok || ek.Curve != elliptic.P256() {
		t.Fatalf("account key %T, want ECDSA P-256", k)
	}
	if _, err := i1.Obtain(ctx, "a.example.com", "ops@example.com", c.http); err != nil {
		t.Fatal(err)
	}

	// A second Issuer (the agent restarted) uses the same key and the
	// account the CA already has for it.
	i2 := c.issuer(t, state)
	key2, _ := os.ReadFile(i2.AccountKeyFile())
	if !bytes.Equal(key1, key2) {
		t.Fatal("a second Issuer made a new account key")
	}
	if _, err := i2.Obtain(ctx, "b.example.com", "ops@example.com", c.http); err != nil {
		t.Fatal(err)
	}

	// Another directory, another account.
	other := AccountKeyPath(state, "https://acme-staging-v02.api.letsencrypt.org/directory")
	if other == i1.AccountKeyFile() || !strings.Contains(other, "acme-staging-v02.api.letsencrypt.org-") {
		t.Fatalf("staging account key at %s", other)
	}

	// A key others can read is refused, not used.
	if err := os.Chmod(i1.AccountKeyFile(), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := NewIssuer(Options{Directory: c.DirectoryURL, StateDir: state}); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("NewIssuer with a 0640 key: %v", err)
	}
}

func TestConcurrentIssuersCreateOneAccountKey(t *testing.T) {
	state := t.TempDir()
	const n = 8
	keys := make([][]byte, n)
	var wg stdsync.WaitGroup
	for k := range n {
		wg.Go(func() {
			i, err := NewIssuer(Options{Directory: "https://ca.example/dir", StateDir: state})
			if err != nil {
				t.Error(err)
				return
			}
			keys[k], _ = os.ReadFile(i.AccountKeyFile())
		})
	}
	wg.Wait()
	for k := 1; k < n; k++ {
		if !bytes.Equal(keys[0], keys[k]) || len(keys[k]) == 0 {
			t.Fatal("concurrent Issuers ended up with different account keys")
		}
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(AccountKeyPath(state, "https://ca.example/dir")), ".account.key-*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// countBadNonces wraps i's transport to count the CA's badNonce answers.
type countBadNonces struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countBadNonces) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusBadRequest &&
		strings.Contains(resp.Header.Get("Content-Type"), "problem") {
		c.n.Add(1)
	}
	return resp, err
}

// TestBadNoncesAreRetried: Pebble rejects a quarter of the good nonces;
// x/crypto/acme retries a badNonce itself with a fresh nonce, after the
// wait retryBackoff gives (milliseconds, not its default seconds). Three
// orders run at once on one Issuer, as the Manager runs them. (Not half:
// the run fails when one of its thirty-odd requests meets eleven
// rejections in a row (maxNonceRetries), which at one in two happened to
// about one run in sixty; at one in four, to about one in 100,000.)
func TestBadNoncesAreRetried(t *testing.T) {
	c := startCA(t, pebble.Options{NonceReject: 25})
	i := c.issuer(t, t.TempDir())
	counter := &countBadNonces{next: i.http.Transport}
	i.http.Transport = counter
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hosts := []string{"n1.example.com", "n2.example.com", "n3.example.com"}
	bundles := make([]*providers.Bundle, len(hosts))
	errs := make([]error, len(hosts))
	var wg stdsync.WaitGroup
	for k, host := range hosts {
		wg.Go(func() { bundles[k], errs[k] = i.Obtain(ctx, host, "", c.http) })
	}
	wg.Wait()
	for k := range hosts {
		if errs[k] != nil {
			t.Fatal(errs[k])
		}
		serveTLS(t, bundles[k], c.IssuingRoots)
	}
	if counter.n.Load() == 0 {
		t.Fatal("Pebble rejected no nonce: the knob did not take")
	}
	t.Logf("%d bad nonces retried", counter.n.Load())
}

func TestObtainRefusesBadInput(t *testing.T) {
	i, err := NewIssuer(Options{Directory: "https://ca.example/dir", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, host := range []string{"", "Upper.example.com", "trailing.example.com.", "a..b", "under_score.example", "*x.example.com", strings.Repeat("a", 64) + ".example"} {
		if _, err := i.Obtain(ctx, host, "", otherSolver{}); err == nil {
			t.Errorf("Obtain(%q) did not refuse", host)
		}
	}
	for _, email := range []string{"not an email", "a@b.example\r\nBcc: x@y", "Name <a@b.example>"} {
		if _, err := i.Obtain(ctx, "ok.example.com", email, otherSolver{}); err == nil || !strings.Contains(err.Error(), "not an email") {
			t.Errorf("Obtain with contact %q: %v", email, err)
		}
	}
	for _, dir := range []string{"http://ca.example/dir", "ca.example/dir", "https:///dir"} {
		if _, err := NewIssuer(Options{Directory: dir, StateDir: t.TempDir()}); err == nil {
			t.Errorf("NewIssuer accepted directory %q", dir)
		}
	}
}
