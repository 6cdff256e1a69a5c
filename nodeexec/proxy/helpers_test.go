package proxy

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/loopnet"
)

// Tests in this package do not call t.Parallel: each checks, when its
// Managers close, that no goroutine of any Manager is left.

// randomVIP returns a random address of the two /16s of 127.0.0.0/8 this
// test process holds (Linux answers all of 127.0.0.0/8 on loopback without
// configuration): other packages' tests, run in parallel, hold others.
func randomVIP() netip.Addr {
	vipOnce.Do(func() {
		vipPair, vipErr = loopnet.Reserve() // held until the process ends
	})
	if vipErr != nil {
		panic(vipErr)
	}
	b := vipPair.A.Addr().As4()
	return netip.AddrFrom4([4]byte{127, b[1] + byte(rand.IntN(2)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

var (
	vipOnce sync.Once
	vipPair *loopnet.Pair
	vipErr  error
)

// randomPort returns a port below Linux's ephemeral range, so that no
// outgoing connection of this machine holds it.
func randomPort() int { return 20000 + rand.IntN(12000) }

// newService returns a Service on a random VIP and port.
func newService(name string, eps ...netip.AddrPort) Service {
	return Service{Name: name, VIP: randomVIP(), Port: randomPort(), Endpoints: eps}
}

// testLogger writes the Manager's log to t.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// fakeClock drives the Manager's passive-health clock.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() int64              { return c.ns.Load() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// newManager returns a Manager logging to t, closed when the test ends,
// after which no goroutine of the package may remain.
func newManager(t *testing.T, opts Options) (*Manager, *fakeClock) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	checkedMu.Lock()
	if !checked[t] {
		checked[t] = true
		// Registered before the first Manager's Close, so it runs after
		// every Manager of the test is closed.
		t.Cleanup(func() {
			checkNoGoroutines(t)
			checkedMu.Lock()
			delete(checked, t)
			checkedMu.Unlock()
		})
	}
	checkedMu.Unlock()
	m := New(opts)
	clock := &fakeClock{}
	m.now = clock.now
	t.Cleanup(m.Close)
	return m, clock
}

// checked holds the tests whose goroutine check is registered.
var (
	checkedMu sync.Mutex
	checked   = map[*testing.T]bool{}
)

// checkNoGoroutines fails t if a goroutine started by a Manager is still
// there. Close has waited for them, but a goroutine that has just run its
// deferred WaitGroup.Done may still be on its way out, hence the wait.
func checkNoGoroutines(t *testing.T) {
	t.Helper()
	var leaked []string
	deadline := time.Now().Add(2 * time.Second)
	for {
		leaked = managerGoroutines()
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	t.Errorf("%d goroutines of a closed Manager left:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
}

func managerGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "nodeexec/proxy.(*Manager)") || strings.Contains(g, "nodeexec/proxy.pipe") {
			out = append(out, g)
		}
	}
	return out
}

// backend is a real TCP server on a random loopback address.
type backend struct {
	name     string
	ln       *net.TCPListener
	accepted atomic.Int64
	mu       sync.Mutex
	conns    map[*net.TCPConn]bool
	wg       sync.WaitGroup
}

// greetEcho writes the backend's name on a line, then echoes until the
// client half-closes, then closes.
func greetEcho(b *backend, c *net.TCPConn) {
	if _, err := io.WriteString(c, b.name+"\n"); err != nil {
		return
	}
	if _, err := io.Copy(c, c); err == nil {
		c.CloseWrite()
	}
}

// newBackend starts a backend serving each connection with handle (closing
// it afterwards) at addr, or at a random address when addr is invalid.
func newBackend(t testing.TB, name string, addr netip.AddrPort, handle func(*backend, *net.TCPConn)) *backend {
	t.Helper()
	if !addr.IsValid() {
		addr = netip.AddrPortFrom(randomVIP(), 0)
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, ln: ln, conns: map[*net.TCPConn]bool{}}
	b.wg.Go(func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			b.mu.Lock()
			b.conns[c] = true
			b.mu.Unlock()
			b.wg.Go(func() {
				defer func() {
					c.Close()
					b.mu.Lock()
					delete(b.conns, c)
					b.mu.Unlock()
				}()
				handle(b, c)
			})
		}
	})
	t.Cleanup(b.close)
	return b
}

func (b *backend) addr() netip.AddrPort { return b.ln.Addr().(*net.TCPAddr).AddrPort() }

func (b *backend) close() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// deadAddr returns a loopback address where nothing listens: connecting
// is refused at once.
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(randomVIP(), 0)))
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// dial connects to s's VIP:port, closed when the test ends.
func dial(t testing.TB, s Service) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(s.addr()))
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// greeting reads the backend's name from a fresh connection through s.
type greeted struct {
	c *net.TCPConn
	r *bufio.Reader
}

func connect(t testing.TB, s Service) (greeted, string) {
	t.Helper()
	c := dial(t, s)
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading greeting through %s: %v", s.Name, err)
	}
	return greeted{c, r}, strings.TrimSuffix(line, "\n")
}

// reach returns the name of the backend a new connection through s reaches.
func reach(t testing.TB, s Service) string {
	t.Helper()
	g, n := connect(t, s)
	g.c.Close()
	return n
}

// echo checks that g still relays both ways.
func (g greeted) echo(t *testing.T, msg string) {
	t.Helper()
	if _, err := io.WriteString(g.c, msg+"\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := g.r.ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Fatalf("echo %q: got %q, %v", msg, got, err)
	}
}

// refused reports whether connecting to s's VIP:port is refused.
func refused(s Service) bool {
	c, err := net.DialTimeout("tcp", s.addr().String(), time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// waitFor polls cond until it holds, failing t after half a minute (a
// generous deadline: the machine may be busy).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
