package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A Service holds at most MaxConnsPerService clients: the next one waits in
// the kernel's queue, and is served as soon as a slot frees.
func TestPerServiceLimitQueuesClients(t *testing.T) {
	m, _ := newManager(t, Options{Limits: Limits{MaxConnsPerService: 2}})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	s := newService("web", a.addr())
	if err := m.Set([]Service{s}); err != nil {
		t.Fatal(err)
	}
	first, _ := connect(t, s)
	second, _ := connect(t, s)
	third := dial(t, s) // accepted by the kernel, not by the proxy
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 2)
		_, err := io.ReadFull(third, b)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(b)
	}()
	waitFor(t, "two connections relayed", func() bool { return a.accepted.Load() == 2 })
	select {
	case g := <-got:
		t.Fatalf("the third client was served (%q) while the first two held the limit", g)
	case <-time.After(200 * time.Millisecond):
	}
	if n := a.accepted.Load(); n != 2 {
		t.Fatalf("the backend accepted %d connections with a limit of 2", n)
	}
	first.c.Close()
	select {
	case g := <-got:
		if g != "a\n" {
			t.Fatalf("the third client got %q, want the greeting", g)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the third client was not served once a slot was free")
	}
	second.echo(t, "still relayed")
}

// Over MaxConns, all Services together, a client is reset at once and
// counted; once a connection ends, clients are served again.
func TestTotalLimitResetsClients(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, _ := newManager(t, Options{Metrics: NewMetrics(reg), Limits: Limits{MaxConns: 2, MaxConnsPerService: 10}})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	web, api := newService("web", a.addr()), newService("api", a.addr())
	if err := m.Set([]Service{web, api}); err != nil {
		t.Fatal(err)
	}
	g1, _ := connect(t, web)
	g2, _ := connect(t, api)
	// The reset may come before the dial returns, or at the first read.
	if c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(api.addr())); err == nil {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		n, err := c.Read(make([]byte, 8))
		c.Close()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a client over the total limit read %d bytes (%v)", n, err)
		}
	}
	waitFor(t, "the reset client to be counted", func() bool {
		return testutil.ToFloat64(m.metrics.rejected.WithLabelValues("api")) == 1
	})
	g1.c.Close()
	waitFor(t, "the closed connection to free its slot", func() bool {
		return testutil.ToFloat64(m.metrics.active.WithLabelValues("web")) == 0
	})
	if got := reach(t, api); got != "a" {
		t.Fatalf("reached %q", got)
	}
	g2.echo(t, "still relayed")
}

// A relayed connection on which nobody sends anything for IdleTimeout is
// closed; one where only one side talks is not.
func TestIdleTimeoutClosesQuietConnections(t *testing.T) {
	const idle = 2 * time.Second
	m, _ := newManager(t, Options{Limits: Limits{IdleTimeout: idle}})
	a := newBackend(t, "a", netip.AddrPort{}, greetEcho)
	sink := newBackend(t, "sink", netip.AddrPort{}, func(_ *backend, c *net.TCPConn) { _, _ = io.Copy(io.Discard, c) })
	s, quiet := newService("web", a.addr()), newService("sink", sink.addr())
	if err := m.Set([]Service{s, quiet}); err != nil {
		t.Fatal(err)
	}
	// One side talks, for longer than the idle timeout.
	talker := dial(t, quiet)
	deadline := time.Now().Add(3 * idle)
	for time.Now().Before(deadline) {
		if _, err := talker.Write([]byte("x")); err != nil {
			t.Fatalf("a connection where the client talks was closed: %v", err)
		}
		time.Sleep(idle / 20)
	}
	if _, err := talker.Write([]byte("x")); err != nil {
		t.Fatalf("a connection where the client talks was closed: %v", err)
	}
	// Nobody talks: closed after the timeout (the read ends with EOF or a
	// reset, not with the test's own deadline).
	g, _ := connect(t, s)
	start := time.Now()
	g.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := g.r.ReadByte()
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle connection was not closed: %v", err)
	}
	if took := time.Since(start); took < idle/2 {
		t.Fatalf("an idle connection was closed after %s, before the idle timeout %s", took, idle)
	}
}
