// Package ocitest serves OCI images from go-containerregistry's registry
// on 127.0.0.1 and builds them from tar entries, for tests.
package ocitest

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/keel-dev/keel/render"
)

// Entry is a tar entry of a test layer.
type Entry struct {
	Name     string
	Type     byte
	Body     string
	Mode     int64
	Link     string
	UID, GID int
}

// File, Dir, Symlink and Hardlink are entries of their kinds.
func File(name, body string, mode int64) Entry {
	return Entry{Name: name, Type: tar.TypeReg, Body: body, Mode: mode}
}
func Dir(name string, mode int64) Entry { return Entry{Name: name, Type: tar.TypeDir, Mode: mode} }
func Symlink(name, to string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Link: to, Mode: 0o777}
}
func Hardlink(name, to string) Entry {
	return Entry{Name: name, Type: tar.TypeLink, Link: to, Mode: 0o644}
}

// MTime is the modification time of every entry.
var MTime = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// Layer is a layer of the entries, compressed with comp.
func Layer(t testing.TB, comp compression.Compression, ents ...Entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Size: int64(len(e.Body)), Linkname: e.Link,
			Uid: e.UID, Gid: e.GID, ModTime: MTime, Format: tar.FormatPAX}
		if e.Type == tar.TypeChar || e.Type == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if e.Type != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil && e.Type == tar.TypeReg {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompression(comp))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image of the layers, bottom first.
func Image(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry is go-containerregistry's registry on 127.0.0.1 (spoken to
// over plain HTTP, as every registry on loopback), with a count of the
// blob downloads and a hook to break it.
type Registry struct {
	Host  string
	Blobs atomic.Int64
	// serve, when set, answers a request instead of the registry.
	serve atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]
	srv   *httptest.Server
}

// NewRegistry starts a registry, closed when the test ends.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	reg := &Registry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := reg.serve.Load(); f != nil && (*f)(w, r) {
			return
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			reg.Blobs.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg.srv.Listener = l
	reg.srv.Start()
	t.Cleanup(reg.srv.Close)
	reg.Host = l.Addr().String()
	return reg
}

// Serve sets a hook that answers the requests it returns true for,
// instead of the registry (nil: none).
func (reg *Registry) Serve(f func(w http.ResponseWriter, r *http.Request) bool) {
	if f == nil {
		reg.serve.Store(nil)
		return
	}
	reg.serve.Store(&f)
}

// Push writes img to the registry as repo:latest and returns its
// reference pinned by digest.
func (reg *Registry) Push(t testing.TB, repo string, img v1.Image) render.ImageRef {
	t.Helper()
	tag, err := name.NewTag(reg.Host + "/" + repo + ":latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := render.ParseImage(render.OCIPrefix + reg.Host + "/" + repo + "@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// Spec is ref as a spec.image.
func Spec(ref render.ImageRef) string { return render.OCIPrefix + ref.Name() }

// BigImage is an image of layers layers of size random bytes each (gzip
// cannot shrink them), each with one big file and 200 small ones, for
// benchmarks.
func BigImage(t testing.TB, layers, size int) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for i := range layers {
		big := make([]byte, size)
		if _, err := rand.Read(big); err != nil {
			t.Fatal(err)
		}
		ents := []Entry{File(fmt.Sprintf("usr/lib/big%d", i), string(big), 0o644)}
		for j := range 200 {
			ents = append(ents, File(fmt.Sprintf("usr/share/l%d/f%d", i, j), fmt.Sprintf("file %d of layer %d\n", j, i), 0o644))
		}
		ls = append(ls, Layer(t, compression.GZip, ents...))
	}
	return Image(t, ls...)
}
