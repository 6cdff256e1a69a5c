// Package certshare seals a certificate bundle to the ingress nodes'
// report keys with age (its SSH recipient types), so that the Ingress
// owner can publish it in the cluster repository and every ingress node
// can serve it, and opens it again with a node's own key. It also holds
// the public metadata published next to the ciphertext (cert.yaml),
// including the HTTP-01 key authorizations every ingress node answers.
//
// It does no I/O besides reading a key file; sync publishes and reads the
// refs. The private key of a certificate is never in cert.yaml, an error
// or a log line: only inside the age payload.
package certshare

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"filippo.io/age"
	"filippo.io/age/agessh"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/render"
)

// Recipient is a node a certificate is sealed to, and its reportKey (an
// authorized_keys line).
type Recipient struct {
	Node string
	Key  string
}

// Recipients returns the recipients of the shared certificates of the
// inventory m: its ingress nodes (m.IngressNodes) whose reportKey age can
// encrypt to (ssh-ed25519 or ssh-rsa: render.Node.CanReceiveCertificates),
// sorted by node. leftOut says, one line per node, which ingress nodes
// cannot receive shared certificates and why (no reportKey, an ECDSA one);
// such a node issues its own.
func Recipients(m *render.Model) (rs []Recipient, leftOut []string) {
	ingress := m.IngressNodes()
	slices.SortFunc(ingress, func(a, b render.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range ingress {
		if n.ReportKey == "" {
			leftOut = append(leftOut, fmt.Sprintf("node %s has no reportKey: it cannot receive shared certificates and issues its own", n.Name))
			continue
		}
		if _, _, err := recipientKey(n.ReportKey); err != nil {
			leftOut = append(leftOut, fmt.Sprintf("node %s: %v: it cannot receive shared certificates and issues its own", n.Name, err))
			continue
		}
		rs = append(rs, Recipient{Node: n.Name, Key: n.ReportKey})
	}
	return rs, leftOut
}

// recipientKey parses an authorized_keys line as an age recipient.
func recipientKey(line string) (age.Recipient, ssh.PublicKey, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, nil, fmt.Errorf("reportKey does not parse: %w", err)
	}
	var r age.Recipient
	switch pub.Type() {
	case ssh.KeyAlgoED25519:
		r, err = agessh.NewEd25519Recipient(pub)
	case ssh.KeyAlgoRSA:
		r, err = agessh.NewRSARecipient(pub)
	default:
		return nil, nil, fmt.Errorf("reportKey is %s, which age cannot encrypt to (use ssh-ed25519 or ssh-rsa)", pub.Type())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reportKey: %w", err)
	}
	return r, pub, nil
}

// Sealed is a shared certificate as published: its metadata (cert.yaml)
// and the age ciphertext of its chain and key (bundle.age; nil when
// Meta.Certificate is nil).
type Sealed struct {
	Meta   Meta
	Bundle []byte
}

// Seal encrypts b's chain and key to recipients, as published by node by
// at now. The result carries no HTTP-01 challenges (see Republish).
func Seal(b *providers.Bundle, by string, recipients []Recipient, now time.Time) (Sealed, error) {
	if b == nil {
		return Sealed{}, errors.New("seal: no bundle")
	}
	if len(recipients) == 0 {
		return Sealed{}, fmt.Errorf("seal the certificate of %s: no recipients (no ingress node has a reportKey age can encrypt to)", b.Host)
	}
	if len(recipients) > MaxRecipients {
		return Sealed{}, fmt.Errorf("seal the certificate of %s: %d recipients, more than %d", b.Host, len(recipients), MaxRecipients)
	}
	// The bundle is checked again, so that what is sealed is what Open
	// will accept: the key is the leaf's, and the leaf names the host.
	checked, err := providers.ParseBundle(b.Host, b.ChainPEM, b.KeyPEM)
	if err != nil {
		return Sealed{}, fmt.Errorf("seal: %w", err)
	}
	ars := make([]age.Recipient, 0, len(recipients))
	metas := make([]RecipientMeta, 0, len(recipients))
	for _, r := range recipients {
		ar, pub, err := recipientKey(r.Key)
		if err != nil {
			return Sealed{}, fmt.Errorf("seal the certificate of %s for node %s: %w", b.Host, r.Node, err)
		}
		ars = append(ars, ar)
		metas = append(metas, RecipientMeta{Node: r.Node, Key: ssh.FingerprintSHA256(pub)})
	}
	var out bytes.Buffer
	w, err := age.Encrypt(&out, ars...)
	if err != nil {
		return Sealed{}, fmt.Errorf("seal the certificate of %s: %w", b.Host, err)
	}
	plain := plaintext(checked)
	_, err = w.Write(plain)
	clear(plain)
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		return Sealed{}, fmt.Errorf("seal the certificate of %s: %w", b.Host, err)
	}
	sum := sha256.Sum256(out.Bytes())
	s := Sealed{
		Meta: Meta{
			APIVersion: render.APIVersion, Kind: Kind, Host: b.Host, PublishedBy: by, Published: now,
			Certificate: &CertMeta{
				Serial: checked.Serial, NotBefore: checked.NotBefore, NotAfter: checked.NotAfter, Issuer: checked.Issuer,
				IssuedBy: by, BundleSHA256: hex.EncodeToString(sum[:]), Recipients: metas,
			},
		},
		Bundle: out.Bytes(),
	}
	if err := s.Check(); err != nil {
		return Sealed{}, err
	}
	s.Meta.normalize()
	return s, nil
}

// ForChallenges returns the sealed form of a host that has no certificate
// yet (an Ingress's first issuance): metadata with challenges alone.
func ForChallenges(host, by string, challenges map[string]string, now time.Time) (Sealed, error) {
	s := Sealed{Meta: Meta{APIVersion: render.APIVersion, Kind: Kind, Host: host}}
	return s.Republish(by, challenges, now)
}

// Republish returns s, the same certificate if any, with challenges as
// the HTTP-01 key authorizations to answer, as published by node by at
// now: the owner publishes a new challenge this way (with or without a
// certificate), and a new owner after a failover publishes the
// certificate the old one sealed under its own name and signature.
func (s Sealed) Republish(by string, challenges map[string]string, now time.Time) (Sealed, error) {
	out := Sealed{Meta: s.Meta, Bundle: s.Bundle}
	out.Meta.PublishedBy, out.Meta.Published = by, now
	out.Meta.Challenges = nil
	if len(challenges) > 0 {
		out.Meta.Challenges = make(map[string]string, len(challenges))
		for k, v := range challenges {
			out.Meta.Challenges[k] = v
		}
	}
	if err := out.Check(); err != nil {
		return Sealed{}, err
	}
	out.Meta.normalize()
	return out, nil
}

// Check verifies that s is complete: its metadata is valid, and the
// bundle is there, bounded and the one the metadata's hash names, exactly
// when the metadata holds a certificate. sync checks it before publishing
// and after reading.
func (s Sealed) Check() error {
	if err := s.Meta.Validate(); err != nil {
		return err
	}
	c := s.Meta.Certificate
	switch {
	case c == nil && s.Bundle != nil:
		return fmt.Errorf("%s: %s is there but %s holds no certificate", s.Meta.Host, BundleFile, MetaFile)
	case c == nil:
		return nil
	case s.Bundle == nil:
		return fmt.Errorf("%s: %s holds a certificate but %s is missing", s.Meta.Host, MetaFile, BundleFile)
	case len(s.Bundle) > MaxSealedSize:
		return fmt.Errorf("%s: %s is %d bytes, more than the %d allowed", s.Meta.Host, BundleFile, len(s.Bundle), MaxSealedSize)
	}
	sum := sha256.Sum256(s.Bundle)
	if hex.EncodeToString(sum[:]) != c.BundleSHA256 {
		return fmt.Errorf("%s: %s does not match the bundleSHA256 of %s", s.Meta.Host, BundleFile, MetaFile)
	}
	return nil
}

// NeedsReseal reports whether the certificate of meta must be sealed
// again for recipients: a node joined or left the set, or a node's key
// changed (its fingerprint differs). Metadata without a certificate needs
// no resealing. The owner opens the bundle with its own key and calls Seal
// with the new set; a removed node's copy of the old key stays usable
// until the certificate is renewed (docs/security.md).
func NeedsReseal(meta Meta, recipients []Recipient) bool {
	c := meta.Certificate
	if c == nil {
		return false
	}
	want := make(map[string]string, len(recipients))
	for _, r := range recipients {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(r.Key))
		if err != nil {
			return true
		}
		want[r.Node] = ssh.FingerprintSHA256(pub)
	}
	if len(want) != len(c.Recipients) {
		return true
	}
	for _, r := range c.Recipients {
		if fp, ok := want[r.Node]; !ok || fp != r.Key {
			return true
		}
	}
	return false
}

// Identity is a node's key, able to open what was sealed to its reportKey.
type Identity struct {
	id          age.Identity
	fingerprint string
}

// LoadIdentity reads the node's private key (the OpenSSH file given to
// keel agent --report-key, not encrypted).
func LoadIdentity(file string) (*Identity, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	defer clear(data)
	id, err := ParseIdentity(data)
	if err != nil {
		return nil, fmt.Errorf("report key %s: %w", file, err)
	}
	return id, nil
}

// ParseIdentity reads a private key (OpenSSH or PEM, not encrypted). Only
// ed25519 and RSA keys can open a sealed certificate.
func ParseIdentity(pemBytes []byte) (*Identity, error) {
	key, err := ssh.ParseRawPrivateKey(pemBytes)
	if err != nil {
		return nil, err
	}
	var id age.Identity
	switch k := key.(type) {
	case *ed25519.PrivateKey:
		id, err = agessh.NewEd25519Identity(*k)
	case ed25519.PrivateKey:
		id, err = agessh.NewEd25519Identity(k)
	case *rsa.PrivateKey:
		id, err = agessh.NewRSAIdentity(k)
	case *ecdsa.PrivateKey:
		return nil, errors.New("an ECDSA key cannot open shared certificates (age supports ssh-ed25519 and ssh-rsa)")
	default:
		return nil, fmt.Errorf("a %T cannot open shared certificates (age supports ssh-ed25519 and ssh-rsa)", key)
	}
	if err != nil {
		return nil, err
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		return nil, err
	}
	return &Identity{id: id, fingerprint: ssh.FingerprintSHA256(signer.PublicKey())}, nil
}

// String names the identity by its public key's fingerprint: printing
// an Identity (%v, %+v, %#v, a log attribute) never shows the private key
// it holds.
func (i Identity) String() string { return "certshare identity " + i.fingerprint }

// GoString is String, for %#v.
func (i Identity) GoString() string { return i.String() }

// Fingerprint is the SHA-256 fingerprint of the identity's public key, as
// cert.yaml lists recipients.
func (i *Identity) Fingerprint() string { return i.fingerprint }

// ErrNotRecipient is returned by Open when the certificate was not sealed
// to the identity's key.
var ErrNotRecipient = errors.New("not sealed to this node's key")

// Open decrypts s with id and checks the result: the bundle must match
// the metadata's hash, be a certificate for the metadata's host whose key
// is its own, and have the serial and dates the metadata says. Errors never
// hold key material.
func Open(s Sealed, id *Identity) (*providers.Bundle, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	c := s.Meta.Certificate
	if c == nil {
		return nil, fmt.Errorf("%s: no certificate is shared yet", s.Meta.Host)
	}
	if !slices.ContainsFunc(c.Recipients, func(r RecipientMeta) bool { return r.Key == id.fingerprint }) {
		return nil, fmt.Errorf("%s: %w (%s); sealed to %s", s.Meta.Host, ErrNotRecipient, id.fingerprint, recipientNames(c.Recipients))
	}
	r, err := age.Decrypt(bytes.NewReader(s.Bundle), id.id)
	if err != nil {
		return nil, fmt.Errorf("%s: open %s: %w", s.Meta.Host, BundleFile, err)
	}
	plain, err := io.ReadAll(io.LimitReader(r, providers.MaxBundleSize+1))
	defer clear(plain)
	if err != nil {
		return nil, fmt.Errorf("%s: open %s: %w", s.Meta.Host, BundleFile, err)
	}
	if len(plain) > providers.MaxBundleSize {
		return nil, fmt.Errorf("%s: %s holds more than %d bytes", s.Meta.Host, BundleFile, providers.MaxBundleSize)
	}
	chain, key, err := splitPEM(plain)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", s.Meta.Host, BundleFile, err)
	}
	b, err := providers.ParseBundle(s.Meta.Host, chain, key)
	clear(key)
	if err != nil {
		return nil, err
	}
	if b.Serial != c.Serial || !b.NotBefore.Equal(c.NotBefore) || !b.NotAfter.Equal(c.NotAfter) || b.Issuer != c.Issuer {
		return nil, fmt.Errorf("%s: the certificate in %s (serial %s) is not the one %s describes (serial %s)", s.Meta.Host, BundleFile, b.Serial, MetaFile, c.Serial)
	}
	return b, nil
}

func recipientNames(rs []RecipientMeta) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Node
	}
	return strings.Join(names, ", ")
}

// plaintext is what bundle.age holds: the chain's PEM, then the key's. It
// is a PEM file, so that an operator can open it with the age tool and a
// node's key (age -d -i key bundle.age).
func plaintext(b *providers.Bundle) []byte {
	out := make([]byte, 0, len(b.ChainPEM)+len(b.KeyPEM)+1)
	out = append(out, b.ChainPEM...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, b.KeyPEM...)
}

// splitPEM separates the certificates of a bundle's plaintext from its one
// private key.
func splitPEM(data []byte) (chain, key []byte, err error) {
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch {
		case block.Type == "CERTIFICATE":
			chain = append(chain, pem.EncodeToMemory(block)...)
		case strings.HasSuffix(block.Type, "PRIVATE KEY"):
			if key != nil {
				return nil, nil, errors.New("more than one private key")
			}
			key = pem.EncodeToMemory(block)
		default:
			return nil, nil, fmt.Errorf("unexpected PEM block %.40q", block.Type)
		}
		clear(block.Bytes)
	}
	switch {
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, nil, errors.New("bytes that are not PEM after the last block")
	case chain == nil:
		return nil, nil, errors.New("no certificate")
	case key == nil:
		return nil, nil, errors.New("no private key")
	}
	return chain, key, nil
}
