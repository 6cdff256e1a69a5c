// Package oci pulls OCI images by digest into a node's blob cache and
// unpacks them into a directory, for the drivers that run instances from
// them (docs/images.md).
//
// The registry protocol is go-containerregistry's (pkg/v1/remote): it
// checks that the manifest fetched is the one the digest names, resolves
// an index to the node's platform, and verifies each blob against its
// digest and size as it is read. A layer is downloaded whole into the
// cache (blobs/sha256/<hex>, renamed into place only once verified) before
// anything of it is unpacked, so nothing unverified ever reaches a root.
// Layers are shared between the images that use them.
//
// Unpack applies the layers in order into a directory through an os.Root
// (nothing can be written outside it, whatever symlinks the layers hold),
// honours whiteouts and opaque directories, keeps modes and, when running
// as root, ownership, and refuses a layer that holds an absolute or
// climbing path, a device node or a FIFO.
package oci

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	gosync "sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/keel-dev/keel/render"
)

// Default limits of an image: what its layers may weigh compressed, as
// their manifest declares (checked before anything is downloaded), and
// unpacked (checked while unpacking: a layer that inflates past it is
// refused).
const (
	DefaultMaxCompressed = 8 << 30
	DefaultMaxUnpacked   = 32 << 30
	// maxConfig bounds an image's config blob, declared in its manifest.
	maxConfig = 4 << 20
	// maxLayers bounds an image's layers (Docker allows 127 in practice).
	maxLayers = 256
	// fetchJobs is how many layers of an image download at once.
	fetchJobs = 3
)

// Puller fetches images into a blob cache. It is safe for concurrent use:
// two pulls that need one layer download it once.
type Puller struct {
	// Dir holds the cache: blobs/sha256/<hex>.
	Dir string
	// Keychain gives the credentials for a registry (anonymous when nil);
	// see KeychainFromConfig.
	Keychain authn.Keychain
	// Transport makes the registry requests (http.DefaultTransport when
	// nil). A registry on localhost or 127.0.0.1 is spoken to over plain
	// HTTP, any other over HTTPS.
	Transport http.RoundTripper
	// Platform picks an index's manifest: the node's OS and architecture
	// (runtime.GOOS and GOARCH when zero).
	Platform v1.Platform
	// Stall bounds the time an artifact's download may go without a byte
	// (DefaultStall when 0).
	Stall time.Duration
	// MaxCompressed and MaxUnpacked bound an image (the defaults when 0).
	MaxCompressed, MaxUnpacked int64
	Log                        *slog.Logger

	mu       gosync.Mutex
	fetching map[string]*blobFetch // layer downloads in flight, by digest
	pinned   map[string]int        // layers an image being pulled needs, by digest
}

// blobFetch is one layer's download, shared by the pulls that need it.
type blobFetch struct {
	done chan struct{}
	err  error
}

// Image is an image whose layers are in the cache, ready to unpack.
type Image struct {
	// Digest is the digest pulled (a manifest's or an index's); Manifest
	// is the manifest's digest, the same unless Digest named an index.
	Digest, Manifest string
	Layers           []Layer
	// Config is the image's config: its default command, environment
	// and working directory.
	Config v1.Config
	// Size is the layers' compressed size.
	Size int64
}

// LayerDigests are the digests of the image's layers.
func (img *Image) LayerDigests() []string {
	out := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		out[i] = l.Digest
	}
	return out
}

// Layer is a layer in the cache.
type Layer struct {
	Digest    string
	MediaType types.MediaType
	Size      int64
	// Path is the verified blob in the cache.
	Path string
}

// Progress is how far a pull has come, for logs and reports.
type Progress struct {
	Done, Total int64 // bytes of layers in the cache, of all the image's
}

func (p *Puller) maxCompressed() int64 {
	if p.MaxCompressed > 0 {
		return p.MaxCompressed
	}
	return DefaultMaxCompressed
}

func (p *Puller) log() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (p *Puller) platform() v1.Platform {
	if p.Platform.OS != "" {
		return p.Platform
	}
	return v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
}

// blobPath is where a verified blob lives in the cache.
func (p *Puller) blobPath(d v1.Hash) string {
	return filepath.Join(p.Dir, "blobs", d.Algorithm, d.Hex)
}

// Fetch resolves ref (an OCI image of a spec, render.ParseImage), checks
// its manifest against the digest and downloads its layers into the
// cache, each verified against its digest; layers already there are not
// downloaded again. progress, when not nil, is called as layers arrive.
func (p *Puller) Fetch(ctx context.Context, ref render.ImageRef, progress func(Progress)) (*Image, error) {
	if !ref.IsOCI() {
		return nil, fmt.Errorf("%s is not an OCI image", ref.Base)
	}
	dref, err := name.NewDigest(ref.Name(), name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref.Name(), err)
	}
	img, err := remote.Image(dref, p.remoteOptions(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref.Name(), err)
	}
	manifest, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", ref.Name(), err)
	}
	mdigest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", ref.Name(), err)
	}
	if manifest.Config.Size > maxConfig || manifest.Config.Size < 0 {
		return nil, fmt.Errorf("%s: its config is declared as %d bytes, more than the %d allowed", ref.Name(), manifest.Config.Size, maxConfig)
	}
	if len(manifest.Layers) > maxLayers {
		return nil, fmt.Errorf("%s: %d layers, more than the %d allowed", ref.Name(), len(manifest.Layers), maxLayers)
	}
	out := &Image{Digest: ref.Digest, Manifest: mdigest.String()}
	for _, l := range manifest.Layers {
		if len(l.URLs) > 0 {
			return nil, fmt.Errorf("%s: layer %s is to be fetched from elsewhere than the registry (%s): refused", ref.Name(), l.Digest, l.URLs[0])
		}
		if !layerMediaType(l.MediaType) {
			return nil, fmt.Errorf("%s: layer %s has media type %q, which Keel cannot unpack (want an OCI or Docker tar layer, uncompressed, gzip or zstd)", ref.Name(), l.Digest, l.MediaType)
		}
		if l.Size < 0 || l.Size > p.maxCompressed()-out.Size {
			return nil, fmt.Errorf("%s: its layers weigh more than the %d bytes allowed (compressed)", ref.Name(), p.maxCompressed())
		}
		if l.Digest.Algorithm != "sha256" || len(l.Digest.Hex) != 64 {
			return nil, fmt.Errorf("%s: layer digest %s is not sha256", ref.Name(), l.Digest)
		}
		out.Size += l.Size
		out.Layers = append(out.Layers, Layer{Digest: l.Digest.String(), MediaType: l.MediaType, Size: l.Size, Path: p.blobPath(l.Digest)})
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", ref.Name(), err)
	}
	out.Config = cf.Config

	// The layers stay in the cache until the caller has unpacked them
	// (Unpin): a collection leaves them alone.
	p.pin(out.LayerDigests(), 1)
	pinned := true
	defer func() {
		if pinned {
			p.pin(out.LayerDigests(), -1)
		}
	}()
	var mu gosync.Mutex
	var done int64
	report := func(n int64) {
		mu.Lock()
		done += n
		d := done
		mu.Unlock()
		if progress != nil {
			progress(Progress{Done: d, Total: out.Size})
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchJobs)
	for i, l := range manifest.Layers {
		g.Go(func() error {
			if err := p.fetchBlob(gctx, img, l, out.Layers[i].Path); err != nil {
				return fmt.Errorf("%s: layer %s: %w", ref.Name(), l.Digest, err)
			}
			report(l.Size)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	pinned = false
	return out, nil
}

// remoteOptions are the registry requests' options: the node's platform
// and credentials, plain HTTP to a loopback registry only.
func (p *Puller) remoteOptions(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(p.platform()),
		remote.WithUserAgent("keel"),
		remote.WithAuthFromKeychain(cmpKeychain(p.Keychain)),
		remote.WithTransport(loopbackHTTPOnly{cmp.Or[http.RoundTripper](p.Transport, http.DefaultTransport)}),
	}
}

// pin counts the images being pulled that need each layer.
func (p *Puller) pin(layers []string, by int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pinned == nil {
		p.pinned = map[string]int{}
	}
	for _, d := range layers {
		if p.pinned[d] += by; p.pinned[d] <= 0 {
			delete(p.pinned, d)
		}
	}
}

// Unpin tells that img, returned by Fetch, is unpacked (or given up):
// its layers may be collected again. Every image Fetch returns must be
// unpinned once.
func (p *Puller) Unpin(img *Image) { p.pin(img.LayerDigests(), -1) }

// Sweep removes what a pull cut short by a crash left in the cache
// (partial downloads). Call it before any pull starts.
func (p *Puller) Sweep() error {
	partial, err := filepath.Glob(filepath.Join(p.Dir, "blobs", "sha256", ".*.partial-*"))
	if err != nil {
		return err
	}
	for _, f := range partial {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// loopbackHTTPOnly refuses plain HTTP to anything but a loopback
// registry: go-containerregistry would speak HTTP to private addresses
// too, and fall back to it when HTTPS fails, sending the registry's
// credentials in the clear.
type loopbackHTTPOnly struct{ next http.RoundTripper }

func (t loopbackHTTPOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !loopbackHost(req.URL.Hostname()) {
		return nil, fmt.Errorf("refusing plain HTTP to registry %s: only a registry on 127.0.0.1, ::1 or localhost is spoken to without TLS", req.URL.Host)
	}
	return t.next.RoundTrip(req)
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// fetchBlob makes sure the layer l of img is in the cache at path,
// downloading it when missing; a download that another pull has under
// way is waited for rather than made twice.
func (p *Puller) fetchBlob(ctx context.Context, img v1.Image, l v1.Descriptor, path string) error {
	return p.once(ctx, l.Digest.String(), path, func() bool { return cachedSize(path) == l.Size }, func() error {
		return p.download(ctx, img, l, path)
	})
}

// download copies the layer into a temporary file next to path, verified
// (go-containerregistry's reader fails at the end on a wrong digest or
// size), synced, and renames it into place.
func (p *Puller) download(ctx context.Context, img v1.Image, l v1.Descriptor, path string) error {
	start := time.Now()
	layer, err := img.LayerByDigest(l.Digest)
	if err != nil {
		return err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	err = writeBlob(path, func(w io.Writer) error {
		// The reader checks the digest once it reaches the end; a blob
		// longer than declared fails there too, so the limit is only a
		// guard against reading forever.
		n, err := io.Copy(w, io.LimitReader(ctxReader{ctx, rc}, l.Size+1))
		if err == nil && n != l.Size {
			err = fmt.Errorf("got %d bytes, the manifest says %d", n, l.Size)
		}
		return err
	})
	if err != nil {
		return err
	}
	p.log().Debug("layer downloaded", "digest", l.Digest.String(), "bytes", l.Size, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// writeBlob puts a blob into the cache at path: fill writes it into a
// temporary file beside path (.<name>.partial-*, which Sweep removes
// after a crash), which is synced and renamed into place only when fill
// succeeds, so the cache never holds a blob that was not verified whole.
func writeBlob(path string, fill func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	err = fill(tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// ctxReader stops a read once ctx ends (a registry that stalls mid-blob
// is left by the pull's context, not by a read that never returns: the
// transport's request carries the context too).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// layerMediaType reports whether a layer's media type is a file system
// layer Unpack knows (uncompressed, gzip or zstd: Unpack tells them apart
// by their first bytes).
func layerMediaType(mt types.MediaType) bool {
	switch mt {
	case types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer,
		types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer,
		types.DockerLayer, types.DockerUncompressedLayer:
		return true
	}
	return false
}

// CheckDigest is a digest's hex part when it is a sha256 digest, for
// callers that turn it into a path or a dataset name.
func CheckDigest(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%q is not a sha256 digest", digest)
	}
	return hex, nil
}

func cmpKeychain(k authn.Keychain) authn.Keychain {
	if k == nil {
		return anonymous{}
	}
	return k
}

type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

// ErrLayerInUse is returned by RemoveBlob for a layer a pull needs.
var ErrLayerInUse = errors.New("in use by a pull under way")

// BlobInfo is a blob in the cache: a layer or an artifact.
type BlobInfo struct {
	Size int64
	// Added is when it was downloaded.
	Added time.Time
}

// Blobs lists the layers and artifacts in the cache, by digest.
func (p *Puller) Blobs() (map[string]BlobInfo, error) {
	dir := filepath.Join(p.Dir, "blobs", "sha256")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]BlobInfo{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]BlobInfo{}
	for _, e := range entries {
		if _, err := CheckDigest("sha256:" + e.Name()); err != nil || !e.Type().IsRegular() {
			continue // a download under way (.partial-*), or not Keel's
		}
		if fi, err := e.Info(); err == nil {
			out["sha256:"+e.Name()] = BlobInfo{Size: fi.Size(), Added: fi.ModTime()}
		}
	}
	return out, nil
}

// RemoveBlob removes a layer or an artifact from the cache. A pull that
// needs it later downloads it again.
func (p *Puller) RemoveBlob(digest string) error {
	hex, err := CheckDigest(digest)
	if err != nil {
		return err
	}
	p.mu.Lock()
	_, busy := p.fetching[digest]
	pinned := p.pinned[digest] > 0
	p.mu.Unlock()
	if busy || pinned {
		return fmt.Errorf("layer %s: %w", digest, ErrLayerInUse)
	}
	err = os.Remove(filepath.Join(p.Dir, "blobs", "sha256", hex))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
