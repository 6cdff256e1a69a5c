package ingress

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httputil"
	"net/netip"
	"path"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/keel-dev/keel/internal/roundrobin"
)

// Route is one Ingress rule: requests for Host whose path is Path or below
// it go to Service's Endpoints.
type Route struct {
	// Host is the exact host name, matched case-insensitively; no port.
	Host string
	// Path is a path prefix, matched by whole segments: "/" (everything),
	// or "/a/b" (itself and everything under "/a/b/"). A trailing slash
	// is dropped.
	Path string
	// Service names the backend, for status and logs.
	Service string
	// Endpoints are the Service's ready endpoints, with the backend port.
	// Empty: requests get 503.
	Endpoints []netip.AddrPort
	// Insecure serves the route over plain HTTP (an Ingress without tls)
	// rather than redirecting to HTTPS. A host is served so when all its
	// routes are.
	Insecure bool
}

// HostStatus is what the ingress serves for one host, for status displays.
type HostStatus struct {
	Host string
	// Certificate reports whether Certs has a certificate for Host now;
	// without one, TLS handshakes for Host fail.
	Certificate bool
	// Routes is the number of path prefixes routed; Endpoints the number
	// of endpoints over all of them.
	Routes, Endpoints int
}

// table is an immutable route table, swapped whole by SetRoutes.
type table struct {
	hosts   map[string]*hostRoutes
	unknown *hostMetrics // requests for hosts not in the table
}

// hostRoutes are one host's routes, longest path first.
type hostRoutes struct {
	name    string
	routes  []*route
	metrics *hostMetrics
	// insecure: every route of the host is Insecure, so the HTTP
	// listener serves it rather than redirecting.
	insecure bool
}

// match returns the route of the longest path prefix that p is, or is
// under; nil if none.
func (h *hostRoutes) match(p string) *route {
	for _, r := range h.routes {
		if r.path == "/" || p == r.path || (strings.HasPrefix(p, r.path) && p[len(r.path)] == '/') {
			return r
		}
	}
	return nil
}

// route is one Route being served: its endpoints, the round-robin counter
// and the reverse proxy that sends requests to them.
type route struct {
	s       *Server
	host    string
	path    string
	service string
	set     *roundrobin.Set
	targets []string // host:port of each endpoint, for request URLs
	next    atomic.Uint64
	proxy   *httputil.ReverseProxy
}

// SetRoutes makes the Server route exactly routes. The table is swapped
// whole and atomically: a request in flight finishes on the endpoint it
// has, the next one sees the new table. Endpoints listed before and after
// keep their passive health.
//
// The returned error lists every route that is invalid or repeats another's
// host and path; the others are applied all the same.
func (s *Server) SetRoutes(routes []Route) error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	var errs []error
	valid := make([]Route, 0, len(routes))
	seen := map[[2]string]bool{}
	for _, r := range routes {
		r, err := normalize(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %s%s (service %q): %w", r.Host, r.Path, r.Service, err))
			continue
		}
		k := [2]string{r.Host, r.Path}
		if seen[k] {
			errs = append(errs, fmt.Errorf("route %s%s (service %q): listed twice; the first is used", r.Host, r.Path, r.Service))
			continue
		}
		seen[k] = true
		valid = append(valid, r)
	}
	if slices.EqualFunc(valid, s.lastRoutes, sameRoute) {
		// The plan is made at every pass: an unchanged table is kept, with
		// its round-robin positions, rather than built again.
		return errors.Join(errs...)
	}
	s.lastRoutes = valid
	old := s.table.Load()
	t := s.newTable(valid, old)
	s.table.Store(t)
	for name, h := range old.hosts {
		if _, ok := t.hosts[name]; !ok {
			h.metrics.forget()
		}
	}
	targets := map[string]bool{}
	for _, h := range t.hosts {
		for _, r := range h.routes {
			for _, tg := range r.targets {
				targets[tg] = true
			}
		}
	}
	s.backend.retain(targets)
	s.log.Debug("ingress routes set", "hosts", len(t.hosts), "routes", len(valid))
	return errors.Join(errs...)
}

// sameRoute reports whether two normalized routes are the same.
func sameRoute(a, b Route) bool {
	return a.Host == b.Host && a.Path == b.Path && a.Service == b.Service && a.Insecure == b.Insecure && slices.Equal(a.Endpoints, b.Endpoints)
}

// normalize checks r and puts its host and path in the form lookups use.
func normalize(r Route) (Route, error) {
	r.Host = strings.ToLower(strings.TrimSuffix(r.Host, "."))
	if r.Host == "" {
		return r, errors.New("empty host")
	}
	for _, c := range r.Host {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return r, fmt.Errorf("host %q: only letters, digits, '-' and '.' (no port)", r.Host)
		}
	}
	if !strings.HasPrefix(r.Path, "/") {
		return r, fmt.Errorf("path %q does not start with /", r.Path)
	}
	r.Path = path.Clean(r.Path)
	for _, ep := range r.Endpoints {
		if !ep.IsValid() || ep.Port() == 0 {
			return r, fmt.Errorf("invalid endpoint %q", ep)
		}
	}
	return r, nil
}

// newTable builds the table of valid routes, carrying over from old (nil
// at the start) each host's metrics and each endpoint's health.
func (s *Server) newTable(routes []Route, old *table) *table {
	t := &table{hosts: map[string]*hostRoutes{}}
	if old != nil {
		t.unknown = old.unknown
	} else {
		t.unknown = s.metrics.forHost("")
	}
	for _, r := range routes {
		h := t.hosts[r.Host]
		if h == nil {
			h = &hostRoutes{name: r.Host, insecure: true}
			if oh := old.host(r.Host); oh != nil {
				h.metrics = oh.metrics
			} else {
				h.metrics = s.metrics.forHost(r.Host)
			}
			t.hosts[r.Host] = h
		}
		var prev *roundrobin.Set
		if oh := old.host(r.Host); oh != nil {
			for _, or := range oh.routes {
				if or.path == r.Path {
					prev = or.set
				}
			}
		}
		h.insecure = h.insecure && r.Insecure
		h.routes = append(h.routes, s.newRoute(r, prev))
	}
	for _, h := range t.hosts {
		slices.SortFunc(h.routes, func(a, b *route) int { return cmp.Compare(len(b.path), len(a.path)) })
	}
	return t
}

func (t *table) host(name string) *hostRoutes {
	if t == nil {
		return nil
	}
	return t.hosts[name]
}

func (s *Server) newRoute(r Route, prev *roundrobin.Set) *route {
	rt := &route{
		s:       s,
		host:    r.Host,
		path:    r.Path,
		service: r.Service,
		set:     roundrobin.NewSet(r.Endpoints, prev),
		targets: make([]string, len(r.Endpoints)),
	}
	for i, ep := range r.Endpoints {
		rt.targets[i] = ep.String()
	}
	// Every node starts its round-robin somewhere else, so that nodes
	// that swapped their tables at once do not all start on the first.
	rt.next.Store(rand.Uint64())
	rt.proxy = &httputil.ReverseProxy{
		Rewrite:      rewrite,
		Transport:    rt,
		ErrorHandler: s.proxyError,
		ErrorLog:     s.errLog,
		BufferPool:   &s.bufs,
	}
	return rt
}

// Hosts returns what is served for each host of the route table, sorted by
// host.
func (s *Server) Hosts() []HostStatus {
	t := s.table.Load()
	out := make([]HostStatus, 0, len(t.hosts))
	for name, h := range t.hosts {
		st := HostStatus{Host: name, Routes: len(h.routes)}
		for _, r := range h.routes {
			st.Endpoints += len(r.targets)
		}
		st.Certificate = s.certs != nil && s.certs.Certificate(name) != nil
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b HostStatus) int { return strings.Compare(a.Host, b.Host) })
	return out
}
