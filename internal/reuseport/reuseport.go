//go:build unix

// Package reuseport opens TCP listeners that other sockets of the same user
// may bind too, so that several agents on one machine (the process driver's
// loopback cluster) serve the same address and the kernel spreads
// connections between them. The service proxies and the ingress use it.
package reuseport

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listen opens a TCP listener on addr (host:port, as net.Listen takes it)
// with SO_REUSEADDR and SO_REUSEPORT set, or SO_REUSEPORT_LB where plain
// SO_REUSEPORT does not balance.
func Listen(ctx context.Context, addr string) (*net.TCPListener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, reusePort, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}
