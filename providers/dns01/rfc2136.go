package dns01

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/miekg/dns"
)

// tsigFudge is the clock skew the TSIG signature allows (RFC 8945's
// recommended 300 s).
const tsigFudge = 300

// rfc2136 sends signed dynamic updates (RFC 2136, TSIG RFC 8945) to one
// server: BIND, Knot, PowerDNS and most hosted primaries take them. The
// protocol is miekg/dns's; this is only the two messages Keel needs.
type rfc2136 struct {
	server  string // host:port
	zone    string // FQDN, or "" to find it through the resolvers
	keyName string
	alg     string
	secret  string // base64, given to miekg/dns only
	ttl     uint32
	res     *resolver
}

func newRFC2136(c *config, res *resolver) *rfc2136 {
	return &rfc2136{
		server:  c.Server,
		zone:    c.Zone,
		keyName: c.TSIGKey,
		alg:     c.TSIGAlgorithm,
		secret:  c.TSIGSecret,
		ttl:     uint32(c.TTL),
		res:     res,
	}
}

func (u *rfc2136) present(ctx context.Context, ch *challenge) error {
	return u.update(ctx, ch, true)
}

func (u *rfc2136) cleanup(ctx context.Context, ch *challenge) error {
	return u.update(ctx, ch, false)
}

// update adds (or removes) exactly the challenge's TXT record: other TXT
// records at the name (a concurrent challenge for the same name, as a
// wildcard and its base domain have) are left alone.
func (u *rfc2136) update(ctx context.Context, ch *challenge, add bool) error {
	zone := u.zone
	if zone == "" {
		var err error
		if zone, err = u.res.zone(ctx, ch.fqdn); err != nil {
			return err
		}
	}
	if !dns.IsSubDomain(zone, ch.fqdn) {
		return fmt.Errorf("%s is not in the configured zone %s", ch.fqdn, zone)
	}
	rr := &dns.TXT{
		Hdr: dns.RR_Header{Name: ch.fqdn, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: u.ttl},
		Txt: []string{ch.value},
	}
	m := new(dns.Msg)
	m.SetUpdate(zone)
	if add {
		m.Insert([]dns.RR{rr})
	} else {
		m.Remove([]dns.RR{rr})
	}
	m.SetTsig(u.keyName, u.alg, tsigFudge, time.Now().Unix())
	c := &dns.Client{Net: "tcp", Timeout: exchangeTimeout, TsigSecret: map[string]string{u.keyName: u.secret}}
	resp, _, err := c.ExchangeContext(ctx, m, u.server)
	return u.result(resp, err)
}

var tsigErrors = []error{dns.ErrSig, dns.ErrAuth, dns.ErrSecret, dns.ErrKeyAlg, dns.ErrTime, dns.ErrNoSig}

// result turns the server's answer into an error a human can act on. The
// secret is never part of it: miekg/dns's errors do not carry it.
func (u *rfc2136) result(resp *dns.Msg, err error) error {
	var tsigErr string
	if resp != nil {
		if t := resp.IsTsig(); t != nil && t.Error != dns.RcodeSuccess {
			tsigErr = dns.RcodeToString[int(t.Error)]
			if tsigErr == "" {
				tsigErr = fmt.Sprintf("code %d", t.Error)
			}
		}
	}
	hint := fmt.Sprintf("check tsigKey (%s), tsigAlgorithm (%s) and tsigSecret", u.keyName, u.alg)
	switch {
	case tsigErr != "":
		return fmt.Errorf("update refused by %s: TSIG %s (%s): %s", u.server, tsigErr, dns.RcodeToString[resp.Rcode], hint)
	case err != nil && isTSIGError(err):
		return fmt.Errorf("update to %s: the answer's TSIG signature does not verify (%w): %s", u.server, err, hint)
	case err != nil:
		return fmt.Errorf("update to %s: %w", u.server, err)
	case resp.Rcode == dns.RcodeNotAuth:
		return fmt.Errorf("update refused by %s: NOTAUTH: %s, and that the key may update the zone", u.server, hint)
	case resp.Rcode != dns.RcodeSuccess:
		return fmt.Errorf("update refused by %s: %s", u.server, dns.RcodeToString[resp.Rcode])
	}
	return nil
}

func isTSIGError(err error) bool {
	for _, e := range tsigErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
