package ingress

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// backendClient is the ingress's HTTP/1.1 client to backends: one request
// at a time per connection, written and read by the handler's own
// goroutine, with idle connections kept per endpoint for the next request.
//
// It replaces http.Transport, which cost the ingress about a sixth of its
// CPU per proxied request (a reader and a writer goroutine per connection,
// and the hand-offs between them and the handler), and whose connection
// pool, HTTP/2 and proxy support the ingress does not need. The framing is
// net/http's own: requests are written by http.Request.Write and answers
// parsed by http.ReadResponse.
//
// Its methods are safe for concurrent use. It starts no goroutine of its
// own; a request whose context ends has its connection's deadline set from
// a context.AfterFunc callback, which is waited for before the connection
// is reused or the request returns.
type backendClient struct {
	dialer        net.Dialer
	headerTimeout time.Duration
	idleTimeout   time.Duration
	maxIdle       int
	maxPerTarget  int

	mu     sync.Mutex
	idle   map[string][]*backendConn // per target, most recently used last
	nidle  int
	closed bool
}

// backendIdleTimeout is how long an idle backend connection is kept.
const backendIdleTimeout = 90 * time.Second

func newBackendClient(l Limits) *backendClient {
	return &backendClient{
		dialer:        net.Dialer{Timeout: l.DialTimeout, KeepAlive: 30 * time.Second},
		headerTimeout: l.BackendTimeout,
		idleTimeout:   backendIdleTimeout,
		maxIdle:       l.BackendIdleConns,
		maxPerTarget:  l.BackendIdlePerTarget,
		idle:          map[string][]*backendConn{},
	}
}

// backendConn is one connection to a backend.
type backendConn struct {
	c         net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	target    string
	idleSince time.Time
	// cancel holds the AfterFunc callback of the request in flight, so
	// that it has ended before the connection is reused.
	cancel sync.WaitGroup
}

// aLongTimeAgo is a deadline in the past: blocked reads and writes return
// at once.
var aLongTimeAgo = time.Unix(1, 0)

const backendBufferSize = 8 << 10

// errNoAnswer is a reused connection that closed before the first byte of
// an answer: the backend closed it while idle, and did not see the request.
type errNoAnswer struct{ err error }

func (e *errNoAnswer) Error() string { return "backend closed the connection: " + e.err.Error() }
func (e *errNoAnswer) Unwrap() error { return e.err }

// RoundTrip sends req to req.URL.Host on a kept-alive connection, or a new
// one (whose failure is a *dialError). A request that can be sent again
// (no body, an idempotent method) is, once, on a new connection, when the
// reused one turns out to have been closed by the backend; before sending a
// request with a body on a reused connection, the connection is checked.
func (b *backendClient) RoundTrip(req *http.Request) (*http.Response, error) {
	hasBody := req.Body != nil && req.Body != http.NoBody
	replayable := !hasBody && (req.Method == http.MethodGet || req.Method == http.MethodHead ||
		req.Method == http.MethodOptions || req.Method == http.MethodTrace)
	for attempt := 0; ; attempt++ {
		c, reused, err := b.get(req.Context(), req.URL.Host, hasBody)
		if err != nil {
			return nil, err
		}
		res, err := b.send(c, req)
		if err == nil {
			return res, nil
		}
		c.c.Close()
		var na *errNoAnswer
		if reused && replayable && attempt == 0 && errors.As(err, &na) && req.Context().Err() == nil {
			continue
		}
		return nil, err
	}
}

// send writes req on c and reads the answer's headers. On error, c must be
// closed.
func (b *backendClient) send(c *backendConn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	c.cancel.Add(1)
	stop := context.AfterFunc(ctx, func() {
		defer c.cancel.Done()
		c.c.SetDeadline(aLongTimeAgo)
	})
	// release ends the request's hold on c: the callback has not run and
	// never will, or has ended.
	release := func() {
		if stop() {
			c.cancel.Done()
		} else {
			c.cancel.Wait()
		}
	}
	fail := func(err error) (*http.Response, error) {
		release()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	// A write that fails means a connection the backend closed, as a
	// read that gets no answer does.
	if err := req.Write(c.bw); err != nil {
		return fail(&errNoAnswer{err})
	}
	if err := c.bw.Flush(); err != nil {
		return fail(&errNoAnswer{err})
	}
	if err := c.c.SetReadDeadline(time.Now().Add(b.headerTimeout)); err != nil {
		return fail(err)
	}
	// A cancellation whose callback ran before the line above had its
	// deadline in the past replaced by the header timeout: the read would
	// wait that long for a backend that may never answer.
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	if _, err := c.br.Peek(1); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fail(err)
		}
		return fail(&errNoAnswer{err})
	}
	var res *http.Response
	for {
		var err error
		res, err = http.ReadResponse(c.br, req)
		if err != nil {
			return fail(err)
		}
		// Informational answers (100 Continue, 103 Early Hints) go to
		// the reverse proxy's trace, which relays them; the final answer
		// follows.
		if res.StatusCode >= 100 && res.StatusCode < 200 && res.StatusCode != http.StatusSwitchingProtocols {
			if t := httptrace.ContextClientTrace(ctx); t != nil && t.Got1xxResponse != nil {
				if err := t.Got1xxResponse(res.StatusCode, textproto.MIMEHeader(res.Header)); err != nil {
					return fail(err)
				}
			}
			continue
		}
		break
	}
	// The header timeout is over; the body has no timeout of its own, as
	// with http.Transport. A cancellation that came meanwhile stands.
	c.c.SetReadDeadline(time.Time{})
	if ctx.Err() != nil {
		c.c.SetDeadline(aLongTimeAgo)
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		res.Body = &upgradedBody{c: c, release: release}
		return res, nil
	}
	reusable := !res.Close
	if res.Body == http.NoBody {
		release()
		b.done(c, reusable)
		return res, nil
	}
	res.Body = &backendBody{rc: res.Body, b: b, c: c, release: release, reusable: reusable}
	return res, nil
}

// done ends a request on c: c goes back to the idle connections, or is
// closed.
func (b *backendClient) done(c *backendConn, reusable bool) {
	if !reusable {
		c.c.Close()
		return
	}
	c.idleSince = time.Now()
	b.mu.Lock()
	if b.closed || b.nidle >= b.maxIdle || len(b.idle[c.target]) >= b.maxPerTarget {
		b.mu.Unlock()
		c.c.Close()
		return
	}
	b.idle[c.target] = append(b.idle[c.target], c)
	b.nidle++
	b.mu.Unlock()
}

// get returns an idle connection to target (reused) or a new one. With
// check, an idle connection is first checked for having been closed by the
// backend.
func (b *backendClient) get(ctx context.Context, target string, check bool) (c *backendConn, reused bool, err error) {
	now := time.Now()
	for {
		b.mu.Lock()
		l := b.idle[target]
		if len(l) == 0 {
			b.mu.Unlock()
			break
		}
		c = l[len(l)-1]
		l[len(l)-1] = nil
		b.idle[target] = l[:len(l)-1]
		b.nidle--
		b.mu.Unlock()
		if now.Sub(c.idleSince) > b.idleTimeout || (check && !stillOpen(c.c)) {
			c.c.Close()
			continue
		}
		if err := c.c.SetDeadline(time.Time{}); err != nil {
			c.c.Close()
			continue
		}
		return c, true, nil
	}
	nc, err := b.dialer.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, false, &dialError{err}
	}
	return &backendConn{
		c:      nc,
		br:     bufio.NewReaderSize(nc, backendBufferSize),
		bw:     bufio.NewWriterSize(nc, backendBufferSize),
		target: target,
	}, false, nil
}

// stillOpen reports whether an idle connection is still open: nothing to
// read (an idle backend sends nothing), and no end of stream.
func stillOpen(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		// Nothing to read: EAGAIN. The end of the stream: 0 bytes and
		// no error. Bytes: the backend sent something unasked.
		_, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		open = err == unix.EAGAIN || err == unix.EWOULDBLOCK
		return true // never wait
	})
	return err == nil && open
}

// closeIdle closes every idle connection; with forever, the client keeps
// none from then on.
func (b *backendClient) closeIdle(forever bool) {
	b.mu.Lock()
	idle := b.idle
	b.idle = map[string][]*backendConn{}
	b.nidle = 0
	if forever {
		b.closed = true
	}
	b.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.c.Close()
		}
	}
}

// retain closes the idle connections to targets not in keep.
func (b *backendClient) retain(keep map[string]bool) {
	var drop []*backendConn
	b.mu.Lock()
	for t, l := range b.idle {
		if !keep[t] {
			drop = append(drop, l...)
			b.nidle -= len(l)
			delete(b.idle, t)
		}
	}
	b.mu.Unlock()
	for _, c := range drop {
		c.c.Close()
	}
}

// backendBody is an answer's body: read to its end, it gives its
// connection back for the next request; closed before, it closes it.
type backendBody struct {
	rc       io.ReadCloser
	b        *backendClient
	c        *backendConn
	release  func()
	reusable bool
	done     bool
}

func (r *backendBody) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	n, err := r.rc.Read(p)
	if err == io.EOF {
		r.finish(true)
	}
	return n, err
}

func (r *backendBody) Close() error {
	if !r.done {
		r.finish(false)
	}
	return nil
}

func (r *backendBody) finish(eof bool) {
	r.done = true
	r.release()
	// A request cancelled meanwhile left the connection's deadline in
	// the past: not reusable.
	// A cancellation that came meanwhile set a deadline in the past: a
	// body read to its end leaves the connection clean all the same.
	r.b.done(r.c, eof && r.reusable && r.c.c.SetDeadline(time.Time{}) == nil)
}

// upgradedBody is the backend's side of an upgraded connection (101), which
// the reverse proxy relays both ways.
type upgradedBody struct {
	c       *backendConn
	release func()
	once    sync.Once
}

func (u *upgradedBody) Read(p []byte) (int, error)  { return u.c.br.Read(p) }
func (u *upgradedBody) Write(p []byte) (int, error) { return u.c.c.Write(p) }
func (u *upgradedBody) Close() error {
	err := u.c.c.Close()
	u.once.Do(u.release)
	return err
}
