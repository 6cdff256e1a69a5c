package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/keel-dev/keel/internal/roundrobin"
)

var errNoEndpoints = errors.New("no endpoints")

// handle relays one accepted connection and closes it.
func (m *Manager) handle(r *service, client *net.TCPConn) {
	r.metrics.connections.Inc()
	r.metrics.active.Inc()
	defer r.metrics.active.Dec()
	if !m.track(client) {
		client.Close()
		return
	}
	defer func() {
		m.untrack(client)
		client.Close()
	}()

	backend, err := m.dial(r)
	if err != nil {
		// Reset rather than a clean close, so that the client cannot
		// take the end of the stream for an empty answer. Only debug:
		// unhealthy endpoints are logged when they are marked.
		client.SetLinger(0)
		m.log.Debug("proxy connection dropped", "service", r.name, "client", client.RemoteAddr(), "err", err)
		return
	}
	if !m.track(backend) {
		backend.Close()
		return
	}
	defer func() {
		m.untrack(backend)
		backend.Close()
	}()
	// Both conns are closed (deferred) only once both directions have
	// ended: a peer that half-closed may still be reading.
	idle := &idleClock{timeout: m.limits.IdleTimeout}
	idle.touch()
	done := make(chan struct{})
	m.wg.Go(func() {
		defer close(done)
		pipe(backend, client, idle)
	})
	pipe(client, backend, idle)
	<-done
}

// dial connects to one of r's endpoints: the next healthy one in
// round-robin order and, if that fails, once more to the next one after it.
func (m *Manager) dial(r *service) (*net.TCPConn, error) {
	set := r.endpoints.Load()
	n := len(set.Endpoints)
	if n == 0 {
		return nil, errNoEndpoints
	}
	now := m.now()
	i := set.Pick(r.next.Add(1)-1, now)
	c, err := m.dialEndpoint(r, set.Endpoints[i])
	if err == nil || n == 1 || m.ctx.Err() != nil {
		return c, err
	}
	j := set.After(i, m.now())
	c, err2 := m.dialEndpoint(r, set.Endpoints[j])
	if err2 != nil {
		return nil, errors.Join(err, err2)
	}
	return c, nil
}

func (m *Manager) dialEndpoint(r *service, ep *roundrobin.Endpoint) (*net.TCPConn, error) {
	c, err := m.dialer.DialContext(m.ctx, "tcp", ep.Addr.String())
	if err != nil {
		if m.ctx.Err() == nil { // not our own shutdown
			r.metrics.dialErrors.Inc()
			if ep.MarkDown(m.now(), int64(m.unhealthyFor)) {
				m.log.Warn("proxy endpoint unhealthy", "service", r.name, "endpoint", ep.Addr, "for", m.unhealthyFor, "err", err)
			}
		}
		return nil, err
	}
	ep.MarkUp()
	return c.(*net.TCPConn), nil
}

// idleClock is when either direction of a relayed connection last moved a
// byte.
type idleClock struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds
}

func (c *idleClock) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *idleClock) idleFor() time.Duration { return time.Since(time.Unix(0, c.last.Load())) }

// idleReader reads from a relayed conn under the idle timeout: a read that
// waits longer than the timeout ends the relay unless the other direction
// moved bytes meanwhile.
type idleReader struct {
	c    *net.TCPConn
	idle *idleClock
}

func (r idleReader) Read(p []byte) (int, error) {
	for {
		wait := r.idle.timeout - r.idle.idleFor()
		if wait <= 0 {
			return 0, errIdle
		}
		if err := r.c.SetReadDeadline(time.Now().Add(wait)); err != nil {
			return 0, err
		}
		n, err := r.c.Read(p)
		if n > 0 {
			r.idle.touch()
		}
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && n == 0 {
			continue // the loop ends it, unless the other side was busy
		}
		return n, err
	}
}

var errIdle = errors.New("idle timeout")

// pipe copies src to dst until src ends, then half-closes dst so that the
// peer sees the end of the stream while the other direction goes on. On an
// error (the idle timeout among them) it closes both conns, which also ends
// the other direction.
func pipe(dst, src *net.TCPConn, idle *idleClock) {
	buf := make([]byte, 32<<10)
	_, err := io.CopyBuffer(writerOnly{dst}, idleReader{src, idle}, buf)
	if err == nil {
		err = dst.CloseWrite()
	}
	if err != nil {
		src.Close()
		dst.Close()
	}
}

// writerOnly hides dst's ReadFrom, so that io.CopyBuffer reads through
// idleReader rather than splicing around it.
type writerOnly struct{ io.Writer }
