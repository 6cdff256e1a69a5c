package agent

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/ingress"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/acme"
	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// IngressOptions turn the node's HTTPS ingress on: its listeners, and how
// it obtains the certificates of the Ingress hosts it owns.
type IngressOptions struct {
	// HTTPAddr and HTTPSAddr are the listeners (host:port); at least one.
	HTTPAddr, HTTPSAddr string
	// Limits bound the ingress's clients and backends.
	Limits ingress.Limits
	// Directory is the ACME directory (acme.LetsEncrypt when empty) and
	// Roots the extra roots its TLS certificate is checked against (nil:
	// the system's).
	Directory string
	Roots     *x509.CertPool
	// DNS, when set, answers DNS-01 challenges; otherwise HTTP-01
	// challenges are answered by every ingress node.
	DNS acme.DNSProvider
	// HTTP01Wait is how long an HTTP-01 answer published in git is given
	// to reach the other ingress nodes before the CA is told to look
	// (default: two polls and a second).
	HTTP01Wait time.Duration
	// Identity opens the certificates shared with this node (its
	// --report-key); nil: it can open none, and obtains its own.
	Identity *certshare.Identity
	// RetryBase and RetryMax are the backoff of a failed order (zero:
	// acme's defaults of minutes, capped at a day).
	RetryBase, RetryMax time.Duration
}

// ingressState is the agent's ingress: the server, the certificates it
// serves, the ACME manager that obtains this node's, and the publisher
// of the shared copies. The loop owns the fields marked so; the rest is
// safe for concurrent use.
type ingressState struct {
	opts   IngressOptions
	node   string
	log    *slog.Logger
	server *ingress.Server
	certs  *certStore
	acme   *acme.Manager
	pub    *certPublisher
	// recipients are the nodes shared certificates are sealed to, as of
	// the applied commit (set by the loop, read by OnIssued).
	recipients atomic.Pointer[[]certshare.Recipient]
	// changed wakes the loop when a certificate this node serves changed
	// (issued here), so that its report says so at once.
	changed chan struct{}

	// Owned by the loop.
	shared map[string]sharedCert // by host, as of the last read
	// refs are the commits of the certificate refs at the last read, by
	// host, whether they were read or refused.
	refs map[string]plumbing.Hash
	// readAt is when the last read began (the fetch's start, by the
	// machine's clock, as pushedCopy.at).
	readAt time.Time
	// unread is, by host, the commit this node pushed that was seen
	// refused on read (warned about once).
	unread map[string]plumbing.Hash
	// read is set once the shared certificates were read since the
	// agent started: no order starts before, so that a restarted owner
	// takes its certificate back from git rather than ordering another.
	read        bool
	routed      bool     // this node served routes at the last pass
	tlsServed   []string // the hosts with tls it serves, as of the last pass
	problems    []string
	redirectErr string // the last error setting the redirects, logged once
}

// sharedCert is a shared certificate as read, opened when this node is
// one of its recipients.
type sharedCert struct {
	sync.SharedCert
	bundle  *providers.Bundle // nil: none, or not opened
	openErr error
}

func newIngressState(opts Options) (*ingressState, error) {
	io := opts.Ingress
	log := opts.Logger.With("node", opts.Node)
	st := &ingressState{opts: *io, node: opts.Node, log: log, certs: newCertStore(), changed: make(chan struct{}, 1),
		unread: map[string]plumbing.Hash{}}
	issuer, err := acme.NewIssuer(acme.Options{Directory: io.Directory, Roots: io.Roots, StateDir: opts.StateDir, Logger: log,
		UserAgent: "keel/" + opts.Version})
	if err != nil {
		return nil, err
	}
	if err := opts.Registry.Register(st.certs); err != nil {
		return nil, fmt.Errorf("registering the certificate metrics: %w", err)
	}
	st.pub = newCertPublisher(opts, log)
	st.acme, err = acme.NewManager(acme.ManagerOptions{Issuer: issuer, OnIssued: st.onIssued, Registry: opts.Registry, Logger: log,
		RetryBase: io.RetryBase, RetryMax: io.RetryMax})
	if err != nil {
		st.pub.close()
		return nil, err
	}
	st.server, err = ingress.New(ingress.Options{HTTPAddr: io.HTTPAddr, HTTPSAddr: io.HTTPSAddr, Certs: st.certs, Challenges: st.certs,
		Logger: log, Metrics: ingress.NewMetrics(opts.Registry), Limits: io.Limits})
	if err != nil {
		st.acme.Close()
		st.pub.close()
		return nil, err
	}
	return st, nil
}

// close stops the server, the orders and the publisher, and waits.
func (st *ingressState) close() {
	if err := st.server.Close(); err != nil {
		st.log.Warn("closing the ingress", "err", err)
	}
	st.acme.Close()
	st.pub.close()
}

// onIssued serves a certificate this node obtained and publishes it,
// sealed to the ingress nodes, so that they serve it too. It runs on the
// host's ACME goroutine.
func (st *ingressState) onIssued(b *providers.Bundle) {
	if err := st.certs.Put(b); err != nil {
		st.log.Error("the certificate obtained does not load", "host", b.Host, "err", err)
		return
	}
	st.log.Info("certificate obtained", "host", b.Host, "serial", b.Serial, "expires", b.NotAfter.Format(time.RFC3339))
	select {
	case st.changed <- struct{}{}:
	default:
	}
	rs := st.recipients.Load()
	if rs == nil || !slices.ContainsFunc(*rs, func(r certshare.Recipient) bool { return r.Node == st.node }) {
		return // this node cannot share: it obtains its own, as each such node does
	}
	ctx, cancel := context.WithTimeout(context.Background(), st.pub.timeout)
	defer cancel()
	if err := st.pub.publishBundle(ctx, b, *rs); err != nil {
		st.log.Warn("publishing the certificate; the next pass tries again", "host", b.Host, "err", err)
	}
}

// readShared opens the shared certificates read from git: on the git
// worker's goroutine, so that no decryption runs on the loop. opened
// caches what was opened by commit, so that an unchanged ref is not
// decrypted again at every fetch. Only the hosts of the model's Ingresses
// with tls count: a ref for any other name (anyone who may publish can
// push one) is neither opened nor served, nor are its challenges
// answered.
func readShared(m *sync.Mirror, model *render.Model, keys sync.ReportKeys, id *certshare.Identity, opened map[string]*providers.Bundle) (map[string]sharedCert, []string, error) {
	var publishers []string
	hosts := map[string]bool{}
	if model != nil {
		for _, n := range model.IngressNodes() {
			publishers = append(publishers, n.Name)
		}
		for _, in := range model.Ingresses {
			if in.TLS != nil {
				hosts[in.Host] = true
			}
		}
	}
	certs, problems, err := m.Certs(publishers, keys)
	if err != nil {
		return nil, nil, err
	}
	out := make(map[string]sharedCert, len(certs))
	seen := map[string]bool{}
	for host, c := range certs {
		if !hosts[host] {
			continue
		}
		sc := sharedCert{SharedCert: c}
		if c.Meta.Certificate != nil && id != nil {
			key := c.Commit.String()
			seen[key] = true
			if b, ok := opened[key]; ok {
				sc.bundle = b
			} else if b, err := certshare.Open(c.Sealed, id); err == nil {
				sc.bundle, opened[key] = b, b
			} else if !errors.Is(err, certshare.ErrNotRecipient) {
				sc.openErr = err
				problems = append(problems, fmt.Sprintf("certificate of %s: %v", host, err))
			}
		}
		out[host] = sc
	}
	for k := range opened {
		if !seen[k] {
			delete(opened, k)
		}
	}
	return out, problems, nil
}

// takeShared takes in the shared certificates of a fetch (on the loop);
// the pass that follows decides which to serve and which HTTP-01
// answers count (serveShared).
//
// A shared certificate whose ref was deleted since the last read is
// withdrawn (the operator's way to force a new key, docs/ingress.md):
// every node stops serving it, and its owner orders a new one. So is one
// that is now refused on read: its publisher left the inventory, lost
// its ingress label or changed its key (a compromised node's copy goes
// with it).
func (st *ingressState) takeShared(shared map[string]sharedCert, refs map[string]plumbing.Hash, readAt time.Time, problems []string) {
	for host, old := range st.shared {
		if _, ok := shared[host]; ok || old.Meta.Certificate == nil {
			continue
		}
		if st.certs.Withdraw(host, old.Meta.Certificate.Serial) {
			st.log.Warn("the shared certificate was deleted from git: no longer served; its owner orders a new one",
				"host", host, "serial", old.Meta.Certificate.Serial)
			st.acme.Forget(host)
			st.pub.forget(host)
		}
	}
	st.shared, st.refs, st.readAt, st.problems, st.read = shared, refs, readAt, problems, true
	st.pub.setKnown(shared)
}

// serveShared serves the shared certificates and HTTP-01 answers that
// count under the plan (on the loop, at every pass, so that a change of
// owner takes effect without a new read). owners are the hosts' owners,
// orderers say who may order a host's certificate: its owner, and the
// ingress nodes that cannot receive shared certificates (they order
// their own).
//
// The owner's copy wins: any ingress node may publish on any host's ref,
// so a compromised one could publish a certificate of its own making
// that expires in a hundred years, and "the later expiry wins" would
// have every node serve it, the owner included, which would then never
// renew. So a node that serves a valid certificate replaces it only with
// the copy its owner published, and the owner never replaces its own; a
// node that serves none (it just started) takes any valid copy, until the
// owner's comes. Challenges count only from a host's orderers.
func (st *ingressState) serveShared(owners map[string]string, orderers func(host, node string) bool) {
	now := st.pub.now()
	valid := func(b *providers.Bundle) bool { return b != nil && !now.Before(b.NotBefore) && now.Before(b.NotAfter) }
	answers := map[string]string{}
	for host, c := range st.shared {
		owner, ok := owners[host]
		if !ok {
			continue // not a host of the applied commit's Ingresses
		}
		if orderers(host, c.Meta.PublishedBy) {
			for token, ka := range c.Meta.Challenges {
				answers[token] = ka
			}
		}
		b := c.bundle
		if !valid(b) {
			continue
		}
		cur := st.certs.Bundle(host)
		switch {
		case cur != nil && cur.Serial == b.Serial:
			continue
		case !valid(cur):
			// Nothing (valid) served: any copy beats none.
		case owner == st.node || c.Meta.PublishedBy != owner:
			continue
		}
		if err := st.certs.Put(b); err != nil {
			st.log.Warn("a shared certificate does not load", "host", host, "err", err)
			continue
		}
		st.log.Info("serving the shared certificate", "host", host, "serial", b.Serial, "publishedBy", c.Meta.PublishedBy,
			"expires", b.NotAfter.Format(time.RFC3339))
	}
	st.certs.SetShared(answers)
}

// pass points the ingress at the plan (on the loop): the routes when this
// node serves Ingresses, the hosts whose certificates it obtains, and the
// shared copies it must publish again.
func (st *ingressState) pass(m *render.Model, plan *planner.Plan, leaving bool) {
	ingressNode := !leaving && slices.ContainsFunc(m.IngressNodes(), func(n render.Node) bool { return n.Name == st.node })
	var routes []ingress.Route
	if ingressNode {
		routes = ingressRoutes(m, plan)
	}
	if err := st.server.SetRoutes(routes); err != nil {
		st.log.Warn("ingress routes", "err", err)
	}
	st.routed = ingressNode
	rs, _ := certshare.Recipients(m)
	st.recipients.Store(&rs)
	canShare := slices.ContainsFunc(rs, func(r certshare.Recipient) bool { return r.Node == st.node })
	tlsHosts := map[string]string{} // host → contact email
	owners := map[string]string{}
	for _, in := range m.Ingresses {
		if in.TLS == nil {
			continue
		}
		if _, ok := tlsHosts[in.Host]; !ok {
			tlsHosts[in.Host] = in.TLS.Email
		}
	}
	for _, in := range plan.Ingresses {
		if _, ok := tlsHosts[in.Host]; ok && owners[in.Host] == "" {
			owners[in.Host] = in.Owner
		}
	}
	st.certs.Retain(func(h string) bool { _, ok := tlsHosts[h]; return ok })
	st.tlsServed = nil
	if ingressNode {
		st.tlsServed = slices.Sorted(maps.Keys(tlsHosts))
	}
	recipient := map[string]bool{}
	for _, r := range rs {
		recipient[r.Node] = true
	}
	ingressNodes := map[string]bool{}
	for _, n := range m.IngressNodes() {
		ingressNodes[n.Name] = true
	}
	st.serveShared(owners, func(host, node string) bool {
		return node != "" && (node == owners[host] || ingressNodes[node] && !recipient[node])
	})
	if !st.read {
		// Not read yet (the first pass runs on the last good commit,
		// before the first fetch; or git is unreachable since the start):
		// a certificate shared in git would not be known, and an order
		// would issue a certificate that exists already.
		return
	}
	var wants []acme.Want
	if ingressNode {
		for _, host := range slices.Sorted(maps.Keys(tlsHosts)) {
			// One issuer per host: the owner. A node that cannot receive
			// shared certificates obtains its own.
			if owners[host] != st.node && canShare {
				continue
			}
			wants = append(wants, acme.Want{Host: host, Email: tlsHosts[host], Current: st.certs.Bundle(host), Solver: st.solver()})
			if !canShare {
				continue
			}
			// The owner publishes again what it serves when the shared
			// copy is not it (a failed push, another node's copy), or is
			// sealed to another set of nodes (one joined, left, or
			// changed its key).
			b := st.certs.Bundle(host)
			if b == nil {
				continue
			}
			pushed := st.pub.lastPushed(host)
			if !pushed.at.IsZero() && !st.readAt.After(pushed.at) && st.refs[host] != pushed.commit {
				continue // the last read predates this node's last push: the next one brings it
			}
			sh, ok := st.shared[host]
			if ok && sh.Meta.Certificate != nil && sh.Meta.Certificate.Serial == b.Serial && !certshare.NeedsReseal(sh.Meta, rs) {
				continue
			}
			if !ok && !pushed.commit.IsZero() && st.refs[host] == pushed.commit {
				// What this node pushed last is on the ref, and refused on
				// read (signed with no key or the wrong one): pushing it
				// again, at every pass, would change nothing.
				if st.unread[host] != pushed.commit {
					st.unread[host] = pushed.commit
					st.log.Warn("the certificate this node shared is refused on read; check its --report-key against its reportKey",
						"host", host, "problem", problemOf(st.problems, host))
				}
				continue
			}
			st.pub.republish(b, rs)
		}
	}
	st.acme.Set(wants)
}

// problemOf is the problem of problems about host's certificate ref, or
// "".
func problemOf(problems []string, host string) string {
	for _, p := range problems {
		if strings.HasPrefix(p, fmt.Sprintf("certificate of %q ", host)) {
			return p
		}
	}
	return ""
}

// solver answers the challenges of this node's orders: DNS-01 through
// the DNS provider when one is configured, else HTTP-01 through every
// ingress node.
func (st *ingressState) solver() acme.Solver {
	if st.opts.DNS != nil {
		return acme.DNS01(st.opts.DNS)
	}
	return http01{st}
}

// noCertificate is the report's error for a host served without a
// certificate yet (its handshakes fail) and no failed order to tell of.
const noCertificate = "no certificate yet: TLS handshakes for this host fail"

// report lists the certificates this node serves, with the last error
// of the orders it runs, and the hosts it serves without one (on the
// loop).
func (st *ingressState) report() []report.Certificate {
	byHost := map[string]report.Certificate{}
	for _, host := range st.tlsServed {
		byHost[host] = report.Certificate{Host: host, Error: noCertificate}
	}
	for host, b := range st.certs.Bundles() {
		byHost[host] = report.Certificate{Host: host, Expires: b.NotAfter, Serial: b.Serial, Issuer: b.Issuer}
	}
	for _, s := range st.acme.Status() {
		if s.LastError == "" {
			continue
		}
		c := byHost[s.Host]
		c.Host, c.Error = s.Host, report.TrimText(s.LastError)
		byHost[s.Host] = c
	}
	out := make([]report.Certificate, 0, len(byHost))
	for _, h := range slices.Sorted(maps.Keys(byHost)) {
		out = append(out, byHost[h])
	}
	return out
}

// redirects are the pf redirects of ports 80 and 443 to the listeners,
// on a driver that has them (FreeBSD): a listener on an unspecified
// address is reached at the node's address.
func (st *ingressState) redirects(node *render.Node) []nodeexec.Redirect {
	var out []nodeexec.Redirect
	for _, l := range []struct {
		port uint16
		addr net.Addr
	}{{80, st.server.HTTPAddr()}, {443, st.server.HTTPSAddr()}} {
		tcp, ok := l.addr.(*net.TCPAddr)
		if !ok || tcp == nil {
			continue
		}
		ap := tcp.AddrPort()
		addr := ap.Addr().Unmap()
		if addr.IsUnspecified() {
			if node == nil {
				continue
			}
			addr = node.Address.Addr
		}
		if ap.Port() == l.port && addr == ap.Addr().Unmap() {
			continue // already listening on the public port itself
		}
		out = append(out, nodeexec.Redirect{Port: l.port, To: netip.AddrPortFrom(addr, ap.Port())})
	}
	return out
}

// ingressRoutes are the routes of every Ingress of the plan: its host and
// path to its backend Service's endpoints, at the backend port.
func ingressRoutes(m *render.Model, plan *planner.Plan) []ingress.Route {
	endpoints := map[string][]planner.Endpoint{}
	for _, s := range plan.Services {
		endpoints[s.Name] = s.Endpoints
	}
	var routes []ingress.Route
	for _, in := range m.Ingresses {
		r := ingress.Route{Host: in.Host, Path: in.Path, Service: in.Backend.Service, Insecure: in.TLS == nil}
		port := in.Backend.Port
		if port == 0 {
			if s := m.Service(in.Backend.Service); s != nil {
				port = s.Port
			}
		}
		for _, ep := range endpoints[in.Backend.Service] {
			r.Endpoints = append(r.Endpoints, netip.AddrPortFrom(ep.Address, uint16(port)))
		}
		routes = append(routes, r)
	}
	return routes
}

// http01 answers HTTP-01 challenges through every ingress node: the
// answer is served here at once, and published with the host's shared
// certificate for the other ingress nodes, which are given
// IngressOptions.HTTP01Wait to fetch it before the CA is told to look.
type http01 struct{ st *ingressState }

func (http01) Type() string { return acme.ChallengeHTTP01 }

func (h http01) Present(ctx context.Context, host, token, keyAuth string) error {
	h.st.certs.Answer(token, keyAuth)
	serving, rs := h.st.sharing(host)
	if err := h.st.pub.challenge(ctx, host, token, keyAuth, serving, rs); err != nil {
		return fmt.Errorf("publish the HTTP-01 answer for the other ingress nodes: %w", err)
	}
	t := time.NewTimer(h.st.opts.HTTP01Wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (h http01) CleanUp(ctx context.Context, host, token, _ string) error {
	h.st.certs.Answer(token, "")
	serving, rs := h.st.sharing(host)
	return h.st.pub.challenge(ctx, host, token, "", serving, rs)
}

// sharing returns the certificate this node serves for host and the
// nodes to seal it to, when this node shares its certificates (nil
// otherwise).
func (st *ingressState) sharing(host string) (*providers.Bundle, []certshare.Recipient) {
	rs := st.recipients.Load()
	if rs == nil || !slices.ContainsFunc(*rs, func(r certshare.Recipient) bool { return r.Node == st.node }) {
		return nil, nil
	}
	return st.certs.Bundle(host), *rs
}

// certPublisher publishes this node's shared certificates and HTTP-01
// answers on refs/keel/certs/<host>, from a repository of its own
// (<state>/publish-certs, or publish-certs-reports for a separate report
// repository): never from the loop, never behind a fetch or a report
// push. Pushes go one at a time; a push is never cancelled (as the
// report publisher's), only bounded by the git timeout. republish runs in
// a goroutine that close waits for.
type certPublisher struct {
	node     string
	stateDir string
	remote   sync.Remote
	timeout  time.Duration
	signer   ssh.Signer
	now      func() time.Time
	log      *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     gosync.WaitGroup

	git     gosync.Mutex // one push at a time; guards mirror and openFor
	mirror  *sync.Mirror
	openFor string

	mu     gosync.Mutex
	repo   string // the report repository ("" for the spec repository)
	prefix string // the report ref prefix
	// known is the newest copy of each host's shared certificate: read
	// from git, or published here since.
	known map[string]certshare.Sealed
	// pushed is the last copy of each host this node pushed.
	pushed map[string]pushedCopy
	// answers are the HTTP-01 answers of this node's orders in progress,
	// by host and token.
	answers map[string]map[string]string
	// busy are the hosts being published again; failed when that last
	// failed, so that a failing push is retried at most every
	// republishRetry.
	busy   map[string]bool
	failed map[string]time.Time
}

// republishRetry is how often the owner tries again to publish a shared
// certificate whose push failed.
const republishRetry = 30 * time.Second

func newCertPublisher(opts Options, log *slog.Logger) *certPublisher {
	remote := opts.Remote
	remote.Branch, remote.FullHistory = "", false
	ctx, cancel := context.WithCancel(context.Background())
	return &certPublisher{
		node: opts.Node, stateDir: opts.StateDir, remote: remote, timeout: opts.GitTimeout, signer: opts.ReportSigner,
		now: opts.Now, log: log, ctx: ctx, cancel: cancel, prefix: render.DefaultReportRefPrefix,
		known: map[string]certshare.Sealed{}, pushed: map[string]pushedCopy{}, answers: map[string]map[string]string{}, busy: map[string]bool{}, failed: map[string]time.Time{},
	}
}

// close waits for the pushes under way.
func (p *certPublisher) close() {
	p.cancel()
	p.wg.Wait()
}

// setRepo says where certificates go, as the applied commit says.
func (p *certPublisher) setRepo(c render.Cluster) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.repo, p.prefix = c.ReportRepo, cmp.Or(c.ReportRefPrefix, render.DefaultReportRefPrefix)
}

// setKnown takes in the shared certificates read from git, where they are
// newer than what this node published.
func (p *certPublisher) setKnown(shared map[string]sharedCert) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for host, c := range shared {
		if k, ok := p.known[host]; !ok || c.Meta.Published.After(k.Meta.Published) {
			p.known[host] = c.Sealed
		}
	}
}

// forget drops the copy of host's shared certificate it knew (one
// withdrawn).
func (p *certPublisher) forget(host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.known, host)
	delete(p.pushed, host)
}

// pushedCopy is a copy of a shared certificate this node pushed: its
// commit, and when the push ended (the machine's clock: only ever
// compared with when a fetch began).
type pushedCopy struct {
	commit plumbing.Hash
	at     time.Time
}

// lastPushed is the last copy of host's shared certificate this node
// pushed; zero if none.
func (p *certPublisher) lastPushed(host string) pushedCopy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pushed[host]
}

// publishBundle seals b to rs and publishes it, with the HTTP-01 answers
// of the host's order in progress if there is one.
func (p *certPublisher) publishBundle(ctx context.Context, b *providers.Bundle, rs []certshare.Recipient) error {
	s, err := certshare.Seal(b, p.node, rs, p.now())
	if err != nil {
		return err
	}
	p.mu.Lock()
	answers := maps.Clone(p.answers[b.Host])
	p.mu.Unlock()
	if len(answers) > 0 {
		if s, err = s.Republish(p.node, answers, p.now()); err != nil {
			return err
		}
	}
	return p.publish(ctx, s)
}

// challenge publishes the host's shared certificate (or, before its
// first, the host alone) with keyAuth added as the answer to token, or
// with token's answer removed when keyAuth is empty. serving is the
// certificate this node serves for host, sealed to rs, when it shares:
// that is the certificate published (the copy in git, when it is that
// one, else sealed afresh), never another node's copy of another
// certificate under this node's name.
func (p *certPublisher) challenge(ctx context.Context, host, token, keyAuth string, serving *providers.Bundle, rs []certshare.Recipient) error {
	p.mu.Lock()
	if keyAuth == "" {
		delete(p.answers[host], token)
	} else {
		if p.answers[host] == nil {
			p.answers[host] = map[string]string{}
		}
		p.answers[host][token] = keyAuth
	}
	answers := maps.Clone(p.answers[host])
	if len(answers) == 0 {
		delete(p.answers, host)
	}
	base, ok := p.known[host]
	p.mu.Unlock()
	var s certshare.Sealed
	var err error
	switch {
	case serving != nil && (!ok || base.Meta.Certificate == nil || base.Meta.Certificate.Serial != serving.Serial):
		if s, err = certshare.Seal(serving, p.node, rs, p.now()); err == nil {
			s, err = s.Republish(p.node, answers, p.now())
		}
	case ok && base.Meta.Certificate != nil:
		s, err = base.Republish(p.node, answers, p.now())
	default:
		s, err = certshare.ForChallenges(host, p.node, answers, p.now())
	}
	if err != nil {
		return err
	}
	return p.publish(ctx, s)
}

// republish publishes b again, sealed to rs, in a goroutine of its own:
// the loop asks for it when the shared copy is not what this node, the
// owner, serves. A request while one runs, or soon after one failed, is
// dropped: the next pass asks again.
func (p *certPublisher) republish(b *providers.Bundle, rs []certshare.Recipient) {
	p.mu.Lock()
	if p.busy[b.Host] || p.now().Sub(p.failed[b.Host]) < republishRetry || p.ctx.Err() != nil {
		p.mu.Unlock()
		return
	}
	p.busy[b.Host] = true
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.timeout)
		err := p.publishBundle(ctx, b, rs)
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.busy, b.Host)
		if err != nil {
			p.failed[b.Host] = p.now()
			p.log.Warn("publishing the shared certificate; will retry", "host", b.Host, "err", err)
			return
		}
		delete(p.failed, b.Host)
		p.log.Info("shared certificate published", "host", b.Host, "serial", b.Serial, "recipients", len(rs))
	}()
}

// publish pushes s on its host's ref.
func (p *certPublisher) publish(ctx context.Context, s certshare.Sealed) error {
	p.mu.Lock()
	repo, prefix := p.repo, p.prefix
	p.mu.Unlock()
	p.git.Lock()
	defer p.git.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	if key := repo + "\x00" + prefix; key != p.openFor {
		p.mirror, p.openFor = nil, key
	}
	if p.mirror == nil {
		remote, dir := p.remote, "publish-certs"
		if repo != "" {
			remote.URL, dir = repo, "publish-certs-reports"
		}
		m, err := sync.OpenMirror(ctx, filepath.Join(p.stateDir, dir), remote, prefix)
		if err != nil {
			return err
		}
		p.mirror = m
	}
	commit, err := p.mirror.PublishCert(ctx, s, p.signer, p.now())
	if err != nil {
		p.mirror = nil // open it afresh: nothing of a failed push is trusted
		return err
	}
	if p.mirror.NeedsCompaction() {
		if err := p.mirror.Prune(); err != nil {
			p.log.Warn("pruning the certificate publisher's repository", "err", err)
		}
	}
	p.mu.Lock()
	p.pushed[s.Meta.Host] = pushedCopy{commit: commit, at: time.Now()}
	if k, ok := p.known[s.Meta.Host]; !ok || !k.Meta.Published.After(s.Meta.Published) {
		p.known[s.Meta.Host] = s
	}
	p.mu.Unlock()
	return nil
}
