//go:build unix

package proxy

import (
	"context"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// listen opens a TCP listener on addr that other sockets of the same user
// may bind too (SO_REUSEPORT, or SO_REUSEPORT_LB where plain SO_REUSEPORT
// does not balance), so that several agents on one machine share a VIP:port.
func listen(ctx context.Context, addr netip.AddrPort) (*net.TCPListener, error) {
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
	ln, err := lc.Listen(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}
