package proxy

import (
	"errors"
	"io"
	"net"
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
	done := make(chan struct{})
	m.wg.Go(func() {
		defer close(done)
		pipe(backend, client)
	})
	pipe(client, backend)
	<-done
}

// dial connects to one of r's endpoints: the next healthy one in
// round-robin order and, if that fails, once more to the next one after it.
func (m *Manager) dial(r *service) (*net.TCPConn, error) {
	set := r.endpoints.Load()
	n := len(set.eps)
	if n == 0 {
		return nil, errNoEndpoints
	}
	now := m.now()
	i := set.pick(r.next.Add(1)-1, now)
	c, err := m.dialEndpoint(r, set.eps[i])
	if err == nil || n == 1 || m.ctx.Err() != nil {
		return c, err
	}
	j := set.after(i, m.now())
	c, err2 := m.dialEndpoint(r, set.eps[j])
	if err2 != nil {
		return nil, errors.Join(err, err2)
	}
	return c, nil
}

func (m *Manager) dialEndpoint(r *service, ep *endpoint) (*net.TCPConn, error) {
	c, err := m.dialer.DialContext(m.ctx, "tcp", ep.addr.String())
	if err != nil {
		if m.ctx.Err() == nil { // not our own shutdown
			r.metrics.dialErrors.Inc()
			if ep.markDown(m.now(), int64(m.unhealthyFor)) {
				m.log.Warn("proxy endpoint unhealthy", "service", r.name, "endpoint", ep.addr, "for", m.unhealthyFor, "err", err)
			}
		}
		return nil, err
	}
	ep.markUp()
	return c.(*net.TCPConn), nil
}

// pipe copies src to dst until src ends, then half-closes dst so that the
// peer sees the end of the stream while the other direction goes on. On an
// error it closes both conns, which also ends the other direction.
func pipe(dst, src *net.TCPConn) {
	_, err := io.Copy(dst, src)
	if err == nil {
		err = dst.CloseWrite()
	}
	if err != nil {
		src.Close()
		dst.Close()
	}
}
