package sync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	gosync "sync"
	"time"
	"unicode/utf8"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/keel-dev/keel/render"
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
	c, err := readCommit(repo.Storer, *h)
	if err != nil {
		return nil, fmt.Errorf("read commit %s: %w", h, err)
	}
	return c, nil
}

// maxCommitSize bounds a commit object (its message, its signature): it is
// read before anything else is known about it.
const maxCommitSize = 1 << 20

// readCommit reads the commit h after checking its size from the object's
// header.
func readCommit(s storer.EncodedObjectStorer, h plumbing.Hash) (*object.Commit, error) {
	if err := checkSize(s, h, maxCommitSize); err != nil {
		return nil, err
	}
	return object.GetCommit(s, h)
}

// objectSize returns the size of object h as its header gives it, without
// inflating its body (go-git's filesystem storage can; other storages hold
// objects in memory already).
func objectSize(s storer.EncodedObjectStorer, h plumbing.Hash) (int64, error) {
	if sz, ok := s.(interface {
		EncodedObjectSize(plumbing.Hash) (int64, error)
	}); ok {
		return sz.EncodedObjectSize(h)
	}
	obj, err := s.EncodedObject(plumbing.AnyObject, h)
	if err != nil {
		return 0, err
	}
	return obj.Size(), nil
}

// checkSize fails with render.ErrTooLarge when object h is larger than max.
func checkSize(s storer.EncodedObjectStorer, h plumbing.Hash, max int64) error {
	size, err := objectSize(s, h)
	if err != nil {
		return err
	}
	if size > max {
		return fmt.Errorf("object %s is %d bytes, more than %d: %w", h, size, max, render.ErrTooLarge)
	}
	return nil
}

// readBlob reads blob h, refusing it from its header when it is larger
// than max.
func readBlob(s storer.EncodedObjectStorer, h plumbing.Hash, max int64) ([]byte, error) {
	if err := checkSize(s, h, max); err != nil {
		return nil, err
	}
	obj, err := s.EncodedObject(plumbing.BlobObject, h)
	if err != nil {
		return nil, err
	}
	r, err := obj.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, render.ErrTooLarge
	}
	return data, nil
}

// CommitFS returns the tree of commit c, from repo, as a read-only fs.FS
// rooted at subdir (the whole tree when empty). It is the one reader of a
// commit: the agent, keel plan and the snapshots all read through it, and
// sync.OpenDir gives the same verdicts on a checkout.
//
//   - A directory with an entry no checkout can hold (an empty name, ".",
//     "..", ".git" in any case, a name with "/" or NUL, two entries with one
//     name) fails to list with render.ErrInvalidTree.
//   - Opening a symlink, a submodule or any entry that is not a blob or a
//     tree fails with render.ErrNotRegular; listings show their type.
//   - A blob larger than render.MaxFileSize fails with render.ErrTooLarge,
//     known from the object's header before its body is inflated; so do a
//     tree object that large, and the trees of one walk adding up to more
//     than render.MaxRepoSize.
//
// The repository is needed (not only the commit) because go-git keeps the
// object storage, which can tell an object's size from its header, private
// to the commit.
func CommitFS(repo *git.Repository, c *object.Commit, subdir string) (fs.FS, error) {
	t := &treeFS{s: repo.Storer, when: c.Committer.When, trees: map[plumbing.Hash]*listedTree{}}
	t.root = c.TreeHash
	if subdir != "" && subdir != "." {
		e, err := t.find(subdir)
		if err != nil {
			return nil, fmt.Errorf("%s in commit %s: %w", subdir, c.Hash, err)
		}
		if e.Mode != filemode.Dir {
			return nil, fmt.Errorf("%s in commit %s is not a directory", subdir, c.Hash)
		}
		t.root = e.Hash
		t.trees, t.treeBytes = map[plumbing.Hash]*listedTree{}, 0
	}
	return t, nil
}

// treeFS serves a git tree through io/fs. Trees are checked when first
// listed; blobs are read when opened.
type treeFS struct {
	s    storer.EncodedObjectStorer
	root plumbing.Hash
	when time.Time

	mu        gosync.Mutex
	trees     map[plumbing.Hash]*listedTree
	treeBytes int64 // the size of the trees read so far
}

// listedTree is a tree whose entries were checked.
type listedTree struct {
	entries []object.TreeEntry
	byName  map[string]int
}

// tree reads and checks tree h, found at dir.
func (t *treeFS) tree(h plumbing.Hash, dir string) (*listedTree, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if lt, ok := t.trees[h]; ok {
		return lt, nil
	}
	size, err := objectSize(t.s, h)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	if size > render.MaxFileSize || t.treeBytes+size > render.MaxRepoSize {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: render.ErrTooLarge}
	}
	t.treeBytes += size
	tree, err := object.GetTree(t.s, h)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	lt := &listedTree{entries: tree.Entries, byName: make(map[string]int, len(tree.Entries))}
	for i, e := range tree.Entries {
		if msg := badName(e.Name); msg != "" {
			return nil, &fs.PathError{Op: "readdir", Path: dir, Err: fmt.Errorf("%w: %s", render.ErrInvalidTree, msg)}
		}
		if _, dup := lt.byName[e.Name]; dup {
			return nil, &fs.PathError{Op: "readdir", Path: dir, Err: fmt.Errorf("%w: two entries are named %q", render.ErrInvalidTree, e.Name)}
		}
		lt.byName[e.Name] = i
	}
	t.trees[h] = lt
	return lt, nil
}

// badName says why a tree entry's name cannot be checked out, or "".
func badName(name string) string {
	switch {
	case name == "":
		return "an entry has an empty name"
	case name == "." || name == "..":
		return fmt.Sprintf("an entry is named %q", name)
	case strings.EqualFold(name, ".git"):
		return fmt.Sprintf("an entry is named %q, which only git itself may use", name)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Sprintf("the entry %q has a slash or a NUL in its name", name)
	case !utf8.ValidString(name):
		return fmt.Sprintf("the entry %q is not valid UTF-8", name)
	}
	return ""
}

// find returns the entry at name, a valid path other than ".".
func (t *treeFS) find(name string) (object.TreeEntry, error) {
	h, dir := t.root, "."
	parts := strings.Split(name, "/")
	for i, part := range parts {
		lt, err := t.tree(h, dir)
		if err != nil {
			return object.TreeEntry{}, err
		}
		j, ok := lt.byName[part]
		if !ok {
			return object.TreeEntry{}, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		e := lt.entries[j]
		if i == len(parts)-1 {
			return e, nil
		}
		if e.Mode != filemode.Dir {
			return object.TreeEntry{}, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		h, dir = e.Hash, path.Join(dir, part)
	}
	panic("unreachable")
}

func (t *treeFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		lt, err := t.tree(t.root, ".")
		if err != nil {
			return nil, err
		}
		return &treeDir{info: t.info(".", filemode.Dir, 0), tree: lt, fsys: t, path: "."}, nil
	}
	e, err := t.find(name)
	if err != nil {
		return nil, err
	}
	switch {
	case e.Mode == filemode.Dir:
		lt, err := t.tree(e.Hash, name)
		if err != nil {
			return nil, err
		}
		return &treeDir{info: t.info(path.Base(name), e.Mode, 0), tree: lt, fsys: t, path: name}, nil
	case !isBlob(e.Mode):
		return nil, &fs.PathError{Op: "open", Path: name, Err: render.ErrNotRegular}
	}
	data, err := readBlob(t.s, e.Hash, render.MaxFileSize)
	if errors.Is(err, render.ErrTooLarge) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: render.ErrTooLarge}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return &treeFile{info: t.info(path.Base(name), e.Mode, int64(len(data))), Reader: bytes.NewReader(data)}, nil
}

// isBlob reports whether a tree entry of mode m is a file's content.
func isBlob(m filemode.FileMode) bool {
	return m == filemode.Regular || m == filemode.Executable || m == filemode.Deprecated
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
	switch {
	case i.mode == filemode.Dir:
		return fs.ModeDir | 0o555
	case i.mode == filemode.Symlink:
		return fs.ModeSymlink | 0o444
	case i.mode == filemode.Executable:
		return 0o555
	case isBlob(i.mode):
		return 0o444
	default: // a submodule, or a mode git does not write
		return fs.ModeIrregular | 0o444
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
	tree *listedTree
	fsys *treeFS
	path string
	pos  int
}

func (d *treeDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *treeDir) Close() error               { return nil }
func (d *treeDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.path, Err: errors.New("is a directory")}
}

func (d *treeDir) ReadDir(n int) ([]fs.DirEntry, error) {
	entries := d.tree.entries[d.pos:]
	if n > 0 && len(entries) > n {
		entries = entries[:n]
	}
	if n > 0 && len(entries) == 0 {
		return nil, io.EOF
	}
	out := make([]fs.DirEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, dirEntry{fileInfo: d.fsys.info(e.Name, e.Mode, 0), fsys: d.fsys, entry: e})
	}
	d.pos += len(entries)
	return out, nil
}

// dirEntry is a tree entry; its size is looked up, from the object's
// header, only when Info is asked for, since a walk needs names and types.
type dirEntry struct {
	fileInfo
	fsys  *treeFS
	entry object.TreeEntry
}

func (e dirEntry) Info() (fs.FileInfo, error) {
	info := e.fileInfo
	if isBlob(e.entry.Mode) {
		size, err := objectSize(e.fsys.s, e.entry.Hash)
		if err != nil {
			return nil, err
		}
		info.size = size
	}
	return info, nil
}
