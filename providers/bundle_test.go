package providers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"
)

func selfSigned(t *testing.T, host string, notBefore, notAfter time.Time) (chain, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(0xbeef), Subject: pkix.Name{CommonName: host}, Issuer: pkix.Name{CommonName: "test CA"},
		DNSNames: []string{host}, NotBefore: notBefore, NotAfter: notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	key, err = EncodeKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key
}

func TestParseBundle(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	chain, key := selfSigned(t, "www.example.com", nb, nb.Add(90*24*time.Hour))
	b, err := ParseBundle("www.example.com", chain, key)
	if err != nil {
		t.Fatal(err)
	}
	if b.Serial != "beef" || !b.NotAfter.Equal(nb.Add(90*24*time.Hour)) {
		t.Errorf("got serial %q not after %v", b.Serial, b.NotAfter)
	}
	if _, err := b.TLSCertificate(); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseBundle("other.example.com", chain, key); err == nil {
		t.Error("a certificate for another host was accepted")
	}
	_, otherKey := selfSigned(t, "www.example.com", nb, nb.Add(time.Hour))
	_, err = ParseBundle("www.example.com", chain, otherKey)
	if err == nil {
		t.Fatal("a key that is not the certificate's was accepted")
	}
	if strings.Contains(err.Error(), string(otherKey[30:60])) {
		t.Errorf("error shows the key: %v", err)
	}
	if _, err := ParseBundle("www.example.com", append(chain, make([]byte, MaxBundleSize)...), key); err == nil {
		t.Error("an oversized bundle was accepted")
	}
}

func TestRenewAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		life, want time.Duration
	}{
		{90 * 24 * time.Hour, 60 * 24 * time.Hour}, // 30 days before expiry
		{6 * 24 * time.Hour, 4 * 24 * time.Hour},   // short-lived: at two thirds
		{3 * time.Hour, 2 * time.Hour},
	} {
		if got := RenewAt(nb, nb.Add(c.life)); !got.Equal(nb.Add(c.want)) {
			t.Errorf("life %v: renew at %v, want %v", c.life, got.Sub(nb), c.want)
		}
	}
}

// A bundle printed by mistake never shows its key.
func TestBundlePrintsNoKey(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	chain, key := selfSigned(t, "www.example.com", nb, nb.Add(time.Hour))
	b, err := ParseBundle("www.example.com", chain, key)
	if err != nil {
		t.Fatal(err)
	}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "cert", b)
	inner := strings.Split(string(key), "\n")[1]
	for _, s := range []string{fmt.Sprintf("%v", b), fmt.Sprintf("%+v", b), fmt.Sprintf("%#v", b), fmt.Sprint(*b), logged.String()} {
		if strings.Contains(s, inner) || strings.Contains(s, "PRIVATE KEY") || strings.Contains(s, fmt.Sprint(key[:20])[1:40]) {
			t.Errorf("printed the key: %s", s)
		}
	}
}
