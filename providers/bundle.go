package providers

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// MaxBundleSize bounds a bundle's PEM (chain and key together): a chain of
// a few certificates is a few kilobytes.
const MaxBundleSize = 64 << 10

// Bundle is an issued certificate chain with its private key. ChainPEM
// holds the leaf first, then the intermediates; KeyPEM the leaf's private
// key (PKCS #8). The other fields are read from the leaf by ParseBundle.
type Bundle struct {
	Host     string
	ChainPEM []byte
	KeyPEM   []byte

	NotBefore time.Time
	NotAfter  time.Time
	Serial    string // the leaf's serial number, lowercase hex
	Issuer    string // the leaf's issuer common name
}

// ParseBundle checks that chainPEM and keyPEM make a certificate for host:
// the leaf names host, the key is the leaf's, and the sizes are bounded. It
// does not check the chain against roots (the CA did that, and tests use
// their own roots); TLS clients do.
func ParseBundle(host string, chainPEM, keyPEM []byte) (*Bundle, error) {
	if len(chainPEM)+len(keyPEM) > MaxBundleSize {
		return nil, fmt.Errorf("certificate bundle for %s: %d bytes, more than the %d allowed", host, len(chainPEM)+len(keyPEM), MaxBundleSize)
	}
	pair, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		// X509KeyPair's errors name what is wrong, never the key itself.
		return nil, fmt.Errorf("certificate bundle for %s: %w", host, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate bundle for %s: %w", host, err)
		}
	}
	if err := leaf.VerifyHostname(host); err != nil {
		return nil, fmt.Errorf("certificate bundle for %s: %w", host, err)
	}
	return &Bundle{
		Host: host, ChainPEM: bytes.Clone(chainPEM), KeyPEM: bytes.Clone(keyPEM),
		NotBefore: leaf.NotBefore.UTC(), NotAfter: leaf.NotAfter.UTC(),
		Serial: Serial(leaf), Issuer: leaf.Issuer.CommonName,
	}, nil
}

// Serial is how Keel writes a certificate's serial number everywhere
// (reports, logs, keel status): lower-case hex of its bytes, leading zero
// kept, as openssl x509 -serial prints it but in lower case.
func Serial(c *x509.Certificate) string {
	return hex.EncodeToString(c.SerialNumber.Bytes())
}

// TLSCertificate returns the bundle as a tls.Certificate with its Leaf
// parsed.
func (b *Bundle) TLSCertificate() (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(b.ChainPEM, b.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", b.Host, err)
	}
	return &pair, nil
}

// RenewBefore is how long before expiry a certificate is renewed: 30 days,
// or a third of its lifetime when that is shorter (a short-lived
// certificate is renewed at two thirds of its life).
const RenewBefore = 30 * 24 * time.Hour

// RenewAt returns when the bundle is due for renewal.
func (b *Bundle) RenewAt() time.Time {
	return RenewAt(b.NotBefore, b.NotAfter)
}

// RenewAt returns when a certificate valid from notBefore to notAfter is
// due for renewal: RenewBefore before notAfter, or at two thirds of its
// lifetime if that comes later.
func RenewAt(notBefore, notAfter time.Time) time.Time {
	life := notAfter.Sub(notBefore)
	return notAfter.Add(-min(RenewBefore, life/3))
}

// EncodeKey returns key as a PKCS #8 PEM block.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	switch key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
	default:
		return nil, errors.New("unsupported private key type")
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// String names the certificate, never its key: a bundle printed by
// mistake (%v, a log line) shows host, serial and expiry only.
func (b Bundle) String() string {
	return fmt.Sprintf("certificate for %s (serial %s, issuer %q, expires %s)", b.Host, b.Serial, b.Issuer, b.NotAfter.Format(time.RFC3339))
}

// GoString is String, for %#v.
func (b Bundle) GoString() string { return b.String() }

// LogValue is String, for slog.
func (b Bundle) LogValue() slog.Value { return slog.StringValue(b.String()) }
