package sync

import (
	"context"
	"errors"
	"fmt"
	"io"
	gosync "sync"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
)

// Limits on what one fetch may bring. go-git inflates each object of a
// fetched pack into memory to index it, so a small pack holding an object
// that inflates to 1 GiB (a decompression bomb) would cost 1 GiB of memory
// before anything could look at it. Every pack a mirror fetches is
// scanned as it arrives, and the fetch is stopped at the first object
// past these limits, before go-git inflates it.
const (
	// MaxObjectSize bounds one object, inflated: a blob, a tree, a commit,
	// and the object a delta rebuilds.
	MaxObjectSize = 100 << 20
	// MaxPackObjects bounds the number of objects of one fetch.
	MaxPackObjects = 1 << 20
	// MaxPackSize bounds the bytes of one fetch as sent (compressed).
	MaxPackSize = 1 << 30
)

// ObjectTooLargeError is a fetch stopped by the limits above.
type ObjectTooLargeError struct {
	Reason string
}

func (e *ObjectTooLargeError) Error() string { return "fetch refused: " + e.Reason }

var installGuard gosync.Once

// guardTransports makes every transport go-git fetches with scan its packs
// (idempotent). The wrapped transports are the process's own: the agent
// and the CLI fetch only through mirrors.
func guardTransports() {
	installGuard.Do(func() {
		for scheme, t := range client.Protocols {
			client.InstallProtocol(scheme, guardedTransport{t})
		}
	})
}

type guardedTransport struct{ transport.Transport }

func (g guardedTransport) NewUploadPackSession(ep *transport.Endpoint, auth transport.AuthMethod) (transport.UploadPackSession, error) {
	s, err := g.Transport.NewUploadPackSession(ep, auth)
	if err != nil {
		return nil, err
	}
	return guardedSession{s}, nil
}

type guardedSession struct{ transport.UploadPackSession }

func (g guardedSession) UploadPack(ctx context.Context, req *packp.UploadPackRequest) (*packp.UploadPackResponse, error) {
	resp, err := g.UploadPackSession.UploadPack(ctx, req)
	if err != nil {
		return nil, err
	}
	out := packp.NewUploadPackResponseWithPackfile(req, newPackGuard(resp, sidebandOf(req.Capabilities)))
	out.ShallowUpdate, out.ServerResponse = resp.ShallowUpdate, resp.ServerResponse
	return out, nil
}

func sidebandOf(l *capability.List) sideband.Type {
	switch {
	case l.Supports(capability.Sideband):
		return sideband.Sideband
	case l.Supports(capability.Sideband64k):
		return sideband.Sideband64k
	}
	return 0
}

// packGuard passes a fetch's response through unchanged while a scanner,
// on its own goroutine, reads the same bytes and checks each object's
// header. Read hands bytes on only once the scanner has taken them, so
// go-git is never more than the scanner's buffer ahead of it, and a Read
// after a refusal fails with the refusal.
type packGuard struct {
	src  io.ReadCloser
	pw   *io.PipeWriter
	done chan struct{}
	err  error // the scanner's verdict, set before done closes
	read int64
}

func newPackGuard(src io.ReadCloser, band sideband.Type) *packGuard {
	pr, pw := io.Pipe()
	g := &packGuard{src: src, pw: pw, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		var r io.Reader = pr
		if band != 0 {
			r = sideband.NewDemuxer(band, pr)
		}
		g.err = scanPack(r)
		// Refuse what follows, or take the rest (a trailing flush).
		if g.err != nil {
			pr.CloseWithError(g.err)
			return
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return g
}

func (g *packGuard) Read(p []byte) (int, error) {
	n, err := g.src.Read(p)
	g.read += int64(n)
	if g.read > MaxPackSize {
		g.pw.CloseWithError(&ObjectTooLargeError{Reason: fmt.Sprintf("the pack is larger than %d MiB", MaxPackSize>>20)})
		<-g.done
		return 0, g.verdict()
	}
	if n > 0 {
		if _, werr := g.pw.Write(p[:n]); werr != nil {
			<-g.done
			return 0, g.verdict()
		}
	}
	if err != nil {
		g.pw.CloseWithError(err)
	}
	return n, err
}

// verdict is the scanner's refusal, once it has stopped.
func (g *packGuard) verdict() error {
	var tooLarge *ObjectTooLargeError
	if errors.As(g.err, &tooLarge) {
		return g.err
	}
	if g.err != nil {
		return fmt.Errorf("scan the fetched pack: %w", g.err)
	}
	return &ObjectTooLargeError{Reason: fmt.Sprintf("the pack is larger than %d MiB", MaxPackSize>>20)}
}

func (g *packGuard) Close() error {
	g.pw.CloseWithError(io.ErrClosedPipe)
	<-g.done
	if g.err != nil {
		// go-git's local transport waits for git-upload-pack to exit on
		// Close, which it does only once the rest of the pack is read: the
		// rest is read and dropped (within the fetch's limits and timeout).
		_, _ = io.Copy(io.Discard, io.LimitReader(g.src, MaxPackSize))
	}
	return g.src.Close()
}

// scanPack reads a pack and checks, before inflating anything, that each
// object's inflated size (for a delta: the delta's, and then the size of
// the object it rebuilds, from the delta's first bytes) is within
// MaxObjectSize, and that the pack holds at most MaxPackObjects objects.
func scanPack(r io.Reader) error {
	s := packfile.NewScanner(r)
	_, objects, err := s.Header()
	if err != nil {
		if errors.Is(err, packfile.ErrEmptyPackfile) {
			return nil
		}
		return err
	}
	if objects > MaxPackObjects {
		return &ObjectTooLargeError{Reason: fmt.Sprintf("the pack holds %d objects, more than %d", objects, MaxPackObjects)}
	}
	for range objects {
		h, err := s.NextObjectHeader()
		if err != nil {
			return err
		}
		if h.Length > MaxObjectSize {
			return &ObjectTooLargeError{Reason: fmt.Sprintf("an object of %d MiB, more than %d MiB", h.Length>>20, MaxObjectSize>>20)}
		}
		var head deltaHead
		if _, _, err := s.NextObject(&head); err != nil {
			return err
		}
		if h.Type == plumbing.OFSDeltaObject || h.Type == plumbing.REFDeltaObject {
			if size, ok := head.target(); !ok || size > MaxObjectSize {
				return &ObjectTooLargeError{Reason: fmt.Sprintf("a delta that rebuilds an object of %d MiB, more than %d MiB", size>>20, MaxObjectSize>>20)}
			}
		}
	}
	return nil
}

// deltaHead keeps the first bytes written to it (a delta's header: the
// base's size, then the target's, as varints) and discards the rest.
type deltaHead struct {
	buf [20]byte
	n   int
}

func (d *deltaHead) Write(p []byte) (int, error) {
	d.n += copy(d.buf[d.n:], p)
	return len(p), nil
}

// target is the size of the object the delta rebuilds.
func (d *deltaHead) target() (int64, bool) {
	b := d.buf[:d.n]
	var size int64
	for range 2 { // the base's size, then the target's
		size = 0
		var shift uint
		for i := 0; ; i++ {
			if i >= len(b) || shift > 56 {
				return 0, false
			}
			size |= int64(b[i]&0x7f) << shift
			shift += 7
			if b[i]&0x80 == 0 {
				b = b[i+1:]
				break
			}
		}
	}
	return size, true
}
