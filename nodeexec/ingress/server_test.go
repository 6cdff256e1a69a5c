package ingress

import (
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Requests are counted by routed host and code, any other Host as "";
// a host that leaves the table takes its series along; connections open
// are counted on both listeners.
func TestMetrics(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	reg := prometheus.NewRegistry()
	s := newServer(t, Options{Certs: newCertStore(t, "web.test", "api.test"), Metrics: NewMetrics(reg)})
	routes := []Route{
		{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}},
		{Host: "api.test", Path: "/", Service: "api"},
	}
	if err := s.SetRoutes(routes); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, true)
	for _, r := range []struct {
		url, host string
		code      int
	}{
		{"https://web.test/", "", 200},
		{"https://web.test/x", "", 200},
		{"https://api.test/", "", 503},
		{"https://web.test/", "made-up-1.test", 404},
		{"https://web.test/", "made-up-2.test", 404},
		{"http://web.test/", "", 308},
	} {
		var hdr []string
		if r.host != "" {
			hdr = []string{"Host", r.host}
		}
		if code, body := get(t, c, r.url, hdr...); code != r.code {
			t.Fatalf("%s (Host %q): %d %q, want %d", r.url, r.host, code, body, r.code)
		}
	}
	want := `
# HELP keel_ingress_requests_total Requests the ingress answered, by host ("" for hosts not routed) and status code.
# TYPE keel_ingress_requests_total counter
keel_ingress_requests_total{code="404",host=""} 2
keel_ingress_requests_total{code="503",host="api.test"} 1
keel_ingress_requests_total{code="200",host="web.test"} 2
keel_ingress_requests_total{code="308",host="web.test"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "keel_ingress_requests_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(s.metrics.duration, "keel_ingress_request_duration_seconds"); n != 3 {
		t.Errorf("%d duration series, want 3 (web.test, api.test, \"\")", n)
	}

	// api.test leaves the table: its series go; web.test's stay.
	if err := s.SetRoutes(routes[:1]); err != nil {
		t.Fatal(err)
	}
	get(t, c, "https://web.test/")
	want = strings.Replace(want, "keel_ingress_requests_total{code=\"503\",host=\"api.test\"} 1\n", "", 1)
	want = strings.Replace(want, `{code="200",host="web.test"} 2`, `{code="200",host="web.test"} 3`, 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "keel_ingress_requests_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(s.metrics.duration, "keel_ingress_request_duration_seconds"); n != 2 {
		t.Errorf("%d duration series after api.test left, want 2", n)
	}

	// Connections, both listeners together.
	c.Transport.(*http.Transport).CloseIdleConnections()
	waitFor(t, "the active connections to fall to 0", func() bool { return testutil.ToFloat64(s.metrics.active) == 0 })
	tc, _ := rawHTTP1(t, s, "web.test")
	pc, err := net.Dial("tcp", s.HTTPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "2 active connections", func() bool { return testutil.ToFloat64(s.metrics.active) == 2 })
	tc.Close()
	pc.Close()
	waitFor(t, "the active connections to fall to 0", func() bool { return testutil.ToFloat64(s.metrics.active) == 0 })
}

// Hosts lists each routed host with whether it has a certificate.
func TestHosts(t *testing.T) {
	checkLeaks(t)
	eps := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:2")}
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	err := s.SetRoutes([]Route{
		{Host: "web.test", Path: "/", Service: "web", Endpoints: eps},
		{Host: "web.test", Path: "/api", Service: "api", Endpoints: eps[:1]},
		{Host: "nocert.test", Path: "/", Service: "web"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []HostStatus{
		{Host: "nocert.test", Certificate: false, Routes: 1, Endpoints: 0},
		{Host: "web.test", Certificate: true, Routes: 2, Endpoints: 3},
	}
	if got := s.Hosts(); !reflect.DeepEqual(got, want) {
		t.Errorf("Hosts() = %+v, want %+v", got, want)
	}
}

// Invalid routes are reported, and the valid ones applied.
func TestSetRoutesReportsInvalidRoutes(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	ep := []netip.AddrPort{a.addr()}
	err := s.SetRoutes([]Route{
		{Host: "web.test", Path: "/", Service: "web", Endpoints: ep},
		{Host: "web.test", Path: "/", Service: "again", Endpoints: ep},
		{Host: "", Path: "/", Service: "nohost"},
		{Host: "web.test:443", Path: "/", Service: "port"},
		{Host: "x.test", Path: "api", Service: "relative"},
		{Host: "y.test", Path: "/", Service: "badep", Endpoints: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)}},
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`"again"`, `"nohost"`, `"port"`, `"relative"`, `"badep"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), `"web"`) {
		t.Errorf("the error names the valid route: %v", err)
	}
	if code, body := get(t, newClient(t, s, true), "https://web.test/"); code != 200 || field(body, "backend") != "a" {
		t.Errorf("the valid route is not served: %d %q", code, body)
	}
	if hs := s.Hosts(); len(hs) != 1 || hs[0].Host != "web.test" {
		t.Errorf("Hosts() = %+v", hs)
	}
}

// Close lets a request in flight finish, refuses new connections at once,
// and returns once everything is closed.
func TestCloseLetsRequestsInFlightFinish(t *testing.T) {
	checkLeaks(t)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.Write([]byte("backend=slow\n"))
	})
	s := newServer(t, Options{Certs: newCertStore(t, "web.test")})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{slow.addr()}}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, true)
	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, body, err := do(c, "https://web.test/")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{code: res.StatusCode, body: body}
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	waitFor(t, "the listener to refuse connections", func() bool {
		_, _, err := do(newClient(t, s, false), "https://web.test/")
		return err != nil
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was in flight", err)
	default:
	}
	close(release)
	r := <-done
	if r.err != nil || r.code != 200 || field(r.body, "backend") != "slow" {
		t.Fatalf("the request in flight got %d %q %v", r.code, r.body, r.err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// A request still in flight when the grace ends is cut, and Close says so.
func TestCloseCutsRequestsAfterTheGrace(t *testing.T) {
	checkLeaks(t)
	entered := make(chan struct{}, 1)
	stuck := newBackend(t, "stuck", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done()
	})
	s := newServer(t, Options{Certs: newCertStore(t, "web.test"), Limits: Limits{Grace: 200 * time.Millisecond}})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{stuck.addr()}}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, false)
	done := make(chan error, 1)
	go func() {
		_, _, err := do(c, "https://web.test/")
		done <- err
	}()
	<-entered
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), "grace") {
		t.Fatalf("Close = %v, want the grace exceeded", err)
	}
	if err := <-done; err == nil {
		t.Fatal("the cut request got an answer")
	}
}

// canonicalHost never panics; a name with a port and any case is the name
// in lower case.
func FuzzCanonicalHost(f *testing.F) {
	for _, s := range []string{"web.test", "WEB.test:443", "[::1]:80", "::1", "a.b.", "", ":", "[", "]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got := canonicalHost(h)
		if strings.ToLower(got) != got {
			t.Fatalf("canonicalHost(%q) = %q: not lower case", h, got)
		}
		if strings.ContainsAny(h, ":[]") {
			return
		}
		if with := canonicalHost(strings.ToUpper(h) + ":8443"); with != got {
			t.Fatalf("canonicalHost(%q) = %q but with a port and upper case %q", h, got, with)
		}
	})
}

// The agent sets the routes at every pass: the same routes keep the table
// in use (and its round-robin positions); other routes replace it.
func TestSetRoutesUnchangedKeepsTheTable(t *testing.T) {
	checkLeaks(t)
	eps := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:2")}
	s := newServer(t, Options{})
	routes := func() []Route {
		return []Route{{Host: "Web.test", Path: "/", Service: "web", Endpoints: slices.Clone(eps)}}
	}
	if err := s.SetRoutes(routes()); err != nil {
		t.Fatal(err)
	}
	first := s.table.Load()
	if err := s.SetRoutes(routes()); err != nil {
		t.Fatal(err)
	}
	if s.table.Load() != first {
		t.Fatal("the same routes built a new table")
	}
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: eps[:1]}}); err != nil {
		t.Fatal(err)
	}
	if s.table.Load() == first {
		t.Fatal("other endpoints kept the old table")
	}
}
