package dns01

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/keel-dev/keel/providers/acme"
)

// Provider puts and removes the _acme-challenge TXT record of an ACME
// DNS-01 challenge. Its methods are safe for concurrent use, for different
// challenges (the same name may have two: a wildcard and its base domain).
type Provider interface {
	// Present creates the TXT record for domain's challenge (keyAuth as
	// given by ACME; the record value is base64url(sha256(keyAuth)), i.e.
	// acme.Client.DNS01ChallengeRecord) and returns once the record is
	// visible at every authoritative server of the zone (bounded by ctx
	// and the propagation timeout), so the CA may be told. An error
	// wrapping ErrNotVisible means the record was written but did not
	// show in time. The caller calls CleanUp whatever Present returned.
	Present(ctx context.Context, domain, keyAuth string) error
	// CleanUp removes the record Present created for the same domain and
	// keyAuth; other TXT records at the name stay.
	CleanUp(ctx context.Context, domain, keyAuth string) error
}

// backend is what each provider does through its API: write or delete
// the record. The propagation check is common to all (provider.Present).
type backend interface {
	present(ctx context.Context, ch *challenge) error
	cleanup(ctx context.Context, ch *challenge) error
}

// challenge is one DNS-01 challenge.
type challenge struct {
	domain  string // as the authorization names it, without "*." or final dot
	fqdn    string // where the record goes: _acme-challenge.<domain>. after CNAMEs
	value   string // base64url(sha256(keyAuth))
	keyAuth string
}

// RecordValue returns the TXT value of a DNS-01 challenge:
// base64url(sha256(keyAuth)), without padding (RFC 8555 §8.4).
func RecordValue(keyAuth string) string { return acme.DNS01Value(keyAuth) }

// Load reads the node-local configuration file at path, which names the
// provider and holds its credentials (docs/ingress.md, "DNS providers"),
// and returns the provider. The file must be a regular file of at most
// MaxConfigSize bytes that neither group nor others may read or write
// (mode 0600 or stricter); anything else is refused. Errors about the
// file and its content are *ConfigError values (joined when there are
// several) with the file, line and column where there is one; a file that
// cannot be opened gives the *fs.PathError. No error holds a credential.
//
// Loading an ovh or cloudflare provider points lego's process-wide DNS
// client at the file's resolvers (see useResolvers): load one DNS
// provider per process.
func Load(path string) (Provider, error) {
	data, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	c, err := parseConfig(path, data)
	if err != nil {
		return nil, err
	}
	return newProvider(c)
}

func newProvider(c *config) (Provider, error) {
	if len(c.Resolvers) == 0 {
		servers, err := systemResolvers(defaultResolvConf)
		if err != nil {
			return nil, &ConfigError{File: c.file, Field: "resolvers", Msg: fmt.Sprintf("none written, and none found in the system's: %v", err)}
		}
		c.Resolvers = servers
	}
	p := &provider{
		name:     c.Provider,
		res:      &resolver{servers: c.Resolvers, nsPort: portString(c.NameserverPort)},
		timeout:  c.PropagationTimeout,
		interval: c.PropagationInterval,
		secrets:  c.secrets(),
	}
	var err error
	switch c.Provider {
	case ProviderOVH:
		p.backend, err = newOVH(c)
	case ProviderCloudflare:
		p.backend, err = newCloudflare(c)
	case ProviderRFC2136:
		p.backend = newRFC2136(c, p.res)
	case ProviderExec:
		p.backend = newExecHook(c)
	default:
		err = fmt.Errorf("unknown provider %q", c.Provider) // parseConfig refuses it first
	}
	if err != nil {
		return nil, p.wrap("load "+c.file, err)
	}
	return p, nil
}

// provider is a backend plus what every provider shares: the challenge's
// name, the propagation check, and the redaction of its credentials from
// every error.
type provider struct {
	name     string
	backend  backend
	res      *resolver
	timeout  time.Duration
	interval time.Duration
	secrets  []string
}

func (p *provider) challenge(ctx context.Context, domain, keyAuth string) (*challenge, error) {
	domain = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(domain, "*."), "."))
	if _, ok := dns.IsDomainName(domain); !ok || domain == "" || strings.ContainsAny(domain, " \\\"()*;@$") {
		return nil, fmt.Errorf("dns01: %q is not a domain name", clip(domain))
	}
	if keyAuth == "" {
		return nil, errors.New("dns01: empty key authorization")
	}
	fqdn, err := p.res.effective(ctx, "_acme-challenge."+domain+".")
	if err != nil {
		return nil, p.wrap(domain, err)
	}
	return &challenge{domain: domain, fqdn: fqdn, value: RecordValue(keyAuth), keyAuth: keyAuth}, nil
}

// Present implements Provider.
func (p *provider) Present(ctx context.Context, domain, keyAuth string) error {
	ch, err := p.challenge(ctx, domain, keyAuth)
	if err != nil {
		return err
	}
	if err := p.backend.present(ctx, ch); err != nil {
		return p.wrap("present "+ch.fqdn, err)
	}
	if err := p.res.wait(ctx, ch.fqdn, ch.value, p.timeout, p.interval); err != nil {
		return p.wrap("present "+ch.fqdn, err)
	}
	return nil
}

// CleanUp implements Provider.
func (p *provider) CleanUp(ctx context.Context, domain, keyAuth string) error {
	ch, err := p.challenge(ctx, domain, keyAuth)
	if err != nil {
		return err
	}
	if err := p.backend.cleanup(ctx, ch); err != nil {
		return p.wrap("clean up "+ch.fqdn, err)
	}
	return nil
}

// wrap prefixes err with the provider and what it was doing, and replaces
// any credential in its text: an API that echoes a request, or a hook that
// prints its token with errorOutput on, must not put it in a log line.
func (p *provider) wrap(what string, err error) error {
	return &redacted{msg: redact(fmt.Sprintf("dns01: %s: %s: %v", p.name, what, err), p.secrets), err: err}
}

func redact(s string, secrets []string) string {
	for _, v := range secrets {
		if len(v) >= 4 { // shorter "secrets" would blank out ordinary words
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// redacted is an error whose text had credentials replaced; Unwrap still
// gives the cause, for errors.Is (ErrNotVisible, context.DeadlineExceeded).
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
