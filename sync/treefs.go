package sync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// OpenRepo opens the git repository that holds dir (dir or a parent).
func OpenRepo(dir string) (*git.Repository, error) {
	repo, err := git.PlainOpenWithOptions(dir, &git.PlainOpenOptions{DetectDotGit: true})
	if err != nil {
		return nil, fmt.Errorf("open git repository at %s: %w", dir, err)
	}
	return repo, nil
}

// ResolveCommit resolves a revision (a branch, tag, sha, HEAD~1, ...).
func ResolveCommit(repo *git.Repository, rev string) (*object.Commit, error) {
	h, err := repo.ResolveRevision(plumbing.Revision(rev))
	if err != nil {
		return nil, fmt.Errorf("resolve %q: %w", rev, err)
	}
	c, err := repo.CommitObject(*h)
	if err != nil {
		return nil, fmt.Errorf("read commit %s: %w", h, err)
	}
	return c, nil
}

// CommitFS returns the tree of commit c as a read-only fs.FS. When subdir
// is not empty, the FS is rooted at that directory of the tree.
func CommitFS(c *object.Commit, subdir string) (fs.FS, error) {
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("read tree of %s: %w", c.Hash, err)
	}
	if subdir != "" && subdir != "." {
		tree, err = tree.Tree(subdir)
		if err != nil {
			return nil, fmt.Errorf("%s in commit %s: %w", subdir, c.Hash, err)
		}
	}
	return &treeFS{root: tree, when: c.Committer.When}, nil
}

// treeFS serves a git tree through io/fs. Blobs are read when opened.
type treeFS struct {
	root *object.Tree
	when time.Time
}

func (t *treeFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		return &treeDir{info: t.info(".", filemode.Dir, 0), tree: t.root, fsys: t}, nil
	}
	entry, err := t.root.FindEntry(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	if entry.Mode == filemode.Dir {
		sub, err := t.root.Tree(name)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return &treeDir{info: t.info(path.Base(name), entry.Mode, 0), tree: sub, fsys: t}, nil
	}
	if entry.Mode == filemode.Submodule {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	f, err := t.root.TreeEntryFile(entry)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	r, err := f.Reader()
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return &treeFile{info: t.info(path.Base(name), entry.Mode, int64(len(data))), Reader: bytes.NewReader(data)}, nil
}

func (t *treeFS) info(name string, mode filemode.FileMode, size int64) fileInfo {
	return fileInfo{name: name, mode: mode, size: size, when: t.when}
}

type fileInfo struct {
	name string
	mode filemode.FileMode
	size int64
	when time.Time
}

func (i fileInfo) Name() string       { return i.name }
func (i fileInfo) Size() int64        { return i.size }
func (i fileInfo) ModTime() time.Time { return i.when }
func (i fileInfo) IsDir() bool        { return i.mode == filemode.Dir }
func (i fileInfo) Sys() any           { return nil }
func (i fileInfo) Mode() fs.FileMode {
	switch i.mode {
	case filemode.Dir:
		return fs.ModeDir | 0o555
	case filemode.Symlink:
		return fs.ModeSymlink | 0o444
	case filemode.Executable:
		return 0o555
	default:
		return 0o444
	}
}

func (i fileInfo) Type() fs.FileMode          { return i.Mode().Type() }
func (i fileInfo) Info() (fs.FileInfo, error) { return i, nil }

type treeFile struct {
	info fileInfo
	*bytes.Reader
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *treeFile) Close() error               { return nil }

type treeDir struct {
	info fileInfo
	tree *object.Tree
	fsys *treeFS
	pos  int
}

func (d *treeDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *treeDir) Close() error               { return nil }
func (d *treeDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.info.name, Err: errors.New("is a directory")}
}

func (d *treeDir) ReadDir(n int) ([]fs.DirEntry, error) {
	entries := d.tree.Entries[d.pos:]
	if n > 0 && len(entries) > n {
		entries = entries[:n]
	}
	if n > 0 && len(entries) == 0 {
		return nil, io.EOF
	}
	out := make([]fs.DirEntry, 0, len(entries))
	for _, e := range entries {
		if e.Mode == filemode.Submodule {
			continue
		}
		out = append(out, dirEntry{fileInfo: d.fsys.info(e.Name, e.Mode, 0), tree: d.tree, entry: e})
	}
	d.pos += len(entries)
	return out, nil
}

// dirEntry is a tree entry; its size is looked up only when Info is asked
// for, since walking a tree needs names and types alone.
type dirEntry struct {
	fileInfo
	tree  *object.Tree
	entry object.TreeEntry
}

func (e dirEntry) Info() (fs.FileInfo, error) {
	info := e.fileInfo
	if e.entry.Mode != filemode.Dir {
		f, err := e.tree.TreeEntryFile(&e.entry)
		if err != nil {
			return nil, err
		}
		info.size = f.Size
	}
	return info, nil
}
