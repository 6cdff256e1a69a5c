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
	"net/netip"
	"os"
	"path/filepath"
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
