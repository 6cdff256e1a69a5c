package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/keel-dev/keel/render"
)

// Artifacts (docs/images.md, "Artifacts") are files an instance's spec
// names by URL and SHA-256. They share the layers' cache: a file is kept
// as blobs/sha256/<its sha256>, downloaded once per node into a temporary
// file, hashed as it arrives and renamed into place only when it matches,
// so a cached artifact is always a verified one. Placing one copies it
// (or extracts it) into an instance's root through an os.Root, hashing it
// again as it is read.

// maxRedirects bounds the redirects an artifact's download follows.
const maxRedirects = 5

// ArtifactPath is where the artifact of sha256 hex h is in the cache.
func (p *Puller) ArtifactPath(h string) (string, error) {
	if _, err := CheckDigest("sha256:" + h); err != nil {
		return "", err
	}
	return p.blobPath(v1.Hash{Algorithm: "sha256", Hex: h}), nil
}

// HasArtifact reports whether the artifact is in the cache.
func (p *Puller) HasArtifact(a render.Artifact) bool {
	path, err := p.ArtifactPath(a.SHA256)
	if err != nil {
		return false
	}
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().IsRegular()
}

// FetchArtifact makes sure the artifact a is in the cache, downloading it
// when it is not: over HTTPS, or from a registry for an oci:// URL (the
// layer of the artifact's manifest whose digest is a.SHA256). What is
// downloaded is bounded by MaxCompressed and must hash to a.SHA256;
// anything else is thrown away. It returns the path of the cached file.
// Two fetches of one file download it once.
func (p *Puller) FetchArtifact(ctx context.Context, a render.Artifact, progress func(Progress)) (string, error) {
	path, err := p.ArtifactPath(a.SHA256)
	if err != nil {
		return "", err
	}
	digest := "sha256:" + a.SHA256
	switch {
	case strings.HasPrefix(a.URL, render.OCIPrefix):
		ref, err := render.ParseImage(a.URL)
		if err != nil || !ref.IsOCI() || ref.Digest == "" {
			return "", fmt.Errorf("artifact %s: not an OCI reference pinned by digest", publicURL(a.URL))
		}
		if cachedSize(path) >= 0 {
			// Verified when it was cached, as for https: the registry
			// (down, maybe) need not be asked for the manifest again.
			return path, nil
		}
		img, desc, err := p.artifactLayer(ctx, ref, digest)
		if err != nil {
			return "", err
		}
		err = p.once(ctx, digest, path, func() bool { return cachedSize(path) == desc.Size }, func() error {
			return p.download(ctx, img, desc, path)
		})
		if err != nil {
			return "", fmt.Errorf("artifact %s: %w", ref.Name(), err)
		}
		if progress != nil {
			progress(Progress{Done: desc.Size, Total: desc.Size})
		}
		return path, nil
	case len(a.URL) > len("https://") && strings.EqualFold(a.URL[:len("https://")], "https://"): // any case, as render takes it
		err := p.once(ctx, digest, path, func() bool { return cachedSize(path) >= 0 }, func() error {
			return p.downloadHTTPS(ctx, a, path, progress)
		})
		if err != nil {
			return "", fmt.Errorf("artifact %s: %w", publicURL(a.URL), err)
		}
		return path, nil
	}
	return "", fmt.Errorf("artifact %s: only https:// and oci:// URLs are fetched", publicURL(a.URL))
}

// cachedSize is the size of the regular file at path, -1 when there is
// none.
func cachedSize(path string) int64 {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return -1
	}
	return fi.Size()
}

// artifactLayer resolves an OCI artifact's manifest (checked against its
// digest) and finds the layer whose digest is digest.
func (p *Puller) artifactLayer(ctx context.Context, ref render.ImageRef, digest string) (v1.Image, v1.Descriptor, error) {
	dref, err := name.NewDigest(ref.Name(), name.StrictValidation)
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("artifact %s: %w", ref.Name(), err)
	}
	img, err := remote.Image(dref, p.remoteOptions(ctx)...)
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("artifact %s: %w", ref.Name(), err)
	}
	manifest, err := img.Manifest()
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("artifact %s: manifest: %w", ref.Name(), err)
	}
	for _, l := range manifest.Layers {
		if l.Digest.String() != digest {
			continue
		}
		if len(l.URLs) > 0 {
			return nil, v1.Descriptor{}, fmt.Errorf("artifact %s: its file is to be fetched from elsewhere than the registry (%s): refused", ref.Name(), l.URLs[0])
		}
		if l.Size < 0 || l.Size > p.maxCompressed() {
			return nil, v1.Descriptor{}, fmt.Errorf("artifact %s: its file is declared as %d bytes, more than the %d allowed", ref.Name(), l.Size, p.maxCompressed())
		}
		return img, l, nil
	}
	return nil, v1.Descriptor{}, fmt.Errorf("artifact %s: none of the manifest's %d layers is %s (the spec's sha256)", ref.Name(), len(manifest.Layers), digest)
}

// once runs fetch for the blob digest unless have reports it cached, or
// waits for the fetch of it that another pull has under way.
func (p *Puller) once(ctx context.Context, digest, path string, have func() bool, fetch func() error) error {
	for {
		if have() {
			return nil
		}
		p.mu.Lock()
		if p.fetching == nil {
			p.fetching = map[string]*blobFetch{}
		}
		f, busy := p.fetching[digest]
		if !busy {
			f = &blobFetch{done: make(chan struct{})}
			p.fetching[digest] = f
		}
		p.mu.Unlock()
		if busy {
			select {
			case <-f.done:
				if f.err != nil && ctx.Err() == nil && !errors.Is(f.err, context.Canceled) {
					return f.err
				}
				continue // done (or the other pull gave up): look again
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		f.err = fetch()
		p.mu.Lock()
		delete(p.fetching, digest)
		p.mu.Unlock()
		close(f.done)
		return f.err
	}
}

// downloadHTTPS downloads the artifact into a temporary file next to
// path, hashing it as it arrives, and renames it into place once it is
// whole and matches.
func (p *Puller) downloadHTTPS(ctx context.Context, a render.Artifact, path string, progress func(Progress)) error {
	start := time.Now()
	limit := p.maxCompressed()
	client := &http.Client{
		Transport: cmp.Or[http.RoundTripper](p.Transport, http.DefaultTransport),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return fmt.Errorf("redirected to %s: only https is followed", publicURL(req.URL.String()))
			}
			if len(via) > maxRedirects {
				return fmt.Errorf("more than %d redirects", maxRedirects)
			}
			return nil
		},
	}
	// A server that stops sending is left after Stall without a byte,
	// not at the pull's 30 min bound.
	stall := cmp.Or(p.Stall, DefaultStall)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(stall, func() { cancel(fmt.Errorf("no byte for %s: the server stalled", stall)) })
	defer timer.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		return errors.New("not a valid URL")
	}
	req.Header.Set("User-Agent", "keel")
	// The bytes as served: asking for no encoding keeps the transport
	// from requesting gzip and decoding it, so that a file stored with
	// Content-Encoding: gzip (a .tar.gz, often) is the file its sha256
	// was taken of, as curl downloads it.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := client.Do(req)
	if err != nil {
		return stalled(ctx, scrubURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the server answered %s", resp.Status)
	}
	if resp.ContentLength > limit {
		return fmt.Errorf("the server announces %d bytes, more than the %d allowed", resp.ContentLength, limit)
	}
	var n int64
	err = writeBlob(path, func(tmp io.Writer) error {
		hash := sha256.New()
		w := io.MultiWriter(tmp, hash)
		buf := make([]byte, 256<<10)
		lastReport := time.Now()
		for {
			m, rerr := ctxReader{ctx, resp.Body}.Read(buf)
			if m > 0 {
				timer.Reset(stall)
				if n += int64(m); n > limit {
					return fmt.Errorf("more than the %d bytes allowed", limit)
				}
				if _, err := w.Write(buf[:m]); err != nil {
					return err
				}
				if progress != nil && time.Since(lastReport) > 10*time.Second {
					progress(Progress{Done: n, Total: max(resp.ContentLength, n)})
					lastReport = time.Now()
				}
			}
			if errors.Is(rerr, io.EOF) {
				break
			}
			if rerr != nil {
				return stalled(ctx, scrubURLError(rerr))
			}
		}
		if got := hex.EncodeToString(hash.Sum(nil)); got != a.SHA256 {
			return fmt.Errorf("its sha256 is %s, not %s as the spec says: refused", got, a.SHA256)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if progress != nil {
		progress(Progress{Done: n, Total: n})
	}
	p.log().Debug("artifact downloaded", "url", publicURL(a.URL), "bytes", n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// DefaultStall is how long an artifact's download may go without a byte
// when Puller.Stall is zero.
const DefaultStall = 2 * time.Minute

// stalled is err, or why ctx was cancelled when the stall timer did it.
func stalled(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return err
}

// publicURL is u without its query and fragment: a pre-signed URL's
// signature stays out of logs, reports and errors.
func publicURL(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return "(an invalid URL)"
	}
	pu.RawQuery, pu.Fragment, pu.User = "", "", nil
	return pu.String()
}

// scrubURLError drops the URL (and its query) that net/http puts in its
// errors, keeping what went wrong.
func scrubURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s %s: %w", ue.Op, publicURL(ue.URL), ue.Err)
	}
	return err
}

// CachedArtifact is an artifact of an instance's spec with its file in
// the cache (FetchArtifact), ready to place.
type CachedArtifact struct {
	render.Artifact
	// Blob is the cached file.
	Blob string
}

// PlaceArtifacts puts each artifact into the directory root (an
// instance's root): a file is written aside, with its mode, and renamed
// over whatever was at its path (never written through: a root's files
// may be hard links to an image's); an archive is extracted into the
// directory at its path, its entries replacing what is there, under the
// rules and limits of Unpack (max bounds its bytes). Every file is hashed
// again as it is read and must still match its sha256. Nothing is
// written outside root, whatever links it holds.
func PlaceArtifacts(ctx context.Context, root string, arts []CachedArtifact, max int64) error {
	if len(arts) == 0 {
		return nil
	}
	if max <= 0 {
		max = DefaultMaxUnpacked
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, a := range arts {
		var err error
		if a.Archive == "" {
			err = placeFile(ctx, r, a)
		} else {
			err = extractArtifact(ctx, r, a, max)
		}
		if err != nil {
			return fmt.Errorf("artifact %s: %w", a.Path, err)
		}
		// Used now: the collection's grace counts from here.
		now := time.Now()
		_ = os.Chtimes(a.Blob, now, now)
	}
	return nil
}

// CheckArtifact checks a cached artifact before any instance starts with
// it: its file still matches its sha256 and, for an archive, its format
// is the one named and every entry would be extracted (no absolute or
// climbing path, no device node or FIFO, at most max bytes: 0 for
// DefaultMaxUnpacked). What only the root can tell (a directory where a
// file goes) is found when it is placed.
func CheckArtifact(ctx context.Context, a CachedArtifact, max int64) error {
	if err := checkBlob(a); err != nil {
		return err
	}
	if a.Archive == "" {
		return nil
	}
	if err := checkArchive(a); err != nil {
		return err
	}
	if max <= 0 {
		max = DefaultMaxUnpacked
	}
	f, err := os.Open(a.Blob)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrArtifactCache, err)
	}
	defer f.Close()
	r, closeR, err := decompress(ctxReader{ctx, f})
	if err != nil {
		return err
	}
	defer closeR()
	tr := tar.NewReader(r)
	entries, names := maxEntries, maxNameBytes
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the tar: %w", err)
		}
		if entries--; entries < 0 {
			return fmt.Errorf("more than %d entries", maxEntries)
		}
		if names -= len(h.Name) + len(h.Linkname); names < 0 {
			return fmt.Errorf("paths of more than %d bytes together", maxNameBytes)
		}
		if _, err := cleanName(h.Name); err != nil {
			return fmt.Errorf("%q: %w", h.Name, err)
		}
		switch h.Typeflag {
		case tar.TypeXGlobalHeader, tar.TypeDir, tar.TypeSymlink:
		case tar.TypeReg:
			if max -= h.Size; max < 0 {
				return errors.New("it unpacks to more than the bytes allowed (--image-max-unpacked)")
			}
		case tar.TypeLink:
			if _, err := cleanName(h.Linkname); err != nil {
				return fmt.Errorf("%q: hard link to %q: %w", h.Name, h.Linkname, err)
			}
		case tar.TypeChar, tar.TypeBlock:
			return fmt.Errorf("%q: a device node: refused (a jail's /dev is devfs)", h.Name)
		case tar.TypeFifo:
			return fmt.Errorf("%q: a FIFO: refused", h.Name)
		default:
			return fmt.Errorf("%q: entry type %q: refused", h.Name, h.Typeflag)
		}
	}
}

// inRoot is an artifact's path relative to the root, or an error for one
// that is not absolute and clean (render refuses those; this is the last
// line before the path is used).
func inRoot(p string) (string, error) {
	rel, ok := strings.CutPrefix(p, "/")
	if !ok || rel == "" || path.Clean(p) != p {
		return "", fmt.Errorf("path %q is not an absolute, clean path below /", p)
	}
	return cleanName(rel)
}

// tmpPrefix names the file an artifact is written to before its rename.
const tmpPrefix = ".keel-artifact-"

// removeStale removes what a placing cut short (a crash) left in dir.
func removeStale(r *os.Root, dir string) {
	f, err := r.Open(dir)
	if err != nil {
		return
	}
	names, _ := f.Readdirnames(-1)
	f.Close()
	for _, n := range names {
		if strings.HasPrefix(n, tmpPrefix) {
			_ = r.Remove(path.Join(dir, n))
		}
	}
}

func placeFile(ctx context.Context, r *os.Root, a CachedArtifact) (err error) {
	rel, err := inRoot(a.Path)
	if err != nil {
		return err
	}
	if dir := path.Dir(rel); dir != "." {
		if err := r.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if fi, err := r.Lstat(rel); err == nil && fi.IsDir() {
		return errors.New("a directory is there in the root")
	}
	in, err := os.Open(a.Blob)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrArtifactCache, err)
	}
	defer in.Close()
	removeStale(r, path.Dir(rel))
	tmp := path.Join(path.Dir(rel), tmpPrefix+rand.Text())
	out, err := r.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = r.Remove(tmp)
		}
	}()
	hash := sha256.New()
	_, err = io.Copy(out, io.TeeReader(ctxReader{ctx, in}, hash))
	if err == nil && hex.EncodeToString(hash.Sum(nil)) != a.SHA256 {
		err = errCacheChanged
	}
	if err == nil {
		// Explicitly, as the umask narrowed what OpenFile created.
		err = out.Chmod(fs.FileMode(cmp.Or(a.Mode, render.DefaultArtifactMode)) & fs.ModePerm)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return r.Rename(tmp, rel)
}

// checkBlob hashes the cached file and refuses it unless it matches.
func checkBlob(a CachedArtifact) error {
	f, err := os.Open(a.Blob)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrArtifactCache, err)
	}
	defer f.Close()
	hash := sha256.New()
	if _, err := io.Copy(hash, f); err != nil {
		return err
	}
	if hex.EncodeToString(hash.Sum(nil)) != a.SHA256 {
		return errCacheChanged
	}
	return nil
}

// ErrArtifactCache is returned (wrapped) when an artifact's cached file is
// missing or no longer matches its sha256: it is to be fetched again.
var ErrArtifactCache = errors.New("the cached file is missing or does not match its sha256")

var errCacheChanged = fmt.Errorf("%w (changed since it was fetched: it is fetched again)", ErrArtifactCache)

// archiveMagic is how each archive format's file begins (a plain tar has
// neither compression's).
var archiveMagic = map[string][]byte{
	render.ArchiveTarGz:   {0x1f, 0x8b},
	render.ArchiveTarZstd: {0x28, 0xb5, 0x2f, 0xfd},
}

func extractArtifact(ctx context.Context, r *os.Root, a CachedArtifact, max int64) error {
	rel, err := inRoot(a.Path)
	if err != nil {
		return err
	}
	if err := checkArchive(a); err != nil {
		return err
	}
	// Checked whole before anything of it is extracted (and hashed again
	// as it is: the unpacker's own check), so that a cached archive
	// changed since its download leaves nothing in the root.
	if err := checkBlob(a); err != nil {
		return err
	}
	if fi, err := r.Lstat(rel); err == nil && !fi.IsDir() {
		return errors.New("something other than a directory is there in the root")
	}
	if err := r.MkdirAll(rel, 0o755); err != nil {
		return err
	}
	sub, err := r.OpenRoot(rel)
	if err != nil {
		return err
	}
	defer sub.Close()
	u := &unpacker{ctx: ctx, root: sub, left: max, entries: maxEntries, names: maxNameBytes, chown: os.Geteuid() == 0, plain: true}
	if err := u.layer(Layer{Digest: "sha256:" + a.SHA256, Path: a.Blob}); err != nil {
		return err
	}
	return u.finish()
}

// checkArchive refuses an archive whose first bytes are not those of the
// format the spec names (render checked the name).
func checkArchive(a CachedArtifact) error {
	f, err := os.Open(a.Blob)
	if err != nil {
		return err
	}
	defer f.Close()
	head, _ := bufio.NewReader(f).Peek(4)
	var found string
	for format, magic := range archiveMagic {
		if bytes.HasPrefix(head, magic) {
			found = format
		}
	}
	switch {
	case a.Archive == render.ArchiveTar && found != "":
		return fmt.Errorf("the spec says tar, but the file is %s", found)
	case a.Archive != render.ArchiveTar && archiveMagic[a.Archive] == nil:
		return fmt.Errorf("archive format %q is not one Keel extracts", a.Archive)
	case a.Archive != render.ArchiveTar && found != a.Archive:
		return fmt.Errorf("the spec says %s, but the file is not", a.Archive)
	}
	return nil
}
