package probe

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// logWriter sends the prober's log lines to the test's log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// newProber returns a Prober closed when the test ends.
func newProber(t *testing.T, opts Options) *Prober {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logWriter{t}, nil))
	}
	p := New(opts)
	t.Cleanup(p.Close)
	return p
}

var loopback = netip.MustParseAddr("127.0.0.1")

// waitFor polls the named target's status until cond holds, and returns
// it.
func waitFor(t *testing.T, p *Prober, name, what string, cond func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for interval := time.Millisecond; ; interval = min(2*interval, 20*time.Millisecond) {
		s, ok := p.Status(name)
		if ok && cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out waiting until %s; status %+v, %v", name, what, s, ok)
		}
		time.Sleep(interval)
	}
}

func isReady(s Status) bool { return s.Ready }

// listen returns a TCP listener on 127.0.0.1, accepting and closing
// connections, closed when the test ends.
func listen(t *testing.T) (net.Listener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// closedPort returns a port of 127.0.0.1 on which nothing listens.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

func tcpCheck(port int) *render.Check {
	return &render.Check{TCP: &render.TCPCheck{Port: port}, Period: render.Duration(50 * time.Millisecond)}
}

func execCheck(argv ...string) *render.Check {
	return &render.Check{Exec: &render.ExecCheck{Command: argv}, Period: render.Duration(20 * time.Millisecond),
		Timeout: render.Duration(10 * time.Second)}
}

// execer is a nodeexec.Execer whose programs are functions of argv[0]; it
// counts the runs in flight and the most there were at once.
type execer struct {
	mu       sync.Mutex
	programs map[string]func(ctx context.Context) (int, []byte, error)
	calls    map[string]int
	inFlight atomic.Int64
	most     atomic.Int64
}

func newExecer() *execer {
	return &execer{programs: map[string]func(context.Context) (int, []byte, error){}, calls: map[string]int{}}
}

var _ nodeexec.Execer = (*execer)(nil)

// set makes argv0 run f.
func (e *execer) set(argv0 string, f func(ctx context.Context) (int, []byte, error)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.programs[argv0] = f
}

// exit makes argv0 exit with code and output.
func (e *execer) exit(argv0 string, code int, output string) {
	e.set(argv0, func(context.Context) (int, []byte, error) { return code, []byte(output), nil })
}

func (e *execer) count(argv0 string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[argv0]
}

func (e *execer) Exec(ctx context.Context, name string, argv []string, maxOutput int) (int, []byte, error) {
	n := e.inFlight.Add(1)
	defer e.inFlight.Add(-1)
	for m := e.most.Load(); n > m && !e.most.CompareAndSwap(m, n); m = e.most.Load() {
	}
	e.mu.Lock()
	f := e.programs[argv[0]]
	e.calls[argv[0]]++
	e.mu.Unlock()
	if f == nil {
		return -1, nil, context.Canceled // never expected
	}
	code, out, err := f(ctx)
	if ctx.Err() != nil {
		return -1, nil, ctx.Err()
	}
	return code, out[:min(len(out), maxOutput)], err
}

// hang is a program that runs until its context ends.
func hang(ctx context.Context) (int, []byte, error) {
	<-ctx.Done()
	return -1, nil, ctx.Err()
}

// stepper is a nodeexec.Execer whose every run waits for the test to
// give its result: the test drives a check run by run.
type stepper struct{ calls chan chan result }

type result struct {
	code int
	out  string
}

func newStepper() *stepper { return &stepper{calls: make(chan chan result)} }

func (s *stepper) Exec(ctx context.Context, name string, argv []string, maxOutput int) (int, []byte, error) {
	reply := make(chan result)
	select {
	case s.calls <- reply:
	case <-ctx.Done():
		return -1, nil, ctx.Err()
	}
	select {
	case r := <-reply:
		return r.code, []byte(r.out), nil
	case <-ctx.Done():
		return -1, nil, ctx.Err()
	}
}

// next waits until the next run has begun (so the previous one has been
// recorded), and returns its reply channel.
func (s *stepper) next(t *testing.T) chan result {
	t.Helper()
	select {
	case reply := <-s.calls:
		return reply
	case <-time.After(15 * time.Second):
		t.Fatal("timed out waiting for a run")
		return nil
	}
}

// eventually polls cond until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// gate is a program that passes while the gate is open and otherwise
// waits until it opens (or its run's context ends).
type gate struct {
	mu sync.Mutex
	ch chan struct{}
}

func newGate() *gate {
	g := &gate{ch: make(chan struct{})}
	close(g.ch)
	return g
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.ch:
	default:
		close(g.ch)
	}
}

func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.ch:
		g.ch = make(chan struct{})
	default:
	}
}

func (g *gate) program(ctx context.Context) (int, []byte, error) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	select {
	case <-ch:
		return 0, nil, nil
	case <-ctx.Done():
		return -1, nil, ctx.Err()
	}
}
