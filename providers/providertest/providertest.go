// Package providertest makes certificates for the tests of the packages
// that obtain, share and serve them.
package providertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/keel-dev/keel/providers"
)

// SelfSigned makes a bundle for host valid from notBefore to notAfter,
// signed by itself, with a random serial: a stand-in for a certificate a
// node serves, or one a compromised node would publish.
func SelfSigned(t testing.TB, host string, notBefore, notAfter time.Time) *providers.Bundle {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "self-signed " + host},
		DNSNames: []string{host}, NotBefore: notBefore, NotAfter: notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := providers.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := providers.ParseBundle(host, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
