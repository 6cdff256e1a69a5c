package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// maxEntries bounds the files, directories and links of an image, and
// maxNameBytes the bytes of their paths together (what Unpack keeps in
// memory per entry).
const (
	maxEntries   = 4 << 20
	maxNameBytes = 256 << 20
	// maxPath and maxDepth bound one entry's path (PATH_MAX, and a depth
	// no real file system layout comes near), maxPAX the bytes of its
	// PAX records other than its path and link (what tar keeps per
	// header, up to 1 MiB each otherwise).
	maxPath  = 4096
	maxDepth = 256
	maxPAX   = 64 << 10
)

// Whiteouts (the OCI image spec's layer format): a file .wh.<name>
// removes <name> of the layers below; .wh..wh..opq makes its directory
// opaque: what the layers below put in it is gone.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// Unpack writes img's file system into dir, an empty directory: its
// layers in order, each over the ones below. It stops at the first
// entry it refuses, and the caller throws dir away then. max bounds the
// bytes of the files written (0: DefaultMaxUnpacked); it returns the
// bytes written.
func Unpack(ctx context.Context, img *Image, dir string, max int64) (int64, error) {
	if max <= 0 {
		max = DefaultMaxUnpacked
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	u := &unpacker{ctx: ctx, root: root, left: max, entries: maxEntries, names: maxNameBytes, chown: os.Geteuid() == 0}
	for _, l := range img.Layers {
		if err := u.layer(l); err != nil {
			return 0, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	return max - u.left, u.finish()
}

// unpacker applies layers into root.
type unpacker struct {
	ctx     context.Context
	root    *os.Root
	left    int64 // bytes that files may still take
	entries int
	names   int  // bytes of paths that entries may still take
	chown   bool // running as root: ownership is kept
	// plain is set for an archive that is not an image layer (an
	// artifact's): .wh. names are names like any other.
	plain bool
	// dirs are the directories' metadata, applied at the end (deepest
	// first) so that a read-only directory never blocks what goes in it;
	// removed says when (at which entry) a whiteout last removed a path,
	// so that the metadata of a directory removed since is not applied
	// to what is there now.
	dirs    map[string]dirMeta
	removed map[string]int
	seq     int // entries seen
	// layerPaths are the paths the current layer wrote and their parents:
	// an opaque marker removes only what the layers below put there.
	layerPaths map[string]bool
}

// dirMeta is a directory's metadata, from its tar header.
type dirMeta struct {
	mode     fs.FileMode
	uid, gid int
	mtime    time.Time
	seq      int // the entry it came from
}

// layer applies one layer.
func (u *unpacker) layer(l Layer) (err error) {
	f, err := os.Open(l.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	want, err := CheckDigest(l.Digest)
	if err != nil {
		return err
	}
	// The cached blob was verified when it was downloaded; it is hashed
	// again as it is read, so that a cache changed since (a disk error,
	// a hand) is noticed: the layer's whole content is checked at the
	// end, before the image is taken for whole.
	hash := sha256.New()
	tee := io.TeeReader(ctxReader{u.ctx, f}, hash)
	defer func() {
		if err == nil {
			if _, err = io.Copy(io.Discard, tee); err == nil && hex.EncodeToString(hash.Sum(nil)) != want {
				err = fmt.Errorf("the cached layer does not match its digest: pull it again (keel image prune removes it)")
			}
		}
	}()
	r, closeR, err := decompress(tee)
	if err != nil {
		return err
	}
	defer closeR()
	u.layerPaths = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the tar: %w", err)
		}
		u.seq++
		if u.entries--; u.entries < 0 {
			return fmt.Errorf("more than %d entries", maxEntries)
		}
		if u.names -= len(h.Name) + len(h.Linkname); u.names < 0 {
			return fmt.Errorf("paths of more than %d bytes together", maxNameBytes)
		}
		pax := 0
		for k, v := range h.PAXRecords {
			if k != "path" && k != "linkpath" {
				pax += len(k) + len(v)
			}
		}
		if pax > maxPAX {
			return fmt.Errorf("%q: PAX records of %d bytes, more than the %d allowed", h.Name, pax, maxPAX)
		}
		h.PAXRecords = nil // not kept
		if err := u.entry(h, tr); err != nil {
			return fmt.Errorf("%q: %w", h.Name, err)
		}
	}
}

// decompress reads a tar that may be gzip- or zstd-compressed, told by its
// first bytes rather than by a media type, which tools get wrong: the
// digest has pinned the bytes, whatever their label.
func decompress(in io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReader(in)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { zr.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// cleanName is an entry's path relative to the root, or an error for a
// path that is absolute or climbs out with "..". "." is the root itself.
func cleanName(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", errors.New("a NUL byte in the path")
	}
	if strings.HasPrefix(p, "/") {
		return "", errors.New("an absolute path: refused")
	}
	if len(p) > maxPath || strings.Count(p, "/") > maxDepth {
		return "", fmt.Errorf("a path longer than %d bytes or deeper than %d: refused", maxPath, maxDepth)
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return "", errors.New(`a path with "..": refused`)
		}
	}
	return path.Clean(p), nil
}

func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	if h.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	dir, base := path.Split(name)
	dir = path.Clean(dir)
	if strings.HasPrefix(base, whiteoutPrefix) && !u.plain && (h.Size != 0 || h.Typeflag != tar.TypeReg) {
		return errors.New("a whiteout that is not an empty file: refused")
	}
	if base == opaqueMarker && !u.plain {
		return u.opaque(dir)
	}
	if target, ok := strings.CutPrefix(base, whiteoutPrefix); ok && !u.plain {
		if target == "" || target == "." || target == ".." {
			return errors.New("a whiteout of nothing: refused")
		}
		if u.layerPaths[path.Join(dir, target)] {
			return nil // a whiteout hides the layers below only
		}
		return u.removeAll(path.Join(dir, target))
	}
	if name == "." {
		if h.Typeflag != tar.TypeDir {
			return errors.New("the root is not a directory: refused")
		}
		u.saveDir(name, h)
		return nil
	}
	if err := u.parents(name); err != nil {
		return err
	}
	u.mark(name)
	switch h.Typeflag {
	case tar.TypeDir:
		if fi, err := u.root.Lstat(name); err == nil && !fi.IsDir() {
			if err := u.root.Remove(name); err != nil {
				return err
			}
		}
		if err := u.root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		u.saveDir(name, h)
		return nil
	case tar.TypeReg: // archive/tar reads the old TypeRegA as TypeReg
		if err := u.replace(name); err != nil {
			return err
		}
		if h.Size > u.left {
			return fmt.Errorf("it unpacks to more than the %d bytes allowed", u.left)
		}
		f, err := u.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, io.LimitReader(ctxReader{u.ctx, r}, h.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && n != h.Size {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		u.left -= n
		return u.meta(name, headerMeta(h))
	case tar.TypeSymlink:
		if err := u.replace(name); err != nil {
			return err
		}
		// The target is kept as written: it is resolved inside the
		// jail, and Unpack itself never follows a link out of the root.
		if err := u.root.Symlink(h.Linkname, name); err != nil {
			return err
		}
		if u.chown {
			return u.root.Lchown(name, h.Uid, h.Gid)
		}
		return nil
	case tar.TypeLink:
		target, err := cleanName(h.Linkname)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", h.Linkname, err)
		}
		if fi, err := u.root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("hard link to %q: not a file of the image", h.Linkname)
		}
		if err := u.replace(name); err != nil {
			return err
		}
		return u.root.Link(target, name)
	case tar.TypeChar, tar.TypeBlock:
		return errors.New("a device node: refused (a jail's /dev is devfs)")
	case tar.TypeFifo:
		return errors.New("a FIFO: refused")
	}
	return fmt.Errorf("entry type %q: refused", h.Typeflag)
}

// parents creates the missing directories above name (mode 0755, as
// tar does; a later entry for one sets its own).
func (u *unpacker) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	fi, err := u.root.Lstat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		// A link to a directory inside the root is followed (the root
		// refuses one that leads out); to anything else, the write fails.
		return nil
	case err == nil:
		return fmt.Errorf("%s is not a directory", dir)
	}
	// Each directory made counts as an entry.
	if u.entries -= strings.Count(dir, "/") + 1; u.entries < 0 {
		return fmt.Errorf("more than %d entries", maxEntries)
	}
	return u.root.MkdirAll(dir, 0o755)
}

// replace removes whatever a lower layer put at name, for a new entry.
func (u *unpacker) replace(name string) error {
	if _, err := u.root.Lstat(name); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return u.root.RemoveAll(name)
}

// removeAll is a whiteout: name and what is below it go.
func (u *unpacker) removeAll(name string) error {
	if err := u.root.RemoveAll(name); err != nil {
		return err
	}
	if u.removed == nil {
		u.removed = map[string]int{}
	}
	u.removed[name] = u.seq
	return nil
}

// opaque removes from dir what the layers below put there.
func (u *unpacker) opaque(dir string) error {
	f, err := u.root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		u.mark(dir)
		return u.root.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !u.layerPaths[p] {
			if err := u.removeAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// mark records that the current layer wrote name, and so its parents.
func (u *unpacker) mark(name string) {
	for p := name; p != "." && !u.layerPaths[p]; p = path.Dir(p) {
		u.layerPaths[p] = true
	}
}

func (u *unpacker) saveDir(name string, h *tar.Header) {
	if u.dirs == nil {
		u.dirs = map[string]dirMeta{}
	}
	u.dirs[name] = dirMeta{mode: h.FileInfo().Mode(), uid: h.Uid, gid: h.Gid, mtime: h.ModTime, seq: u.seq}
}

// stale reports whether a whiteout removed the directory d (or one above
// it) after its metadata was saved.
func (u *unpacker) stale(d string, m dirMeta) bool {
	for p := d; ; p = path.Dir(p) {
		if at, ok := u.removed[p]; ok && at > m.seq {
			return true
		}
		if p == "." || p == "/" {
			return false
		}
	}
}

// meta sets a file's (or directory's) owner, mode (with setuid, setgid
// and sticky) and modification time.
func (u *unpacker) meta(name string, m dirMeta) error {
	if u.chown {
		if err := u.root.Lchown(name, m.uid, m.gid); err != nil {
			return err
		}
	}
	// After chown, which clears setuid and setgid.
	if err := u.root.Chmod(name, m.mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	if !m.mtime.IsZero() {
		return u.root.Chtimes(name, time.Time{}, m.mtime)
	}
	return nil
}

func headerMeta(h *tar.Header) dirMeta {
	return dirMeta{mode: h.FileInfo().Mode(), uid: h.Uid, gid: h.Gid, mtime: h.ModTime}
}

// finish applies the directories' metadata, deepest first.
func (u *unpacker) finish() error {
	names := slices.Collect(maps.Keys(u.dirs))
	slices.SortFunc(names, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, n := range names {
		if fi, err := u.root.Lstat(n); err != nil || !fi.IsDir() || u.stale(n, u.dirs[n]) {
			continue // replaced by a later layer's file, or removed since
		}
		if err := u.meta(n, u.dirs[n]); err != nil {
			return fmt.Errorf("%q: %w", n, err)
		}
	}
	return nil
}
