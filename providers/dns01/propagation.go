package dns01

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ErrNotVisible is wrapped by Present's error when the record was written
// but not every authoritative server of the zone served it within the
// propagation timeout. The record may still appear later: the caller
// cleans up and retries the order, it does not tell the CA.
var ErrNotVisible = errors.New("TXT record not visible at every authoritative server")

// exchangeTimeout bounds one DNS query (a lost UDP datagram, a server that
// does not answer); the propagation timeout bounds the whole wait.
const exchangeTimeout = 5 * time.Second

// maxCNAME bounds a CNAME chain from _acme-challenge.<domain>.
const maxCNAME = 16

// resolver asks the configured recursive resolvers where a name lives
// (CNAMEs, zone apex, name servers) and the zone's own name servers
// whether they serve a record yet. It is safe for concurrent use.
type resolver struct {
	servers []string // recursive resolvers, host:port, tried in order
	nsPort  string   // port of the authoritative servers (53)
}

// exchange sends m to server over UDP, again over TCP when the answer was
// truncated.
func exchange(ctx context.Context, m *dns.Msg, server string) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: exchangeTimeout}
	r, _, err := c.ExchangeContext(ctx, m, server)
	if err == nil && r.Truncated {
		c.Net = "tcp"
		r, _, err = c.ExchangeContext(ctx, m, server)
	}
	return r, err
}

// query asks the resolvers in turn for name/qtype (recursion desired) and
// returns the first answer that is not SERVFAIL or REFUSED (a resolver
// that cannot help), else the last such answer, else the errors.
func (r *resolver) query(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(1232, false)
	var errs []error
	var last *dns.Msg
	for _, s := range r.servers {
		resp, err := exchange(ctx, m, s)
		if err == nil && resp.Rcode != dns.RcodeServerFailure && resp.Rcode != dns.RcodeRefused {
			return resp, nil
		}
		if err == nil {
			last = resp
		} else {
			errs = append(errs, fmt.Errorf("resolver %s: %w", s, err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	if last != nil {
		return last, nil
	}
	return nil, fmt.Errorf("%s %s: %w", dns.TypeToString[qtype], name, errors.Join(errs...))
}

// effective follows the CNAME chain from fqdn, so that a delegated
// _acme-challenge name (CNAME to a zone the provider manages) is written
// and checked where the CA will look. lego's providers do the same.
func (r *resolver) effective(ctx context.Context, fqdn string) (string, error) {
	for range maxCNAME {
		resp, err := r.query(ctx, fqdn, dns.TypeCNAME)
		if err != nil {
			return "", err
		}
		if resp.Rcode != dns.RcodeSuccess {
			return fqdn, nil // NXDOMAIN: the usual case, nothing there yet
		}
		target := ""
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && strings.EqualFold(c.Hdr.Name, fqdn) {
				target = dns.CanonicalName(c.Target)
			}
		}
		if target == "" {
			return fqdn, nil
		}
		fqdn = target
	}
	return "", fmt.Errorf("%s: a chain of more than %d CNAMEs", fqdn, maxCNAME)
}

// zone returns the apex of the zone holding fqdn: the closest enclosing
// name whose SOA the resolvers return in the answer section.
func (r *resolver) zone(ctx context.Context, fqdn string) (string, error) {
	labels := dns.Split(fqdn)
	for _, i := range labels {
		name := fqdn[i:]
		resp, err := r.query(ctx, name, dns.TypeSOA)
		if err != nil {
			return "", fmt.Errorf("finding the zone of %s: %w", fqdn, err)
		}
		switch resp.Rcode {
		case dns.RcodeSuccess, dns.RcodeNameError:
		default:
			return "", fmt.Errorf("finding the zone of %s: SOA %s: %s", fqdn, name, dns.RcodeToString[resp.Rcode])
		}
		for _, rr := range resp.Answer {
			if soa, ok := rr.(*dns.SOA); ok && strings.EqualFold(soa.Hdr.Name, name) {
				return dns.CanonicalName(name), nil
			}
		}
	}
	return "", fmt.Errorf("no zone (SOA) found for %s", fqdn)
}

// nameserver is one of a zone's NS names and its addresses (host:port).
type nameserver struct {
	name  string
	addrs []string
}

// nameservers returns the zone's NS names and their addresses, sorted.
func (r *resolver) nameservers(ctx context.Context, zone string) ([]nameserver, error) {
	resp, err := r.query(ctx, zone, dns.TypeNS)
	if err != nil {
		return nil, fmt.Errorf("name servers of %s: %w", zone, err)
	}
	var out []nameserver
	for _, rr := range resp.Answer {
		if ns, ok := rr.(*dns.NS); ok && strings.EqualFold(ns.Hdr.Name, zone) {
			out = append(out, nameserver{name: dns.CanonicalName(ns.Ns)})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("name servers of %s: none (%s)", zone, dns.RcodeToString[resp.Rcode])
	}
	slices.SortFunc(out, func(a, b nameserver) int { return strings.Compare(a.name, b.name) })
	out = slices.CompactFunc(out, func(a, b nameserver) bool { return a.name == b.name })
	for i := range out {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
			resp, err := r.query(ctx, out[i].name, qtype)
			if err != nil {
				return nil, fmt.Errorf("address of name server %s: %w", out[i].name, err)
			}
			for _, rr := range resp.Answer {
				switch a := rr.(type) {
				case *dns.A:
					out[i].addrs = append(out[i].addrs, net.JoinHostPort(a.A.String(), r.nsPort))
				case *dns.AAAA:
					out[i].addrs = append(out[i].addrs, net.JoinHostPort(a.AAAA.String(), r.nsPort))
				}
			}
		}
	}
	return out, nil
}

// served asks every address of ns, without recursion, for the TXT records
// at fqdn. ns serves value when at least one address answered and every
// address that answered has it: an address this node cannot reach (IPv6
// on an IPv4-only node) does not hold the wait forever, a stale one does.
func served(ctx context.Context, ns nameserver, fqdn, value string) (bool, string) {
	if len(ns.addrs) == 0 {
		return false, "no address"
	}
	m := new(dns.Msg)
	m.SetQuestion(fqdn, dns.TypeTXT)
	m.RecursionDesired = false
	m.SetEdns0(1232, false)
	answered, why := 0, ""
	for _, addr := range ns.addrs {
		resp, err := exchange(ctx, m, addr)
		if err != nil {
			if why == "" {
				why = fmt.Sprintf("%s: %v", addr, err)
			}
			continue
		}
		answered++
		if !hasTXT(resp, fqdn, value) {
			return false, fmt.Sprintf("%s: TXT value absent (%s, %d answers)", addr, dns.RcodeToString[resp.Rcode], len(resp.Answer))
		}
	}
	return answered > 0, why
}

func hasTXT(resp *dns.Msg, fqdn, value string) bool {
	if resp.Rcode != dns.RcodeSuccess {
		return false
	}
	for _, rr := range resp.Answer {
		if t, ok := rr.(*dns.TXT); ok && strings.EqualFold(t.Hdr.Name, fqdn) && strings.Join(t.Txt, "") == value {
			return true
		}
	}
	return false
}

// wait returns once every authoritative server of fqdn's zone serves the
// TXT value, polling every interval for at most timeout.
func (r *resolver) wait(ctx context.Context, fqdn, value string, timeout, interval time.Duration) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	zone, err := r.zone(ctx, fqdn)
	if err != nil {
		return err
	}
	nss, err := r.nameservers(ctx, zone)
	if err != nil {
		return err
	}
	pending := map[string]string{} // NS name → why not yet
	for _, ns := range nss {
		pending[ns.name] = "not asked yet"
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return parent.Err()
			}
			var why []string
			for _, ns := range nss {
				if w, ok := pending[ns.name]; ok {
					why = append(why, ns.name+" "+w)
				}
			}
			return fmt.Errorf("%w of %s after %s: %s", ErrNotVisible, zone, timeout, strings.Join(why, "; "))
		case <-timer.C:
		}
		for _, ns := range nss {
			if _, ok := pending[ns.name]; !ok {
				continue
			}
			if ok, why := served(ctx, ns, fqdn, value); ok {
				delete(pending, ns.name)
			} else if ctx.Err() == nil {
				pending[ns.name] = why
			}
		}
		if len(pending) == 0 {
			return nil
		}
		timer.Reset(interval)
	}
}

// systemResolvers reads the resolvers of resolv.conf.
func systemResolvers(path string) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no nameserver line", path)
	}
	return out, nil
}

func portString(p int) string { return strconv.Itoa(p) }
