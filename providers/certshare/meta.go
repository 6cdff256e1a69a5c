package certshare

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/render"
)

// The files of a shared certificate's commit.
const (
	// MetaFile is the public metadata (Meta, as YAML).
	MetaFile = "cert.yaml"
	// BundleFile is the age ciphertext of the chain and key; absent when
	// the metadata holds no certificate.
	BundleFile = "bundle.age"
)

// Kind is the kind of a cert.yaml.
const Kind = "SharedCertificate"

// Bounds on what is read. A cert.yaml or bundle.age larger than these is
// refused unread (from the git object's header).
const (
	// MaxRecipients bounds the nodes one certificate is sealed to.
	MaxRecipients = 1024
	// MaxChallenges bounds the HTTP-01 key authorizations of one host
	// (one order at a time has a few authorizations at most).
	MaxChallenges = 16
	// MaxMetaSize bounds cert.yaml: a recipient line is under 100 bytes.
	MaxMetaSize = 256 << 10
	// MaxSealedSize bounds bundle.age: the bundle, age's per-chunk tags,
	// and one header stanza per recipient (an RSA-8192 one is about 1.4 KB).
	MaxSealedSize = providers.MaxBundleSize + MaxRecipients*1536 + 4<<10
)

// Meta is the public part of a shared certificate (cert.yaml): what any
// reader of the repository may know. The private key is only ever in
// bundle.age, encrypted.
type Meta struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Host       string `yaml:"host"`
	// PublishedBy is the node that published this cert.yaml: its
	// reportKey signs it (cert.yaml.sig). After a failover the new owner
	// publishes the certificate the old one issued, with its own
	// challenges: the node that vouches for the content is the publisher.
	PublishedBy string    `yaml:"publishedBy"`
	Published   time.Time `yaml:"published"`
	// Certificate is nil until a first certificate is issued (a
	// cert.yaml may carry challenges alone).
	Certificate *CertMeta `yaml:"certificate,omitempty"`
	// Challenges maps an HTTP-01 token to the key authorization every
	// ingress node answers with at /.well-known/acme-challenge/<token>.
	Challenges map[string]string `yaml:"challenges,omitempty"`
}

// CertMeta describes the sealed certificate.
type CertMeta struct {
	Serial    string    `yaml:"serial"` // the leaf's serial, lowercase hex
	NotBefore time.Time `yaml:"notBefore"`
	NotAfter  time.Time `yaml:"notAfter"`
	Issuer    string    `yaml:"issuer"` // the leaf's issuer common name
	// IssuedBy is the node that sealed the bundle (informational: the
	// publisher's signature is what is checked).
	IssuedBy string `yaml:"issuedBy"`
	// BundleSHA256 is the SHA-256 of bundle.age, in hex: the signature
	// over cert.yaml covers the ciphertext through it.
	BundleSHA256 string `yaml:"bundleSHA256"`
	// Recipients are the nodes whose reportKey can open bundle.age,
	// sorted by node.
	Recipients []RecipientMeta `yaml:"recipients"`
}

// RecipientMeta names a node the bundle is sealed to, and the SHA-256
// fingerprint (ssh.FingerprintSHA256) of its key at the time.
type RecipientMeta struct {
	Node string `yaml:"node"`
	Key  string `yaml:"key"`
}

var (
	serialRe      = regexp.MustCompile(`^[0-9a-f]{1,64}$`)
	sha256Re      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	fingerprintRe = regexp.MustCompile(`^SHA256:[A-Za-z0-9+/]{43}$`)
	// An ACME token is base64url (RFC 8555 §8.1, §8.3); a key
	// authorization is the token, a dot and the base64url SHA-256 JWK
	// thumbprint of the account key (RFC 7638).
	tokenRe      = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	thumbprintRe = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
)

// CheckHost returns an error when host cannot name a shared certificate:
// it must be an Ingress host (render.CheckHost: lowercase DNS labels,
// nothing that could climb out of refs/keel/certs/), and not end in
// ".lock", which git refuses as the last part of a ref name.
func CheckHost(host string) error {
	if err := render.CheckHost(host); err != nil {
		return err
	}
	if strings.HasSuffix(host, ".lock") {
		return fmt.Errorf("%q ends in .lock, which git refuses in a ref name", host)
	}
	return nil
}

// ParseMeta reads a cert.yaml strictly: unknown fields, a second
// document, or any value out of bounds is an error that names the field.
func ParseMeta(data []byte) (Meta, error) {
	if len(data) > MaxMetaSize {
		return Meta{}, fmt.Errorf("%s is %d bytes, more than the %d allowed", MetaFile, len(data), MaxMetaSize)
	}
	var m Meta
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return Meta{}, fmt.Errorf("%s does not parse: %w", MetaFile, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Meta{}, fmt.Errorf("%s holds more than one document", MetaFile)
	}
	if err := m.Validate(); err != nil {
		return Meta{}, err
	}
	m.normalize()
	return m, nil
}

// Marshal returns m as cert.yaml, after checking it as ParseMeta would.
// The output is the same for the same Meta (map keys and recipients
// sorted).
func (m Meta) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	m.normalize()
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// normalize puts times in UTC and recipients in order, so that a parsed
// Meta and a marshalled one compare equal.
func (m *Meta) normalize() {
	m.Published = m.Published.UTC()
	if c := m.Certificate; c != nil {
		cc := *c
		cc.NotBefore, cc.NotAfter = c.NotBefore.UTC(), c.NotAfter.UTC()
		cc.Recipients = slices.Clone(c.Recipients)
		slices.SortFunc(cc.Recipients, func(a, b RecipientMeta) int { return strings.Compare(a.Node, b.Node) })
		m.Certificate = &cc
	}
	if len(m.Challenges) == 0 {
		m.Challenges = nil
	}
}

// Validate checks every field of m; the error names the first wrong one,
// and never holds more than a short prefix of a value.
func (m Meta) Validate() error {
	if m.APIVersion != render.APIVersion || m.Kind != Kind {
		return fmt.Errorf("%s: not a shared certificate (want apiVersion %s, kind %s)", MetaFile, render.APIVersion, Kind)
	}
	if err := CheckHost(m.Host); err != nil {
		return fmt.Errorf("%s: host: %w", MetaFile, err)
	}
	if err := render.CheckName(m.PublishedBy); err != nil {
		return fmt.Errorf("%s: publishedBy: %w", MetaFile, err)
	}
	if m.Published.IsZero() {
		return fmt.Errorf("%s: published: missing", MetaFile)
	}
	if c := m.Certificate; c != nil {
		if err := c.validate(); err != nil {
			return fmt.Errorf("%s: certificate.%w", MetaFile, err)
		}
	}
	if len(m.Challenges) > MaxChallenges {
		return fmt.Errorf("%s: challenges: %d, more than the %d allowed", MetaFile, len(m.Challenges), MaxChallenges)
	}
	for _, token := range slices.Sorted(maps.Keys(m.Challenges)) {
		if err := CheckChallenge(token, m.Challenges[token]); err != nil {
			return fmt.Errorf("%s: challenges: %w", MetaFile, err)
		}
	}
	return nil
}

func (c *CertMeta) validate() error {
	switch {
	case !serialRe.MatchString(c.Serial):
		return fmt.Errorf("serial: %.80q is not lowercase hex of at most 64 digits", c.Serial)
	case c.NotBefore.IsZero() || c.NotAfter.IsZero():
		return errors.New("notBefore, notAfter: both are required")
	case !c.NotAfter.After(c.NotBefore):
		return errors.New("notAfter: not after notBefore")
	case len(c.Issuer) > 256 || strings.IndexFunc(c.Issuer, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("issuer: %.80q is not a printable name of at most 256 bytes", c.Issuer)
	case !sha256Re.MatchString(c.BundleSHA256):
		return fmt.Errorf("bundleSHA256: %.80q is not a lowercase hex SHA-256", c.BundleSHA256)
	case len(c.Recipients) == 0:
		return errors.New("recipients: none")
	case len(c.Recipients) > MaxRecipients:
		return fmt.Errorf("recipients: %d, more than the %d allowed", len(c.Recipients), MaxRecipients)
	}
	if err := render.CheckName(c.IssuedBy); err != nil {
		return fmt.Errorf("issuedBy: %w", err)
	}
	seen := make(map[string]bool, len(c.Recipients))
	for i, r := range c.Recipients {
		if err := render.CheckName(r.Node); err != nil {
			return fmt.Errorf("recipients[%d].node: %w", i, err)
		}
		if seen[r.Node] {
			return fmt.Errorf("recipients[%d].node: %q is listed twice", i, r.Node)
		}
		seen[r.Node] = true
		if !fingerprintRe.MatchString(r.Key) {
			return fmt.Errorf("recipients[%d].key: %.80q is not an SSH key fingerprint (SHA256:...)", i, r.Key)
		}
	}
	return nil
}

// CheckChallenge returns an error when token or keyAuth is not an ACME
// HTTP-01 token and its key authorization: they are served verbatim to
// anyone who asks, at a path made of the token.
func CheckChallenge(token, keyAuth string) error {
	if !tokenRe.MatchString(token) {
		return fmt.Errorf("token %.80q is not base64url of 16 to 128 characters", token)
	}
	thumb, ok := strings.CutPrefix(keyAuth, token+".")
	if !ok || !thumbprintRe.MatchString(thumb) {
		return fmt.Errorf("key authorization of token %s: %.80q is not <token>.<base64url SHA-256 thumbprint>", token, keyAuth)
	}
	return nil
}
