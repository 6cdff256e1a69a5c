// Package acme obtains certificates from an ACME CA (Let's Encrypt, or
// Pebble in tests) with golang.org/x/crypto/acme, and renews them: an
// Issuer runs one order, a Manager keeps a set of hosts' certificates
// current, each host on its own goroutine. It never serves, publishes or
// stores a certificate: the caller does (OnIssued). Private keys never
// appear in its errors, logs or metrics.
package acme

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/mail"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	stdsync "sync"
	"time"

	"golang.org/x/crypto/acme"

	"github.com/keel-dev/keel/providers"
)

// The directories of Let's Encrypt.
const (
	LetsEncrypt        = "https://acme-v02.api.letsencrypt.org/directory"
	LetsEncryptStaging = "https://acme-staging-v02.api.letsencrypt.org/directory"
)

// Options configures an Issuer.
type Options struct {
	// Directory is the CA's ACME directory URL; LetsEncrypt if empty.
	Directory string
	// Roots verify the directory's TLS certificate; the system's if nil
	// (tests give Pebble's).
	Roots *x509.CertPool
	// StateDir is the node's state directory: the account key lives in
	// StateDir/acme/<directory>/account.key. Required.
	StateDir string
	// Logger; slog.Default() if nil.
	Logger *slog.Logger
	// UserAgent names the client to the CA ("keel/<version>").
	UserAgent string
	// RequestTimeout bounds each HTTP request to the CA; 30 s if zero.
	RequestTimeout time.Duration
	// CleanUpTimeout bounds a Solver's CleanUp, which runs even when the
	// order's context is done; 30 s if zero.
	CleanUpTimeout time.Duration
}

// Issuer obtains certificates from one ACME directory with this node's
// account there. It is safe for concurrent use: orders for different
// hosts run in parallel.
type Issuer struct {
	opts    Options
	keyFile string
	key     crypto.Signer
	log     *slog.Logger
	http    *http.Client

	mu     stdsync.Mutex // guards client and registered
	client *acme.Client
	// registered is set once the account is known to the CA (registered
	// now or before: the CA answers a registration of a known key with
	// the existing account, whose URL the client then keeps).
	registered bool
}

// NewIssuer loads this node's account key for opts.Directory, creating it
// on first use. The account is registered with the CA on the first order.
func NewIssuer(opts Options) (*Issuer, error) {
	if opts.StateDir == "" {
		return nil, errors.New("acme: Options.StateDir is required")
	}
	if opts.Directory == "" {
		opts.Directory = LetsEncrypt
	}
	u, err := url.Parse(opts.Directory)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("acme: directory %q is not an https URL", opts.Directory)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 30 * time.Second
	}
	if opts.CleanUpTimeout == 0 {
		opts.CleanUpTimeout = 30 * time.Second
	}
	keyFile := AccountKeyPath(opts.StateDir, opts.Directory)
	key, err := loadOrCreateKey(keyFile)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: opts.Roots, MinVersion: tls.VersionTLS12}
	i := &Issuer{
		opts:    opts,
		keyFile: keyFile,
		key:     key,
		log:     opts.Logger,
		http:    &http.Client{Transport: tr, Timeout: opts.RequestTimeout},
	}
	i.client = i.newClient()
	return i, nil
}

func (i *Issuer) newClient() *acme.Client {
	return &acme.Client{
		Key:          i.key,
		HTTPClient:   i.http,
		DirectoryURL: i.opts.Directory,
		UserAgent:    i.opts.UserAgent,
		RetryBackoff: retryBackoff,
	}
}

// AccountKeyPath is where the account key for directory lives under
// stateDir: acme/<host of the directory>-<hash of its URL>/account.key,
// one account per node and directory.
func AccountKeyPath(stateDir, directory string) string {
	host := "directory"
	if u, err := url.Parse(directory); err == nil && u.Host != "" {
		host = u.Host
	}
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '_'
	}, host)
	sum := sha256.Sum256([]byte(directory))
	return filepath.Join(stateDir, "acme", clean+"-"+hex.EncodeToString(sum[:4]), "account.key")
}

// AccountKeyFile returns the path of the account key the Issuer uses.
func (i *Issuer) AccountKeyFile() string { return i.keyFile }

// loadOrCreateKey reads the account key at file or, when there is none,
// makes an ECDSA P-256 key and writes it there, mode 0600, atomically: a
// crash leaves either no key or the whole key, and of two processes
// creating it at once both end up with the one written first.
func loadOrCreateKey(file string) (crypto.Signer, error) {
	key, err := loadKey(file)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	pemKey, err := providers.EncodeKey(k)
	if err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".account.key-*")
	if err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600 already; say so for the reader.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	if _, err := tmp.Write(pemKey); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	// Link, not rename: it fails rather than replace a key another
	// process wrote meanwhile, which we then use.
	if err := os.Link(tmp.Name(), file); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	if d, err := os.Open(filepath.Dir(file)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return loadKey(file)
}

// loadKey reads a PEM private key (PKCS #8, SEC 1 or PKCS #1) that only
// its owner may read.
func loadKey(file string) (crypto.Signer, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("acme: account key %s is readable by others (mode %#o): chmod 600 it", file, fi.Mode().Perm())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("acme: account key: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("acme: account key %s: no PEM block", file)
	}
	var k any
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		err = fmt.Errorf("PEM block %q", block.Type)
	}
	if err != nil {
		// The parsers' errors describe the encoding, never the key.
		return nil, fmt.Errorf("acme: account key %s: %w", file, err)
	}
	switch k := k.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("acme: account key %s: %T is not an ECDSA or RSA key", file, k)
}

// account returns the client, registering the account with the CA first
// if this Issuer has not yet: a new account with email as its contact, or
// the existing one of this key (whose contact is left as it is).
func (i *Issuer) account(ctx context.Context, email string) (*acme.Client, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.registered {
		return i.client, nil
	}
	acct := &acme.Account{}
	if email != "" {
		acct.Contact = []string{"mailto:" + email}
	}
	_, err := i.client.Register(ctx, acct, acme.AcceptTOS)
	if err != nil && !errors.Is(err, acme.ErrAccountAlreadyExists) {
		return nil, caError("registering the account", err)
	}
	if err == nil {
		i.log.Info("registered an ACME account", "directory", i.opts.Directory)
	}
	i.registered = true
	return i.client, nil
}

// forget drops the registration after the CA said it knows no such
// account (a CA whose state was reset, Pebble restarted): the next order
// registers again.
func (i *Issuer) forget(c *acme.Client) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.client == c {
		i.client = i.newClient()
		i.registered = false
	}
}

// Obtain runs one order for host: it authorizes host with s's challenge,
// then finalizes with a fresh ECDSA P-256 key and returns the issued
// chain and key. email is the account's contact when this order
// registers it. s.CleanUp runs for every challenge s.Present was called
// for, whatever happens.
func (i *Issuer) Obtain(ctx context.Context, host, email string, s Solver) (*providers.Bundle, error) {
	if err := checkHost(host); err != nil {
		return nil, err
	}
	if email != "" {
		if a, err := mail.ParseAddress(email); err != nil || a.Address != email {
			return nil, fmt.Errorf("acme: contact %q is not an email address", email)
		}
	}
	client, err := i.account(ctx, email)
	if err != nil {
		return nil, err
	}
	b, err := i.obtain(ctx, client, host, s)
	var e *Error
	if errors.As(err, &e) && e.Type == "accountDoesNotExist" {
		i.forget(client)
	}
	return b, err
}

func (i *Issuer) obtain(ctx context.Context, client *acme.Client, host string, s Solver) (*providers.Bundle, error) {
	order, err := client.AuthorizeOrder(ctx, acme.DomainIDs(host))
	if err != nil {
		return nil, caError("new order", err)
	}
	for _, u := range order.AuthzURLs {
		if err := i.authorize(ctx, client, u, s); err != nil {
			return nil, err
		}
	}
	// The order's URL comes with the new order only: later answers need
	// not repeat it.
	orderURL := order.URI
	if order, err = client.WaitOrder(ctx, orderURL); err != nil {
		return nil, caError("order", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("acme: certificate key: %w", err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{host}}, key)
	if err != nil {
		return nil, fmt.Errorf("acme: certificate request: %w", err)
	}
	ders, err := finalize(ctx, client, orderURL, order.FinalizeURL, csr)
	if err != nil {
		return nil, err
	}
	var chain []byte
	for _, der := range ders {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyPEM, err := providers.EncodeKey(key)
	if err != nil {
		return nil, fmt.Errorf("acme: certificate key: %w", err)
	}
	b, err := providers.ParseBundle(host, chain, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("acme: the CA's certificate: %w", err)
	}
	return b, nil
}

// finalize submits the CSR and fetches the certificate chain.
// CreateOrderCert polls the order at the URL the finalize answer's
// Location names; a CA may leave it out (Pebble does, RFC 8555 does not
// require it), so when CreateOrderCert fails without a word from the CA,
// finalize polls the order URL it has and fetches the certificate itself.
func finalize(ctx context.Context, client *acme.Client, orderURL, finalizeURL string, csr []byte) ([][]byte, error) {
	ders, _, err := client.CreateOrderCert(ctx, finalizeURL, csr, true)
	if err == nil {
		return ders, nil
	}
	var (
		ae *acme.Error
		oe *acme.OrderError
	)
	if errors.As(err, &ae) || errors.As(err, &oe) || ctx.Err() != nil {
		return nil, caError("finalize", err)
	}
	o, werr := client.WaitOrder(ctx, orderURL)
	if werr != nil {
		return nil, caError("finalize", werr)
	}
	if o.Status != acme.StatusValid || o.CertURL == "" {
		// Still ready: the finalize request itself failed.
		return nil, fmt.Errorf("acme: finalize: %w", err)
	}
	ders, err = client.FetchCert(ctx, o.CertURL, true)
	if err != nil {
		return nil, caError("fetching the certificate", err)
	}
	return ders, nil
}

// authorize satisfies one authorization of an order with s's challenge.
func (i *Issuer) authorize(ctx context.Context, client *acme.Client, authzURL string, s Solver) (err error) {
	z, err := client.GetAuthorization(ctx, authzURL)
	if err != nil {
		return caError("authorization", err)
	}
	switch z.Status {
	case acme.StatusValid:
		return nil // validated recently, for another order
	case acme.StatusPending:
	default:
		return fmt.Errorf("acme: authorization for %s is %s", z.Identifier.Value, z.Status)
	}
	var chal *acme.Challenge
	var offered []string
	for _, c := range z.Challenges {
		offered = append(offered, c.Type)
		if c.Type == s.Type() {
			chal = c
		}
	}
	if chal == nil {
		return fmt.Errorf("acme: the CA offers no %s challenge for %s (it offers %s)", s.Type(), z.Identifier.Value, strings.Join(offered, ", "))
	}
	// The key authorization (RFC 8555 §8.1), which HTTP-01 serves as it
	// is and DNS-01 publishes hashed (DNS01Value).
	keyAuth, err := client.HTTP01ChallengeResponse(chal.Token)
	if err != nil {
		return fmt.Errorf("acme: key authorization: %w", err)
	}
	host := z.Identifier.Value
	accepted := false
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), i.opts.CleanUpTimeout)
		defer cancel()
		if cerr := s.CleanUp(cctx, host, chal.Token, keyAuth); cerr != nil {
			// The certificate does not depend on it: say so, go on.
			i.log.Warn("cleaning up an ACME challenge failed", "host", host, "challenge", s.Type(), "err", cerr)
		}
		if err != nil && !accepted {
			// Leave no pending authorization behind (the CA limits them).
			_ = client.RevokeAuthorization(cctx, authzURL)
		}
	}()
	if err := s.Present(ctx, host, chal.Token, keyAuth); err != nil {
		return fmt.Errorf("acme: presenting the %s challenge for %s: %w", s.Type(), host, err)
	}
	if _, err := client.Accept(ctx, chal); err != nil {
		return caError("accepting the challenge", err)
	}
	accepted = true
	if _, err := client.WaitAuthorization(ctx, authzURL); err != nil {
		return caError(s.Type()+" validation of "+host, err)
	}
	return nil
}

// checkHost refuses what no CA issues for, before asking one.
func checkHost(host string) error {
	if host == "" || len(host) > 253 || strings.HasSuffix(host, ".") || strings.ToLower(host) != host {
		return fmt.Errorf("acme: %q is not a lowercase DNS name", host)
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("acme: %q is not a DNS name", host)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '*' && label == "*") {
				return fmt.Errorf("acme: %q is not a DNS name", host)
			}
		}
	}
	return nil
}
