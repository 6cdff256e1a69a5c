package sync

import (
	"errors"
	"fmt"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

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
	// gitlinks are the paths (relative to root) that the git index of the
	// checkout's repository records as submodules, checked out or not: an
	// uninitialised submodule is an empty directory on disk, which the
	// commit holds as a gitlink.
	gitlinks map[string]bool
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
	return &DirFS{root: root, gitlinks: indexGitlinks(dir)}, nil
}

// indexGitlinks returns the submodules the git index of the repository
// that holds dir records below dir, or none when dir is not in a git
// repository (or its index cannot be read: then only checked-out
// submodules, directories holding a .git, are seen).
func indexGitlinks(dir string) map[string]bool {
	repo, err := git.PlainOpenWithOptions(dir, &git.PlainOpenOptions{DetectDotGit: true})
	if err != nil {
		return nil
	}
	wt, err := repo.Worktree()
	if err != nil {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	top := wt.Filesystem.Root()
	if real, err := filepath.EvalSymlinks(top); err == nil {
		top = real
	}
	rel, err := filepath.Rel(top, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil
	}
	idx, err := repo.Storer.Index()
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, e := range idx.Entries {
		if e.Mode != filemode.Submodule {
			continue
		}
		name := e.Name
		if rel != "." {
			var ok bool
			if name, ok = strings.CutPrefix(name, filepath.ToSlash(rel)+"/"); !ok {
				continue
			}
		}
		out[name] = true
	}
	return out
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
		if i < len(name) && (!st.IsDir() || d.isRepo(name[:i])) {
			return nil, &fs.PathError{Op: "open", Path: name[:i], Err: render.ErrNotRegular}
		}
	}
	if !st.IsDir() && !st.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: name, Err: render.ErrNotRegular}
	}
	if name != "." && d.isRepo(name) {
		// A submodule or a nested repository: the commit holds a
		// gitlink there, which CommitFS refuses; its files are another
		// repository's, which review of this one never sees.
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
		return &dirFile{File: f, fsys: d, path: name}, nil
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

// isRepo reports whether the directory name holds a .git entry (a file,
// a directory or a link): the checkout of a submodule, or a nested
// repository.
func (d *DirFS) isRepo(name string) bool {
	if d.gitlinks[name] {
		return true
	}
	_, err := d.root.Lstat(path.Join(name, ".git"))
	return err == nil
}

// dirFile is a directory whose listing leaves out .git, and lists a
// submodule (a directory holding a .git) as what CommitFS lists for its
// gitlink: an irregular entry.
type dirFile struct {
	*os.File
	fsys *DirFS
	path string
}

func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	for {
		entries, err := d.File.ReadDir(n)
		entries = slices.DeleteFunc(entries, func(e fs.DirEntry) bool { return e.Name() == ".git" })
		for i, e := range entries {
			// The commit reader's verdict on a name no io/fs path can hold.
			if !utf8.ValidString(e.Name()) {
				return nil, &fs.PathError{Op: "readdir", Path: d.path, Err: fmt.Errorf("%w: the entry %q is not valid UTF-8", render.ErrInvalidTree, e.Name())}
			}
			if e.IsDir() && d.fsys.isRepo(path.Join(d.path, e.Name())) {
				entries[i] = gitlinkEntry{e}
			}
		}
		if len(entries) > 0 || err != nil || n <= 0 {
			if n > 0 && len(entries) == 0 && err == nil {
				err = io.EOF
			}
			return entries, err
		}
	}
}

// gitlinkEntry is a submodule's directory, listed as irregular.
type gitlinkEntry struct{ fs.DirEntry }

func (e gitlinkEntry) IsDir() bool       { return false }
func (e gitlinkEntry) Type() fs.FileMode { return fs.ModeIrregular }
func (e gitlinkEntry) Info() (fs.FileInfo, error) {
	info, err := e.DirEntry.Info()
	if err != nil {
		return nil, err
	}
	return gitlinkInfo{info}, nil
}

type gitlinkInfo struct{ fs.FileInfo }

func (i gitlinkInfo) IsDir() bool       { return false }
func (i gitlinkInfo) Mode() fs.FileMode { return fs.ModeIrregular | 0o444 }

// ReadFile reads name through Open, so that fs.ReadFile keeps the limits.
func (d *DirFS) ReadFile(name string) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
