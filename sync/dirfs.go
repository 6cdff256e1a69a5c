package sync

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/keel-dev/keel/render"
)

// DirFS is a checkout on disk read the way CommitFS reads a commit, for the
// CLI and the agent's snapshots: nothing outside the directory is
// reachable (an os.Root), .git is not listed, and opening anything that is
// not a regular file or a directory (a symlink wherever it points, a FIFO,
// a device, a socket) fails with render.ErrNotRegular naming the path,
// without reading it, and without blocking on a FIFO. A file larger than
// render.MaxFileSize fails with render.ErrTooLarge, and no read returns
// more than that, however the file grows meanwhile.
type DirFS struct {
	root *os.Root
}

// OpenDir opens dir as a DirFS. Close it when done.
func OpenDir(dir string) (*DirFS, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("repository: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("repository %s is not a directory", dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("repository: %w", err)
	}
	return &DirFS{root: root}, nil
}

// Close releases the directory.
func (d *DirFS) Close() error { return d.root.Close() }

// Dir is the directory d reads.
func (d *DirFS) Dir() string { return d.root.Name() }

func (d *DirFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if slices.Contains(strings.Split(name, "/"), ".git") {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	// Every component must be what it says, not a link: os.Root would
	// follow a link that stays inside the directory, and what a link
	// points to is not what review sees.
	var st fs.FileInfo
	for i := range len(name) + 1 {
		if i < len(name) && name[i] != '/' {
			continue
		}
		var err error
		if st, err = d.root.Lstat(name[:i]); err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: unwrapPath(err)}
		}
		if i < len(name) && !st.IsDir() {
			return nil, &fs.PathError{Op: "open", Path: name[:i], Err: render.ErrNotRegular}
		}
	}
	if !st.IsDir() && !st.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: name, Err: render.ErrNotRegular}
	}
	// O_NONBLOCK: had the file been swapped for a FIFO since, opening it
	// must not wait for a writer; the fstat below then refuses it.
	f, err := d.root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: unwrapPath(err)}
	}
	fst, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: unwrapPath(err)}
	}
	switch {
	case !os.SameFile(st, fst) || (!fst.IsDir() && !fst.Mode().IsRegular()):
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: render.ErrNotRegular}
	case fst.IsDir():
		return &dirFile{File: f}, nil
	case fst.Size() > render.MaxFileSize:
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: render.ErrTooLarge}
	}
	return &boundedFile{File: f, name: name, left: render.MaxFileSize}, nil
}

// unwrapPath drops the *PathError of os, whose path is absolute: the
// caller's names the path within the repository.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// boundedFile is a regular file that reads at most render.MaxFileSize
// bytes.
type boundedFile struct {
	*os.File
	name string
	left int64
}

func (f *boundedFile) Read(p []byte) (int, error) {
	if f.left < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: render.ErrTooLarge}
	}
	if int64(len(p)) > f.left+1 {
		p = p[:f.left+1]
	}
	n, err := f.File.Read(p)
	f.left -= int64(n)
	if f.left < 0 {
		return n, &fs.PathError{Op: "read", Path: f.name, Err: render.ErrTooLarge}
	}
	return n, err
}

// dirFile is a directory whose listing leaves out .git.
type dirFile struct{ *os.File }

func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	for {
		entries, err := d.File.ReadDir(n)
		entries = slices.DeleteFunc(entries, func(e fs.DirEntry) bool { return e.Name() == ".git" })
		if len(entries) > 0 || err != nil || n <= 0 {
			if n > 0 && len(entries) == 0 && err == nil {
				err = io.EOF
			}
			return entries, err
		}
	}
}

// ReadFile reads name through Open, so that fs.ReadFile keeps the limits.
func (d *DirFS) ReadFile(name string) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
