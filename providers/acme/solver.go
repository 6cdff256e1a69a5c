package acme

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// The challenge types a Solver may answer.
const (
	ChallengeDNS01  = "dns-01"
	ChallengeHTTP01 = "http-01"
)

// Solver answers one type of ACME challenge. The Issuer calls Present,
// then tells the CA to validate, then CleanUp: always, once Present was
// called, even when Present, the validation or the order failed, with a
// context of its own when the order's is done. Present returns when the
// CA can see the answer (a DNS-01 solver waits for the record to reach
// the zone's servers; an HTTP-01 one for every ingress node to serve it).
// A Solver may be called for several hosts at once.
type Solver interface {
	// Type is ChallengeDNS01 or ChallengeHTTP01.
	Type() string
	// Present publishes the answer to the challenge token of host:
	// keyAuth at http://<host>/.well-known/acme-challenge/<token> for
	// HTTP-01, or DNS01Value(keyAuth) in a TXT record at DNS01Name(host)
	// for DNS-01.
	Present(ctx context.Context, host, token, keyAuth string) error
	// CleanUp removes what Present published.
	CleanUp(ctx context.Context, host, token, keyAuth string) error
}

// DNSProvider publishes and removes DNS-01 TXT records. It receives the
// key authorization, as lego's providers do, and publishes
// DNS01Value(keyAuth) at DNS01Name(domain).
type DNSProvider interface {
	Present(ctx context.Context, domain, keyAuth string) error
	CleanUp(ctx context.Context, domain, keyAuth string) error
}

// DNS01 returns the Solver that answers DNS-01 challenges with p.
func DNS01(p DNSProvider) Solver { return dns01{p} }

type dns01 struct{ p DNSProvider }

func (dns01) Type() string { return ChallengeDNS01 }

func (d dns01) Present(ctx context.Context, host, _, keyAuth string) error {
	return d.p.Present(ctx, host, keyAuth)
}

func (d dns01) CleanUp(ctx context.Context, host, _, keyAuth string) error {
	return d.p.CleanUp(ctx, host, keyAuth)
}

// DNS01Name is the name of the TXT record that answers a DNS-01
// challenge for host, without a trailing dot (a wildcard's is its base
// domain's).
func DNS01Name(host string) string {
	return "_acme-challenge." + strings.TrimPrefix(host, "*.")
}

// DNS01Value is the TXT record's value for a key authorization: its
// SHA-256, base64url without padding (RFC 8555 §8.4).
func DNS01Value(keyAuth string) string {
	sum := sha256.Sum256([]byte(keyAuth))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// HTTP01Path is the path at which an HTTP-01 answer is served.
func HTTP01Path(token string) string {
	return "/.well-known/acme-challenge/" + token
}
