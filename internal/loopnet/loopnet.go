//go:build unix

// Package loopnet hands out blocks of loopback addresses (127.N.0.0/16) to
// tests, disjoint across every test process of the machine: a block is
// held by an flock on a file under os.TempDir, which the kernel releases
// when the process ends, however it ends. Parallel test packages (the
// end-to-end clusters, the proxy's tests) thus never bind each other's
// addresses.
package loopnet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// The blocks handed out: 127.20.0.0/16 to 127.199.0.0/16, in pairs, except
// those some tests use at fixed addresses (127.76-79: the driver tests).
const (
	first = 20
	last  = 199
)

func reserved(n int) bool { return n >= 76 && n <= 79 }

// Pair is two adjacent /16s (127.N and 127.N+1, N even) held until Release.
type Pair struct {
	A, B netip.Prefix
	f    *os.File
}

// Release gives the pair back.
func (p *Pair) Release() {
	if p.f != nil {
		_ = syscall.Flock(int(p.f.Fd()), syscall.LOCK_UN)
		p.f.Close()
		p.f = nil
	}
}

// ErrNone is returned when every pair is held.
var ErrNone = errors.New("loopnet: every block of 127.0.0.0/8 is held by another test")

// Reserve returns a pair of /16s no other holder (of this or another
// process) holds, trying the pairs from a random one on.
func Reserve() (*Pair, error) {
	var cands []int
	for n := first; n+1 <= last; n += 2 {
		if !reserved(n) && !reserved(n+1) {
			cands = append(cands, n)
		}
	}
	start := rand.IntN(len(cands))
	for i := range cands {
		n := cands[(start+i)%len(cands)]
		path := filepath.Join(os.TempDir(), fmt.Sprintf("keel-loopnet-127.%d.lock", n))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue
			}
			return nil, fmt.Errorf("loopnet: locking %s: %w", path, err)
		}
		return &Pair{
			A: netip.MustParsePrefix(fmt.Sprintf("127.%d.0.0/16", n)),
			B: netip.MustParsePrefix(fmt.Sprintf("127.%d.0.0/16", n+1)),
			f: f,
		}, nil
	}
	return nil, ErrNone
}

// FreePort returns a port that is free, for TCP and UDP both, on every one
// of addrs (a gossip ring listens on both, at one port on every node's
// address). The port may be taken by someone else before the caller binds
// it: a caller that can, tries again.
func FreePort(addrs ...string) (int, error) {
	if len(addrs) == 0 {
		return 0, errors.New("no address")
	}
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(addrs[0], "0"))
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if freeOnAll(addrs, port) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no port free for TCP and UDP on %v", addrs)
}

func freeOnAll(addrs []string, port int) bool {
	for _, a := range addrs {
		ap := net.JoinHostPort(a, strconv.Itoa(port))
		tl, err := net.Listen("tcp", ap)
		if err != nil {
			return false
		}
		u, err := net.ListenPacket("udp", ap)
		tl.Close()
		if err != nil {
			return false
		}
		u.Close()
	}
	return true
}
