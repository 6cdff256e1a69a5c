package proxy

import (
	"bufio"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

// benchTargets returns the address to dial for a benchmark: the backend
// itself ("direct", the loopback baseline) and the backend through a proxy.
func benchTargets(b *testing.B, be *backend) []struct {
	name string
	addr netip.AddrPort
} {
	m := New(Options{Logger: slog.New(slog.DiscardHandler)})
	b.Cleanup(m.Close)
	s := newService("bench", be.addr())
	if err := m.Set([]Service{s}); err != nil {
		b.Fatal(err)
	}
	return []struct {
		name string
		addr netip.AddrPort
	}{{"direct", be.addr()}, {"proxy", s.addr()}}
}

// BenchmarkThroughput streams 1 MiB writes over one connection to a backend
// that discards them and, at the end, answers with the byte count it got.
func BenchmarkThroughput(b *testing.B) {
	be := newBackend(b, "sink", netip.AddrPort{}, func(_ *backend, c *net.TCPConn) {
		n, err := io.Copy(io.Discard, c)
		if err == nil {
			binary.Write(c, binary.BigEndian, n)
		}
	})
	buf := make([]byte, 1<<20)
	for _, target := range benchTargets(b, be) {
		b.Run(target.name, func(b *testing.B) {
			c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(target.addr))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			var sent int64
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				sent += int64(len(buf))
			}
			// The time counted ends when the backend has every byte.
			c.CloseWrite()
			var got int64
			if err := binary.Read(c, binary.BigEndian, &got); err != nil || got != sent {
				b.Fatalf("backend got %d bytes (%v), want %d", got, err, sent)
			}
			b.ReportMetric(float64(sent)/time.Since(start).Seconds()/1e6, "MB/s")
		})
	}
}

// BenchmarkConnectionRate opens short connections: connect, read the
// backend's greeting, half-close, read to the end, close.
func BenchmarkConnectionRate(b *testing.B) {
	be := newBackend(b, "greeter", netip.AddrPort{}, greetEcho)
	for _, target := range benchTargets(b, be) {
		b.Run(target.name, func(b *testing.B) {
			addr := net.TCPAddrFromAddrPort(target.addr)
			start := time.Now()
			n := 0
			for b.Loop() {
				c, err := net.DialTCP("tcp", nil, addr)
				if err != nil {
					b.Fatal(err)
				}
				r := bufio.NewReader(c)
				if _, err := r.ReadString('\n'); err != nil {
					b.Fatal(err)
				}
				c.CloseWrite()
				if _, err := io.Copy(io.Discard, r); err != nil {
					b.Fatal(err)
				}
				c.Close()
				n++
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "conns/s")
		})
	}
}
