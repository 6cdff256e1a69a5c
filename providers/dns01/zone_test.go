package dns01

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/loopnet"
	"github.com/miekg/dns"
)

// testZone is a zone served by two authoritative servers on loopback
// (ns1 and ns2, on two addresses of a loopnet block, the same port), the
// way a primary and its secondary serve a real zone. The zone's content
// changes through RFC 2136 updates sent to ns1 (TSIG-checked, as a real
// primary does) or through the fake provider APIs (testZone.set). ns2 can
// lag: after a change it keeps answering from its old copy for a number
// of TXT queries, as a secondary does until its next transfer.
//
// ns1 also answers the recursive questions (zone apex, NS, addresses,
// CNAMEs) the resolver asks: it is authoritative for every name they
// involve.
type testZone struct {
	origin string
	port   int
	tsig   map[string]string // key name → base64 secret, for updates

	mu      stdsync.Mutex
	records []dns.RR // the primary's content
	ns      []*testNS
}

type testNS struct {
	name string // ns1.<origin>
	addr string // ip:port

	mu        stdsync.Mutex
	records   []dns.RR
	next      []dns.RR // the content it will serve once countdown reaches 0
	lag       int      // TXT queries answered from the old content after a change
	countdown int
	txtAsked  int // TXT queries answered, in all
}

const (
	testKeyName   = "keel-test."
	testKeySecret = "c2VjcmV0LXRzaWcta2V5LWZvci1rZWVsLXRlc3RzLTAxMjM0NTY3ODk=" // base64 of a 40-byte test key
)

// newTestZone starts ns1 and ns2 for origin; ns2 lags by lag TXT queries.
func newTestZone(t *testing.T, origin string, lag int) *testZone {
	t.Helper()
	pair, err := loopnet.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pair.Release)
	ip1 := pair.A.Addr().Next()
	ip2 := ip1.Next()

	z := &testZone{origin: dns.CanonicalName(origin), tsig: map[string]string{testKeyName: testKeySecret}}
	// The first listener picks the port; the others take the same one on
	// their address (the block is ours alone, so it is free).
	pc1, err := net.ListenPacket("udp", net.JoinHostPort(ip1.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	z.port = pc1.LocalAddr().(*net.UDPAddr).Port
	for i, ip := range []netip.Addr{ip1, ip2} {
		ns := &testNS{name: fmt.Sprintf("ns%d.%s", i+1, z.origin), addr: net.JoinHostPort(ip.String(), fmt.Sprint(z.port))}
		if i == 1 {
			ns.lag = lag
		}
		pc := pc1
		if i > 0 {
			if pc, err = net.ListenPacket("udp", ns.addr); err != nil {
				t.Fatal(err)
			}
		}
		ln, err := net.Listen("tcp", ns.addr)
		if err != nil {
			t.Fatal(err)
		}
		z.ns = append(z.ns, ns)
		h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) { z.serve(ns, w, r) })
		for _, srv := range []*dns.Server{
			{PacketConn: pc, Handler: h, TsigSecret: z.tsig, MsgAcceptFunc: acceptUpdates},
			{Listener: ln, Handler: h, TsigSecret: z.tsig, MsgAcceptFunc: acceptUpdates},
		} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = srv.ActivateAndServe()
			}()
			t.Cleanup(func() {
				_ = srv.Shutdown()
				<-done
			})
		}
	}

	soa := fmt.Sprintf("%s 3600 IN SOA ns1.%s hostmaster.%s 1 3600 600 86400 60", z.origin, z.origin, z.origin)
	z.set(func(rrs []dns.RR) []dns.RR {
		return append(rrs,
			mustRR(t, soa),
			mustRR(t, fmt.Sprintf("%s 3600 IN NS ns1.%s", z.origin, z.origin)),
			mustRR(t, fmt.Sprintf("%s 3600 IN NS ns2.%s", z.origin, z.origin)),
			mustRR(t, fmt.Sprintf("ns1.%s 3600 IN A %s", z.origin, ip1)),
			mustRR(t, fmt.Sprintf("ns2.%s 3600 IN A %s", z.origin, ip2)),
		)
	})
	// The initial content is there at once, lag or not.
	for _, ns := range z.ns {
		ns.mu.Lock()
		ns.records, ns.next, ns.countdown = slices.Clone(z.records), nil, 0
		ns.mu.Unlock()
	}
	return z
}

// resolverAddr is ns1's address, the resolver the configurations name.
func (z *testZone) resolverAddr() string { return z.ns[0].addr }

// acceptUpdates is miekg/dns's default filter, which refuses UPDATE
// messages, widened to take them (this server is a primary).
func acceptUpdates(dh dns.Header) dns.MsgAcceptAction {
	if int(dh.Bits>>11)&0xF == dns.OpcodeUpdate {
		if dh.Bits&(1<<15) != 0 || dh.Qdcount != 1 {
			return dns.MsgReject
		}
		return dns.MsgAccept
	}
	return dns.DefaultMsgAcceptFunc(dh)
}

func mustRR(t *testing.T, s string) dns.RR {
	t.Helper()
	rr, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// set changes the primary's content and publishes it to ns1 at once and
// to ns2 after its lag.
func (z *testZone) set(change func([]dns.RR) []dns.RR) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.records = change(z.records)
	for _, ns := range z.ns {
		ns.mu.Lock()
		if ns.lag > 0 {
			ns.next, ns.countdown = slices.Clone(z.records), ns.lag
		} else {
			ns.records = slices.Clone(z.records)
		}
		ns.mu.Unlock()
	}
}

// setTXT replaces the TXT records at name by one per value.
func (z *testZone) setTXT(name string, values []string) {
	z.set(func(rrs []dns.RR) []dns.RR {
		rrs = slices.DeleteFunc(rrs, func(rr dns.RR) bool {
			return rr.Header().Rrtype == dns.TypeTXT && strings.EqualFold(rr.Header().Name, name)
		})
		for _, v := range values {
			rrs = append(rrs, &dns.TXT{Hdr: dns.RR_Header{Name: dns.CanonicalName(name), Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{v}})
		}
		return rrs
	})
}

func (z *testZone) serve(ns *testNS, w dns.ResponseWriter, r *dns.Msg) {
	if r.Opcode == dns.OpcodeUpdate {
		z.update(ns, w, r)
		return
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	if !dns.IsSubDomain(z.origin, q.Name) {
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused
		_ = w.WriteMsg(m)
		return
	}
	ns.mu.Lock()
	if q.Qtype == dns.TypeTXT {
		ns.txtAsked++
		if ns.next != nil {
			if ns.countdown--; ns.countdown <= 0 {
				ns.records, ns.next = ns.next, nil
			}
		}
	}
	recs := ns.records
	ns.mu.Unlock()

	exists := false
	var cname dns.RR
	var soa dns.RR
	for _, rr := range recs {
		h := rr.Header()
		if h.Rrtype == dns.TypeSOA {
			soa = rr
		}
		switch {
		case strings.EqualFold(h.Name, q.Name):
			exists = true
			if h.Rrtype == q.Qtype {
				m.Answer = append(m.Answer, dns.Copy(rr))
			}
			if h.Rrtype == dns.TypeCNAME {
				cname = rr
			}
		case dns.IsSubDomain(q.Name, h.Name):
			exists = true // an empty non-terminal
		}
	}
	if len(m.Answer) == 0 && cname != nil {
		m.Answer = append(m.Answer, dns.Copy(cname))
	}
	if len(m.Answer) == 0 {
		if !exists {
			m.Rcode = dns.RcodeNameError
		}
		if soa != nil {
			m.Ns = append(m.Ns, dns.Copy(soa))
		}
	}
	_ = w.WriteMsg(m)
}

// update applies an RFC 2136 update from a client holding a key of
// z.tsig, and answers the way BIND does when the signature is bad: NOTAUTH
// with an unsigned TSIG record carrying the TSIG error.
func (z *testZone) update(ns *testNS, w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	t := r.IsTsig()
	switch {
	case ns != z.ns[0]:
		m.Rcode = dns.RcodeNotAuth // only the primary takes updates
	case t == nil:
		m.Rcode = dns.RcodeRefused
	case w.TsigStatus() != nil:
		tsigErr := uint16(dns.RcodeBadSig)
		if _, ok := z.tsig[t.Hdr.Name]; !ok {
			tsigErr = dns.RcodeBadKey
		}
		m.Rcode = dns.RcodeNotAuth
		m.Extra = append(m.Extra, &dns.TSIG{
			Hdr:       dns.RR_Header{Name: t.Hdr.Name, Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
			Algorithm: t.Algorithm, TimeSigned: t.TimeSigned, Fudge: t.Fudge, OrigId: r.Id, Error: tsigErr,
		})
		buf, err := m.Pack()
		if err == nil {
			_, _ = w.Write(buf)
		}
		return
	case !strings.EqualFold(r.Question[0].Name, z.origin):
		m.Rcode = dns.RcodeNotZone
	default:
		for _, rr := range r.Ns {
			if !dns.IsSubDomain(z.origin, rr.Header().Name) {
				m.Rcode = dns.RcodeNotZone
			}
		}
		if m.Rcode == dns.RcodeSuccess {
			z.set(func(rrs []dns.RR) []dns.RR { return applyUpdate(rrs, r.Ns) })
		}
	}
	if t != nil {
		m.SetTsig(t.Hdr.Name, t.Algorithm, 300, time.Now().Unix())
	}
	_ = w.WriteMsg(m)
}

// applyUpdate applies the update section of an RFC 2136 message (§2.5):
// class IN adds an RR, class NONE deletes one, class ANY deletes an RRset
// (or every RRset at the name, for type ANY).
func applyUpdate(rrs, updates []dns.RR) []dns.RR {
	for _, u := range updates {
		h := u.Header()
		switch h.Class {
		case dns.ClassINET:
			if !slices.ContainsFunc(rrs, func(rr dns.RR) bool { return dns.IsDuplicate(rr, u) }) {
				rrs = append(rrs, dns.Copy(u))
			}
		case dns.ClassNONE:
			del := dns.Copy(u)
			del.Header().Class = dns.ClassINET
			rrs = slices.DeleteFunc(rrs, func(rr dns.RR) bool { return dns.IsDuplicate(rr, del) })
		case dns.ClassANY:
			rrs = slices.DeleteFunc(rrs, func(rr dns.RR) bool {
				return strings.EqualFold(rr.Header().Name, h.Name) && (h.Rrtype == dns.TypeANY || h.Rrtype == rr.Header().Rrtype)
			})
		}
	}
	return rrs
}

// txt asks ns, as the CA would, for the TXT values at name.
func (z *testZone) txt(t *testing.T, ns int, name string) (values []string, rcode int) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.CanonicalName(name), dns.TypeTXT)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, z.ns[ns].addr)
	if err != nil {
		t.Fatalf("TXT %s at %s: %v", name, z.ns[ns].name, err)
	}
	for _, rr := range r.Answer {
		if x, ok := rr.(*dns.TXT); ok {
			values = append(values, strings.Join(x.Txt, ""))
		}
	}
	slices.Sort(values)
	return values, r.Rcode
}

// served returns the TXT values ns serves at name now, without counting a
// query (for checks that must not move a lagging server along).
func (z *testZone) served(ns int, name string) []string {
	s := z.ns[ns]
	s.mu.Lock()
	defer s.mu.Unlock()
	var values []string
	for _, rr := range s.records {
		if x, ok := rr.(*dns.TXT); ok && strings.EqualFold(x.Hdr.Name, dns.CanonicalName(name)) {
			values = append(values, strings.Join(x.Txt, ""))
		}
	}
	slices.Sort(values)
	return values
}

func (z *testZone) txtQueries(ns int) int {
	s := z.ns[ns]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.txtAsked
}

// writeConfig writes a configuration file, mode 0600, and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dns.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// propagationSettings are the common settings pointing the provider at z.
func (z *testZone) propagationSettings(timeout time.Duration) string {
	return fmt.Sprintf("resolvers: [%q]\nnameserverPort: %d\npropagationTimeout: %s\npropagationInterval: 20ms\n", z.resolverAddr(), z.port, timeout)
}

// noSecret fails t if err's text holds one of the secrets.
func noSecret(t *testing.T, err error, secrets ...string) {
	t.Helper()
	if err == nil {
		return
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("the error holds a credential: %v", err)
		}
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
