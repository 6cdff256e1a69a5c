package certshare_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"filippo.io/age/agessh"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/render"
)

var now = time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)

// nodeKey is a node's report key pair: the private key file's bytes
// (OpenSSH format, as keel agent --report-key reads) and the
// authorized_keys line of nodes/<name>.yaml.
type nodeKey struct {
	private []byte
	public  string
}

func newKey(t *testing.T, kind string) nodeKey {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch kind {
	case "ed25519":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	case "rsa":
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ecdsa":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return nodeKey{private: pem.EncodeToMemory(block), public: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))}
}

func identity(t *testing.T, k nodeKey) *certshare.Identity {
	t.Helper()
	id, err := certshare.ParseIdentity(k.private)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// bundle makes a certificate for host signed by a throwaway CA, with a
// fresh ECDSA P-256 key as ACME gives.
func bundle(t *testing.T, host string, serial int64) (*providers.Bundle, *ecdsa.PrivateKey) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour), KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})...)
	keyPEM, err := providers.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := providers.ParseBundle(host, chain, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return b, key
}

// secrets are the forms of a private key that must never show.
func secrets(t *testing.T, b *providers.Bundle, key *ecdsa.PrivateKey) [][]byte {
	t.Helper()
	block, _ := pem.Decode(b.KeyPEM)
	d, err := key.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{
		b.KeyPEM, block.Bytes, []byte(base64.StdEncoding.EncodeToString(block.Bytes)),
		[]byte(strings.Split(string(b.KeyPEM), "\n")[1]), d, []byte(hex.EncodeToString(d)),
	}
}

func TestSealOpenRoundTrip(t *testing.T) {
	n1, n2, n3 := newKey(t, "ed25519"), newKey(t, "rsa"), newKey(t, "ed25519")
	b, leafKey := bundle(t, "www.example.com", 0xbeef)
	s, err := certshare.Seal(b, "n1", []certshare.Recipient{{Node: "n2", Key: n2.public}, {Node: "n1", Key: n1.public}}, now)
	if err != nil {
		t.Fatal(err)
	}
	c := s.Meta.Certificate
	if s.Meta.Host != "www.example.com" || s.Meta.PublishedBy != "n1" || c.Serial != "beef" || c.IssuedBy != "n1" ||
		!c.NotAfter.Equal(b.NotAfter) || c.Issuer != "test CA" || len(c.Recipients) != 2 || c.Recipients[0].Node != "n1" {
		t.Fatalf("metadata %+v %+v", s.Meta, c)
	}
	for _, k := range []nodeKey{n1, n2} {
		got, err := certshare.Open(s, identity(t, k))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.ChainPEM, b.ChainPEM) || !bytes.Equal(got.KeyPEM, b.KeyPEM) || got.Serial != b.Serial {
			t.Errorf("opened bundle differs from the sealed one")
		}
		if _, err := got.TLSCertificate(); err != nil {
			t.Error(err)
		}
	}
	// The public metadata holds nothing of the key.
	meta, err := s.Meta.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range secrets(t, b, leafKey) {
		if bytes.Contains(meta, secret) || bytes.Contains(s.Bundle, secret) {
			t.Fatalf("the sealed form holds the key in the clear")
		}
	}

	// A node not among the recipients cannot open it, with or without
	// metadata that lists its key.
	_, err = certshare.Open(s, identity(t, n3))
	if !errors.Is(err, certshare.ErrNotRecipient) || !strings.Contains(err.Error(), "n1, n2") {
		t.Errorf("a node that is no recipient: %v", err)
	}
	forged := s
	fc := *c
	fc.Recipients = append(fc.Recipients, certshare.RecipientMeta{Node: "n3", Key: identity(t, n3).Fingerprint()})
	forged.Meta.Certificate = &fc
	var noMatch *age.NoIdentityMatchError
	if _, err := certshare.Open(forged, identity(t, n3)); !errors.As(err, &noMatch) {
		t.Errorf("a node listed but not sealed to: %v", err)
	}

	// Tampering: the ciphertext, or its hash and the ciphertext.
	tampered := s
	tampered.Bundle = bytes.Clone(s.Bundle)
	tampered.Bundle[len(tampered.Bundle)-5] ^= 1
	if _, err := certshare.Open(tampered, identity(t, n1)); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a tampered bundle.age: %v", err)
	}
	sum := sha256.Sum256(tampered.Bundle)
	tc := *c
	tc.BundleSHA256 = hex.EncodeToString(sum[:])
	tampered.Meta.Certificate = &tc
	if _, err := certshare.Open(tampered, identity(t, n1)); err == nil {
		t.Error("a tampered bundle.age with a matching hash opened")
	}
	// Metadata that describes another certificate than the sealed one.
	other := s
	oc := *c
	oc.Serial = "cafe"
	other.Meta.Certificate = &oc
	if _, err := certshare.Open(other, identity(t, n1)); err == nil || !strings.Contains(err.Error(), "not the one") {
		t.Errorf("metadata of another certificate: %v", err)
	}
	// Anyone can encrypt to the recipients: a payload that is not a
	// bundle for the host is refused, and its error shows no key.
	b2, key2 := bundle(t, "evil.example.com", 0xbeef)
	var buf bytes.Buffer
	r1, _ := agessh.ParseRecipient(n1.public)
	w, _ := age.Encrypt(&buf, r1)
	w.Write(append(bytes.Clone(b2.ChainPEM), b2.KeyPEM...))
	w.Close()
	evil := s
	sum = sha256.Sum256(buf.Bytes())
	ec := *c
	ec.BundleSHA256 = hex.EncodeToString(sum[:])
	evil.Meta.Certificate, evil.Bundle = &ec, buf.Bytes()
	_, err = certshare.Open(evil, identity(t, n1))
	if err == nil {
		t.Fatal("a certificate for another host opened")
	}
	for _, secret := range secrets(t, b2, key2) {
		if strings.Contains(err.Error(), string(secret)) {
			t.Fatalf("the error shows the key: %v", err)
		}
	}
}

func TestSealRefusesWhatCannotBeShared(t *testing.T) {
	b, _ := bundle(t, "www.example.com", 7)
	ec := newKey(t, "ecdsa")
	if _, err := certshare.Seal(b, "n1", nil, now); err == nil {
		t.Error("sealed to nobody")
	}
	if _, err := certshare.Seal(b, "n1", []certshare.Recipient{{Node: "n1", Key: ec.public}}, now); err == nil || !strings.Contains(err.Error(), "ecdsa") {
		t.Errorf("sealed to an ECDSA key: %v", err)
	}
	if _, err := certshare.ParseIdentity(ec.private); err == nil || !strings.Contains(err.Error(), "ECDSA") {
		t.Errorf("an ECDSA identity: %v", err)
	}
	ed := newKey(t, "ed25519")
	if _, err := certshare.Seal(b, "N1", []certshare.Recipient{{Node: "n1", Key: ed.public}}, now); err == nil {
		t.Error("sealed by an invalid node name")
	}
	bad := *b
	_, otherKey := bundle(t, "www.example.com", 8)
	bad.KeyPEM, _ = providers.EncodeKey(otherKey)
	if _, err := certshare.Seal(&bad, "n1", []certshare.Recipient{{Node: "n1", Key: ed.public}}, now); err == nil {
		t.Error("sealed a bundle whose key is not the certificate's")
	}
}

func TestLoadIdentity(t *testing.T) {
	k := newKey(t, "ed25519")
	file := filepath.Join(t.TempDir(), "report-key")
	if err := os.WriteFile(file, k.private, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := certshare.LoadIdentity(file)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(k.public))
	if id.Fingerprint() != ssh.FingerprintSHA256(pub) {
		t.Errorf("fingerprint %s", id.Fingerprint())
	}
	// Printed or logged, an identity shows its fingerprint, never its key.
	raw, err := ssh.ParseRawPrivateKey(k.private)
	if err != nil {
		t.Fatal(err)
	}
	seed := raw.(*ed25519.PrivateKey).Seed()
	scalar := sha512.Sum512(seed)
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "id", id, "value", *id)
	printed := fmt.Sprintf("%v %+v %#v %s %v", id, id, id, *id, []any{*id}) + logged.String()
	for _, secret := range [][]byte{seed, scalar[:32]} {
		if strings.Contains(printed, fmt.Sprint(secret)) || strings.Contains(printed, fmt.Sprintf("%x", secret)) || strings.Contains(printed, string(secret)) {
			t.Fatalf("a printed identity shows its key: %s", printed)
		}
	}
	if !strings.Contains(printed, id.Fingerprint()) {
		t.Errorf("a printed identity does not name its key: %s", printed)
	}
	if err := os.WriteFile(file, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := certshare.LoadIdentity(file); err == nil {
		t.Error("garbage loaded as a key")
	}
}

func TestRecipients(t *testing.T) {
	ed, rs, ec := newKey(t, "ed25519"), newKey(t, "rsa"), newKey(t, "ecdsa")
	ingress := map[string]string{"keel.dev/ingress": "true"}
	nodes := []render.Node{
		{Name: "n4", Labels: ingress},
		{Name: "n2", Labels: ingress, ReportKey: rs.public},
		{Name: "n1", Labels: ingress, ReportKey: ed.public},
		{Name: "n3", Labels: ingress, ReportKey: ec.public},
		{Name: "n5", ReportKey: ed.public}, // not an ingress node
		{Name: "n6", Labels: ingress, ReportKey: "ssh-ed25519 garbage"},
	}
	got, left := certshare.Recipients(&render.Model{Nodes: nodes})
	if len(got) != 2 || got[0].Node != "n1" || got[1].Node != "n2" || got[1].Key != rs.public {
		t.Errorf("recipients %v, want n1 and n2", got)
	}
	joined := strings.Join(left, "\n")
	if len(left) != 3 || !strings.Contains(left[0], "n3") || !strings.Contains(left[0], "ecdsa") ||
		!strings.Contains(left[1], "n4 has no reportKey") || !strings.Contains(left[2], "n6") || strings.Contains(joined, "n5") {
		t.Errorf("left out %q", left)
	}
	// The same verdict as keel validate's (render.Node.CanReceiveCertificates)
	// for every well-formed key.
	for _, n := range nodes[:4] {
		in := slices.ContainsFunc(got, func(r certshare.Recipient) bool { return r.Node == n.Name })
		if in != n.CanReceiveCertificates() {
			t.Errorf("node %s: recipient %v, CanReceiveCertificates %v", n.Name, in, n.CanReceiveCertificates())
		}
	}
	// No node labelled: every node is an ingress node.
	for i := range nodes {
		nodes[i].Labels = nil
	}
	if got, _ := certshare.Recipients(&render.Model{Nodes: nodes}); len(got) != 3 || got[2].Node != "n5" {
		t.Errorf("recipients without labels %v, want n1, n2 and n5", got)
	}
}

func TestNeedsReseal(t *testing.T) {
	n1, n2, n3 := newKey(t, "ed25519"), newKey(t, "ed25519"), newKey(t, "rsa")
	b, _ := bundle(t, "www.example.com", 9)
	set := []certshare.Recipient{{Node: "n1", Key: n1.public}, {Node: "n2", Key: n2.public}}
	s, err := certshare.Seal(b, "n1", set, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rs   []certshare.Recipient
		want bool
	}{
		{"same set, other order", []certshare.Recipient{set[1], set[0]}, false},
		{"a node joined", append(set[:2:2], certshare.Recipient{Node: "n3", Key: n3.public}), true},
		{"a node left", set[:1], true},
		{"a node's key changed", []certshare.Recipient{set[0], {Node: "n2", Key: n3.public}}, true},
		{"keys swapped between nodes", []certshare.Recipient{{Node: "n1", Key: n2.public}, {Node: "n2", Key: n1.public}}, true},
	} {
		if got := certshare.NeedsReseal(s.Meta, tc.rs); got != tc.want {
			t.Errorf("%s: NeedsReseal = %v", tc.name, got)
		}
	}
	ch, err := certshare.ForChallenges("www.example.com", "n1", nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if certshare.NeedsReseal(ch.Meta, set) {
		t.Error("metadata without a certificate needs resealing")
	}
}

func TestRepublishKeepsTheCertificate(t *testing.T) {
	n1, n2 := newKey(t, "ed25519"), newKey(t, "ed25519")
	b, _ := bundle(t, "www.example.com", 10)
	s, err := certshare.Seal(b, "n1", []certshare.Recipient{{Node: "n1", Key: n1.public}, {Node: "n2", Key: n2.public}}, now)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.Repeat("A", 43)
	ch := map[string]string{token: token + "." + strings.Repeat("b", 43)}
	r, err := s.Republish("n2", ch, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r.Meta.PublishedBy != "n2" || r.Meta.Certificate.IssuedBy != "n1" || r.Meta.Challenges[token] != ch[token] {
		t.Errorf("republished %+v", r.Meta)
	}
	ch[token] = "changed"
	if r.Meta.Challenges[token] == "changed" {
		t.Error("Republish keeps the caller's map")
	}
	if got, err := certshare.Open(r, identity(t, n2)); err != nil || got.Serial != b.Serial {
		t.Errorf("open the republished certificate: %v", err)
	}
	if _, err := s.Republish("n2", map[string]string{"bad token!": "x"}, now); err == nil {
		t.Error("a bad challenge was accepted")
	}
}
