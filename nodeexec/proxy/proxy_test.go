package proxy

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRoundRobinSpreadsConnections(t *testing.T) {
	m, _ := newManager(t, Options{})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	b := newBackend(t, "b", netip.AddrPort{}, greetEcho)
	c := newBackend(t, "c", netip.AddrPort{}, greetEcho)
	s := newService("web", a.addr(), b.addr(), c.addr())
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 30 {
		order = append(order, reach(t, s))
	}
	for i, n := range order {
		if i >= 3 && n != order[i-3] {
			t.Fatalf("connection %d went to %s, not in round-robin order: %v", i, n, order)
		}
	}
	for _, be := range []*backend{a, b, c} {
		if got := be.accepted.Load(); got != 10 {
			t.Errorf("backend %s accepted %d connections, want 10 (order %v)", be.name, got, order)
		}
	}
}

func TestDeadEndpointIsRetriedOnTheNextAndSkipped(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, clock := newManager(t, Options{Metrics: NewMetrics(reg)})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	b := newBackend(t, "b", netip.AddrPort{}, greetEcho)
	s := newService("web", deadAddr(t), a.addr(), b.addr())
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	dialErrors := func() float64 { return testutil.ToFloat64(m.metrics.dialErrors.WithLabelValues("web")) }

	// The first connection's turn is the dead endpoint: one retry on the
	// next one serves it.
	if got := reach(t, s); got != "a" {
		t.Fatalf("first connection reached %q, want a (the endpoint after the dead one)", got)
	}
	if got := dialErrors(); got != 1 {
		t.Fatalf("dial errors = %v, want 1", got)
	}
	// While it is marked, round-robin skips it.
	for range 9 {
		reach(t, s)
	}
	if got := dialErrors(); got != 1 {
		t.Errorf("dial errors = %v after the dead endpoint was marked, want still 1", got)
	}
	// Once the mark expires it is tried again, and its clients still served.
	clock.advance(DefaultUnhealthyFor + time.Millisecond)
	for range 3 {
		if got := reach(t, s); got != "a" && got != "b" {
			t.Fatalf("reached %q", got)
		}
	}
	if got := dialErrors(); got != 2 {
		t.Errorf("dial errors = %v after the mark expired, want 2", got)
	}
}

func TestClientClosedAtOnceWithoutAHealthyEndpoint(t *testing.T) {
	tests := []struct {
		name       string
		endpoints  func(t *testing.T) []netip.AddrPort
		dialErrors float64
	}{
		{"no endpoints", func(*testing.T) []netip.AddrPort { return nil }, 0},
		{"the only endpoint is dead", func(t *testing.T) []netip.AddrPort { return []netip.AddrPort{deadAddr(t)} }, 1},
		{"all dead: one retry only", func(t *testing.T) []netip.AddrPort {
			return []netip.AddrPort{deadAddr(t), deadAddr(t), deadAddr(t)}
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := newManager(t, Options{Metrics: NewMetrics(prometheus.NewRegistry())})
			s := newService("web", tt.endpoints(t)...)
			if err := m.Set([]Service{s}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if !resetAtOnce(t, s) {
				t.Fatal("the connection was not reset")
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("closed after %v, want at once", d)
			}
			if got := testutil.ToFloat64(m.metrics.dialErrors.WithLabelValues("web")); got != tt.dialErrors {
				t.Errorf("dial errors = %v, want %v", got, tt.dialErrors)
			}
		})
	}
}

// resetAtOnce reports whether a connection to s is reset, when connecting
// (the reset can beat the end of the handshake on loopback) or on reading.
func resetAtOnce(t *testing.T, s Service) bool {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(s.addr()))
	if err != nil {
		t.Logf("dial: %v", err)
		return isReset(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	t.Logf("read: %d, %v", n, err)
	return n == 0 && isReset(err)
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func TestAllMarkedEndpointsAreStillTried(t *testing.T) {
	m, _ := newManager(t, Options{})
	addr := deadAddr(t)
	s := newService("web", addr)
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	if !resetAtOnce(t, s) {
		t.Fatal("served by a dead endpoint")
	}
	// The endpoint is marked (the fake clock never moves) but comes back:
	// with nothing else to try, the proxy tries it anyway.
	newBackend(t, "back", addr, greetEcho)
	if got := reach(t, s); got != "back" {
		t.Fatalf("reached %q, want back", got)
	}
}

func TestHotSwapKeepsConnectionsAndListener(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, _ := newManager(t, Options{Metrics: NewMetrics(reg)})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	b := newBackend(t, "b", netip.AddrPort{}, greetEcho)
	c := newBackend(t, "c", netip.AddrPort{}, greetEcho)
	s := newService("web", a.addr())
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	long, got := connect(t, s)
	if got != "a" {
		t.Fatalf("reached %q, want a", got)
	}
	ln := m.services["web"].ln

	s.Endpoints = []netip.AddrPort{b.addr(), c.addr()}
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	if m.services["web"].ln != ln {
		t.Error("the listener was replaced by an endpoint change")
	}
	seen := map[string]int{}
	for range 6 {
		seen[reach(t, s)]++
	}
	if seen["a"] != 0 || seen["b"] != 3 || seen["c"] != 3 {
		t.Errorf("new connections went to %v, want 3 each to b and c", seen)
	}
	long.echo(t, "still there")
	if got := testutil.ToFloat64(m.metrics.endpoints.WithLabelValues("web")); got != 2 {
		t.Errorf("keel_proxy_endpoints = %v, want 2", got)
	}
}

func TestRemovedServiceClosesItsListenerOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, _ := newManager(t, Options{Metrics: NewMetrics(reg)})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	web, api := newService("web", a.addr()), newService("api", a.addr())
	if err := m.Set([]Service{web, api}); err != nil {
		t.Fatal(err)
	}
	long, _ := connect(t, web)

	if err := m.Set([]Service{api}); err != nil {
		t.Fatal(err)
	}
	if !refused(web) {
		t.Error("the removed service still accepts connections")
	}
	if got := reach(t, api); got != "a" {
		t.Errorf("the remaining service reached %q", got)
	}
	long.echo(t, "established connections may finish")
	long.c.Close()
	waitFor(t, "the drained connection to leave the active gauge", func() bool {
		return testutil.ToFloat64(m.metrics.active.WithLabelValues("web")) == 0
	})
	if n, err := testutil.GatherAndCount(reg, "keel_proxy_endpoints"); err != nil || n != 1 {
		t.Errorf("keel_proxy_endpoints has %d series (%v), want only api's", n, err)
	}
}

func TestAddressChangeReplacesListener(t *testing.T) {
	m, _ := newManager(t, Options{})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	s := newService("web", a.addr())
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	long, _ := connect(t, s)
	moved := s
	moved.Port = s.Port + 1
	if err := m.Set([]Service{moved}); err != nil {
		t.Fatal(err)
	}
	if !refused(s) {
		t.Error("the old port still accepts connections")
	}
	if got := reach(t, moved); got != "a" {
		t.Errorf("the new port reached %q", got)
	}
	long.echo(t, "kept")
}

func TestTwoManagersShareAVIPWithReusePort(t *testing.T) {
	m1, _ := newManager(t, Options{})
	m2, _ := newManager(t, Options{})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	b := newBackend(t, "b", netip.AddrPort{}, greetEcho)
	s1 := newService("web", a.addr())
	s2 := s1
	s2.Endpoints = []netip.AddrPort{b.addr()}
	if err := m1.Set([]Service{s1}); err != nil {
		t.Fatal(err)
	}
	if err := m2.Set([]Service{s2}); err != nil {
		t.Fatalf("second listener on the same VIP:port: %v", err)
	}
	// The kernel hashes each connection to one listener: 40 connections all
	// landing on one has probability 2^-39.
	seen := map[string]int{}
	for range 40 {
		seen[reach(t, s1)]++
	}
	if seen["a"] == 0 || seen["b"] == 0 {
		t.Errorf("connections went to %v, want both managers to serve", seen)
	}
}

func TestHalfClose(t *testing.T) {
	payload := make([]byte, 256<<10)
	rand.Read(payload)

	t.Run("client closes its write side and reads the whole response", func(t *testing.T) {
		m, _ := newManager(t, Options{})
		// The backend answers only after the end of the request: without
		// the half-close relayed, it would wait forever.
		be := newBackend(t, "collect", netip.AddrPort{}, func(_ *backend, c *net.TCPConn) {
			req, err := io.ReadAll(c)
			if err != nil {
				return
			}
			c.Write(bytes.Repeat(req, 4))
			c.CloseWrite()
		})
		s := newService("web", be.addr())
		if err := m.Set([]Service{s}); err != nil {
			t.Fatal(err)
		}
		c := dial(t, s)
		if _, err := c.Write(payload); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, bytes.Repeat(payload, 4)) {
			t.Fatalf("got %d bytes, want the %d-byte response", len(got), 4*len(payload))
		}
	})

	t.Run("backend closes its write side and still reads the request", func(t *testing.T) {
		m, _ := newManager(t, Options{})
		received := make(chan int, 1)
		be := newBackend(t, "banner", netip.AddrPort{}, func(_ *backend, c *net.TCPConn) {
			io.WriteString(c, "hello")
			c.CloseWrite()
			n, _ := io.Copy(io.Discard, c)
			received <- int(n)
		})
		s := newService("web", be.addr())
		if err := m.Set([]Service{s}); err != nil {
			t.Fatal(err)
		}
		c := dial(t, s)
		banner, err := io.ReadAll(c)
		if err != nil || string(banner) != "hello" {
			t.Fatalf("banner %q, %v", banner, err)
		}
		if _, err := c.Write(payload); err != nil {
			t.Fatalf("write after the backend's half-close: %v", err)
		}
		c.CloseWrite()
		select {
		case n := <-received:
			if n != len(payload) {
				t.Errorf("backend received %d bytes, want %d", n, len(payload))
			}
		case <-time.After(5 * time.Second):
			t.Fatal("backend never saw the end of the request")
		}
	})
}

func TestSetReportsListenFailuresAndRetriesThem(t *testing.T) {
	m, _ := newManager(t, Options{})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	bad, good := newService("bad", a.addr()), newService("good", a.addr())
	// A listener without SO_REUSEPORT holds bad's address.
	blocker, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(bad.addr()))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Set([]Service{bad, good})
	if err == nil || !strings.Contains(err.Error(), `"bad"`) || strings.Contains(err.Error(), `"good"`) {
		t.Fatalf("Set = %v, want an error naming bad only", err)
	}
	if got := reach(t, good); got != "a" {
		t.Errorf("good reached %q", got)
	}
	blocker.Close()
	if err := m.Set([]Service{bad, good}); err != nil {
		t.Fatalf("second Set = %v, want the listener opened", err)
	}
	if got := reach(t, bad); got != "a" {
		t.Errorf("bad reached %q after the retry", got)
	}
}

func TestSetRejectsInvalidServices(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:9")
	tests := []struct {
		name    string
		edit    func(s Service, other Service) []Service
		wantErr string
	}{
		{"empty name", func(s, o Service) []Service { s.Name = ""; return []Service{s, o} }, "empty name"},
		{"no VIP", func(s, o Service) []Service { s.VIP = netip.Addr{}; return []Service{s, o} }, "no VIP"},
		{"port 0", func(s, o Service) []Service { s.Port = 0; return []Service{s, o} }, "port 0"},
		{"port too high", func(s, o Service) []Service { s.Port = 70000; return []Service{s, o} }, "port 70000"},
		{"endpoint without port", func(s, o Service) []Service {
			s.Endpoints = []netip.AddrPort{netip.AddrPortFrom(a.Addr(), 0)}
			return []Service{s, o}
		}, "invalid endpoint"},
		{"name twice", func(s, o Service) []Service { s.Name = o.Name; return []Service{o, s} }, "listed twice"},
		{"address twice", func(s, o Service) []Service { s.VIP, s.Port = o.VIP, o.Port; return []Service{s, o} }, "already"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := newManager(t, Options{})
			be := newBackend(t, "a", netip.AddrPort{}, greetEcho)
			bad, other := newService("bad", be.addr()), newService("other", be.addr())
			err := m.Set(tt.edit(bad, other))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Set = %v, want an error containing %q", err, tt.wantErr)
			}
			if got := reach(t, other); got != "a" {
				t.Errorf("the valid service reached %q", got)
			}
		})
	}

	t.Run("an invalid update keeps the running service", func(t *testing.T) {
		m, _ := newManager(t, Options{})
		be := newBackend(t, "a", netip.AddrPort{}, greetEcho)
		s := newService("web", be.addr())
		if err := m.Set([]Service{s}); err != nil {
			t.Fatal(err)
		}
		broken := s
		broken.Port = 0
		if err := m.Set([]Service{broken}); err == nil {
			t.Fatal("Set accepted port 0")
		}
		if got := reach(t, s); got != "a" {
			t.Errorf("reached %q", got)
		}
	})
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, _ := newManager(t, Options{Metrics: NewMetrics(reg)})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	web := newService("web", deadAddr(t), a.addr())
	if err := m.Set([]Service{web, newService("empty")}); err != nil {
		t.Fatal(err)
	}
	reach(t, web) // the dead endpoint, then a
	reach(t, web) // a: the dead one is skipped
	open, _ := connect(t, web)
	waitFor(t, "the closed connections to end", func() bool {
		return testutil.ToFloat64(m.metrics.active.WithLabelValues("web")) == 1
	})

	const want = `
# HELP keel_proxy_active_connections Client connections the service proxy holds open now.
# TYPE keel_proxy_active_connections gauge
keel_proxy_active_connections{service="empty"} 0
keel_proxy_active_connections{service="web"} 1
# HELP keel_proxy_connections_total Client connections accepted by the service proxy.
# TYPE keel_proxy_connections_total counter
keel_proxy_connections_total{service="empty"} 0
keel_proxy_connections_total{service="web"} 3
# HELP keel_proxy_dial_errors_total Failed connection attempts from the service proxy to an endpoint.
# TYPE keel_proxy_dial_errors_total counter
keel_proxy_dial_errors_total{service="empty"} 0
keel_proxy_dial_errors_total{service="web"} 1
# HELP keel_proxy_endpoints Endpoints of a service the proxy listens for.
# TYPE keel_proxy_endpoints gauge
keel_proxy_endpoints{service="empty"} 0
keel_proxy_endpoints{service="web"} 2
# HELP keel_proxy_rejected_total Client connections the service proxy reset because every service together held the connection limit.
# TYPE keel_proxy_rejected_total counter
keel_proxy_rejected_total{service="empty"} 0
keel_proxy_rejected_total{service="web"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	open.c.Close()
}

func TestCloseEndsEverything(t *testing.T) {
	m, _ := newManager(t, Options{})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	s := newService("web", a.addr())
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	var open []greeted
	for range 5 {
		g, _ := connect(t, s)
		open = append(open, g)
	}
	// A connection that half-closed and waits for its response.
	open[0].c.CloseWrite()

	done := make(chan struct{})
	go func() {
		m.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	checkNoGoroutines(t)
	for i, g := range open {
		g.c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadAll(g.r); err != nil && !isReset(err) {
			t.Errorf("connection %d after Close: %v, want it closed", i, err)
		}
	}
	if !refused(s) {
		t.Error("listener still open after Close")
	}
	if err := m.Set([]Service{s}); !errors.Is(err, ErrClosed) {
		t.Errorf("Set after Close = %v, want ErrClosed", err)
	}
	m.Close() // twice is fine
}
