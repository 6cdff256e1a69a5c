// Package logfile keeps an instance's output: two log files, stdout.log and
// stderr.log, in one directory, that the instance appends to, that are cut
// in place when they grow past a cap, and that are shown the way tail(1)
// shows several files. The process and freebsd drivers share it. It knows
// nothing of instances or drivers and never starts a process.
package logfile

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
)

// Streams are an instance's two logs, in the order Tail shows them.
var Streams = []string{"stdout", "stderr"}

// maxLineAlign is how far a cut log may skip forward to start at a line.
const maxLineAlign = 4096

// Path returns the file of stream ("stdout" or "stderr") in dir.
func Path(dir, stream string) string {
	return filepath.Join(dir, stream+".log")
}

// Open opens a log for an instance to append to. Every writer uses
// O_APPEND, which is what makes Cap's copy-truncate safe: after the
// truncation, writes land at the new end instead of leaving a hole.
func Open(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
}

// Tail returns the tail of the logs in dir, at most limit bytes: the end of
// stdout.log under a line "==> stdout <==", then the end of stderr.log under
// "==> stderr <==". A stream with no output is left out. When both do not
// fit, each gets half the room (and what one does not need goes to the
// other); a stream that was cut starts at a line boundary when one is near.
func Tail(dir string, limit int) ([]byte, error) {
	if limit <= 0 {
		return nil, nil
	}
	var files []*os.File
	var sizes []int64
	var headers []string
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, s := range Streams {
		f, err := os.Open(Path(dir, s))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil || fi.Size() == 0 {
			f.Close()
			continue
		}
		files = append(files, f)
		sizes = append(sizes, fi.Size())
		headers = append(headers, "==> "+s+" <==\n")
	}
	room := int64(limit)
	for i, h := range headers {
		room -= int64(len(h))
		if i > 0 {
			room-- // a newline the previous stream may lack
		}
	}
	shares := share(sizes, max(room, 0))
	var out bytes.Buffer
	for i, f := range files {
		if i > 0 && out.Len() > 0 && out.Bytes()[out.Len()-1] != '\n' {
			out.WriteByte('\n')
		}
		out.WriteString(headers[i])
		n, cut := shares[i], shares[i] < sizes[i]
		if cut {
			n++ // and the byte before, to tell whether the tail starts a line
		}
		buf := make([]byte, n)
		got, err := f.ReadAt(buf, sizes[i]-n)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		buf = buf[:got]
		if cut {
			buf = alignTail(buf)
		}
		out.Write(buf)
	}
	b := out.Bytes()
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return b, nil
}

// share divides room among sizes: equal parts, and what a small one does
// not need to the others.
func share(sizes []int64, room int64) []int64 {
	out := make([]int64, len(sizes))
	left := len(sizes)
	for left > 0 {
		part := room / int64(left)
		progress := false
		for i, s := range sizes {
			if out[i] == 0 && s <= part && s > 0 {
				out[i], room, left, progress = s, room-s, left-1, true
			}
		}
		if !progress {
			for i, s := range sizes {
				if out[i] == 0 && s > 0 {
					out[i] = part
				}
			}
			break
		}
	}
	return out
}

// alignTail takes the tail of a log preceded by the byte before it, and
// returns the tail from its first whole line, if one starts near the
// beginning.
func alignTail(b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	prev, b := b[0], b[1:]
	if prev == '\n' {
		return b
	}
	if i := bytes.IndexByte(b, '\n'); i >= 0 && i < maxLineAlign {
		return b[i+1:]
	}
	return b
}

// capMu serialises CapAll: a driver caps an instance's logs from Running
// and from Start, which may run at once, and two copy-truncates of one file
// at once would lose output.
var capMu sync.Mutex

// CapAll caps both logs in dir at limit (Cap), one directory at a time.
func CapAll(dir string, limit int64) error {
	capMu.Lock()
	defer capMu.Unlock()
	var errs []error
	for _, s := range Streams {
		errs = append(errs, Cap(Path(dir, s), limit))
	}
	return errors.Join(errs...)
}

// Cap keeps the newest half of a log longer than limit, in place
// (copy-truncate: the instance holds the file open with O_APPEND, so it
// cannot be renamed away). Output written between the last read and the
// truncation, a window of microseconds, is lost. A missing log is not an
// error.
func Cap(path string, limit int64) error {
	if fi, err := os.Stat(path); err != nil || fi.Size() <= limit {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err // the cheap, common case: nothing to do
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0) // no O_APPEND: WriteAt must write at 0
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() <= limit {
		return err
	}
	// One byte before the newest half, to tell whether it starts a line.
	from := fi.Size() - limit/2 - 1
	buf, err := io.ReadAll(io.NewSectionReader(f, from, math.MaxInt64-from)) // to EOF, including what was just appended
	if err != nil || len(buf) == 0 {
		return err
	}
	buf = alignTail(buf)
	if _, err := f.WriteAt(buf, 0); err != nil {
		return err
	}
	return f.Truncate(int64(len(buf)))
}
