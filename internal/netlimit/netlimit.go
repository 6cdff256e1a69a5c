// Package netlimit bounds what clients of a listening socket can take from
// the process: a listener that holds at most n connections open at once, the
// timeouts and header size of an HTTP server, and the file-descriptor budget
// that keeps the sum of every listener's limits below RLIMIT_NOFILE with a
// reserve left for the process's own work.
package netlimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Listener returns l limited to n connections open at once: Accept waits
// while n accepted connections are open, so further clients wait in the
// kernel's accept queue (or are refused by it) and take no descriptor of
// this process. n must be positive.
//
// One TCP client host (by IP address) holds at most a quarter of the n
// slots (PerHost) at once: a further connection of that host is closed as soon
// as it is accepted, so that one client that opens connections and sends
// nothing (slowloris) cannot lock everyone else out of the port.
func Listener(l net.Listener, n int) net.Listener {
	if n <= 0 {
		panic("netlimit: the connection limit must be positive")
	}
	return &listener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}),
		perHost: PerHost(n), hosts: map[string]int{}}
}

// PerHost is how many of n connections one client host may hold: a
// quarter, or all of them when n is below 8.
func PerHost(n int) int {
	if n < 8 {
		return n
	}
	return n / 4
}

type listener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	perHost int
	mu      sync.Mutex
	hosts   map[string]int // open connections by client IP
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		if host == "" {
			return &conn{Conn: c, release: func() { <-l.sem }}, nil
		}
		l.mu.Lock()
		over := l.hosts[host] >= l.perHost
		if !over {
			l.hosts[host]++
		}
		l.mu.Unlock()
		if over {
			c.Close()
			<-l.sem
			continue
		}
		return &conn{Conn: c, release: func() {
			l.mu.Lock()
			if l.hosts[host]--; l.hosts[host] <= 0 {
				delete(l.hosts, host)
			}
			l.mu.Unlock()
			<-l.sem
		}}, nil
	}
}

// hostOf is the IP address of a TCP client; "" for others (a Unix
// socket's clients are local, and share the plain limit).
func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return ""
}

func (l *listener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// conn gives its slot back once, at the first Close.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// HTTP are the limits of an HTTP server.
type HTTP struct {
	// MaxConns is how many connections it holds open at once.
	MaxConns int
	// HeaderTimeout bounds the reading of a request's headers, from the
	// first byte of a connection or of a keep-alive request.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next
	// request in time.
	IdleTimeout time.Duration
}

// Defaults of the agent's HTTP listeners.
const (
	DefaultMaxConns      = 64
	DefaultHeaderTimeout = 5 * time.Second
	DefaultIdleTimeout   = 30 * time.Second
	// MaxHeaderBytes bounds a request's headers (net/http's default is
	// 1 MiB); the agent's endpoints take no large header.
	MaxHeaderBytes = 16 << 10
)

// Check says what is wrong with h, or nil.
func (h HTTP) Check() error {
	switch {
	case h.MaxConns <= 0:
		return errors.New("the connection limit must be positive")
	case h.HeaderTimeout <= 0:
		return errors.New("the header timeout must be positive")
	case h.IdleTimeout <= 0:
		return errors.New("the idle timeout must be positive")
	}
	return nil
}

// Server returns an http.Server for handler with h's timeouts and header
// size; serve it on Listener(l, h.MaxConns). A request's body and answer
// are bounded too (ReadTimeout, WriteTimeout: a minute each), so that a
// client that reads or writes a byte a minute cannot hold a connection
// beyond them.
func (h HTTP) Server(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: h.HeaderTimeout,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       h.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Serve serves handler on l within h's limits until l is closed, and
// returns the server (for Close).
func (h HTTP) Serve(l net.Listener, handler http.Handler) (*http.Server, <-chan error) {
	srv := h.Server(handler)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(Listener(l, h.MaxConns)) }()
	return srv, done
}

// Budget is a file-descriptor budget: what each consumer may hold at most,
// against the process's RLIMIT_NOFILE, with Reserve kept for the process's
// own work (reconcile passes, git, instance processes, logs).
type Budget struct {
	Reserve int
	uses    []use
}

type use struct {
	what string
	n    int
}

// Add records that what may hold up to n descriptors.
func (b *Budget) Add(what string, n int) { b.uses = append(b.uses, use{what, n}) }

// Total is the sum of the recorded uses and the reserve.
func (b *Budget) Total() int {
	t := b.Reserve
	for _, u := range b.uses {
		t += u.n
	}
	return t
}

// Fit checks the budget against the process's descriptor limit, raising
// the soft limit towards the hard limit when the budget needs it. It
// returns the soft limit in force, and an error naming every use when the
// budget does not fit even under the hard limit.
func (b *Budget) Fit() (limit uint64, err error) {
	soft, hard, err := getNofile()
	if err != nil {
		return 0, fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	need := uint64(b.Total())
	if need <= soft {
		return soft, nil
	}
	if need <= hard {
		if err := setNofile(hard, hard); err == nil {
			return hard, nil
		}
	}
	return soft, b.refusal(soft, hard)
}

// CheckAgainst checks the budget against a given limit (the tests' and
// Fit's rule).
func (b *Budget) CheckAgainst(limit uint64) error {
	if uint64(b.Total()) <= limit {
		return nil
	}
	return b.refusal(limit, limit)
}

func (b *Budget) refusal(soft, hard uint64) error {
	msg := fmt.Sprintf("the connection limits need %d file descriptors (", b.Total())
	for _, u := range b.uses {
		msg += fmt.Sprintf("%s %d + ", u.what, u.n)
	}
	msg += fmt.Sprintf("%d kept for the agent's own work), but the limit is %d (hard limit %d): lower the limits or raise the limit (ulimit -n)", b.Reserve, soft, hard)
	return errors.New(msg)
}
