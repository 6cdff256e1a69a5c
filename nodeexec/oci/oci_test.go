package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
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

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
)

// ent is a tar entry of a test layer.
type ent struct {
	name     string
	typ      byte
	body     string
	mode     int64
	link     string
	uid, gid int
}

func file(name, body string, mode int64) ent {
	return ent{name: name, typ: tar.TypeReg, body: body, mode: mode}
}
func dir(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func symlink(name, to string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: to, mode: 0o777}
}
func hardlink(name, to string) ent { return ent{name: name, typ: tar.TypeLink, link: to, mode: 0o644} }

var mtime = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func layer(t testing.TB, comp compression.Compression, ents ...ent) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body)), Linkname: e.link,
			Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
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

func image(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testRegistry is go-containerregistry's registry on 127.0.0.1, with a
// count of the blob downloads and hooks to break it.
type testRegistry struct {
	host  string
	blobs atomic.Int64
	// serve, when set, answers a request instead of the registry.
	serve atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]
}

func newRegistry(t testing.TB) *testRegistry {
	t.Helper()
	reg := &testRegistry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := reg.serve.Load(); f != nil && (*f)(w, r) {
			return
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			reg.blobs.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	reg.host = l.Addr().String()
	return reg
}

// push writes img to the registry and returns its spec.image.
func (reg *testRegistry) push(t testing.TB, repo string, img v1.Image) render.ImageRef {
	t.Helper()
	tag, err := name.NewTag(reg.host + "/" + repo + ":latest")
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
	ref, err := render.ParseImage(render.OCIPrefix + reg.host + "/" + repo + "@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func pullInto(t testing.TB, p *oci.Puller, ref render.ImageRef) (string, error) {
	t.Helper()
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		return "", err
	}
	dir := t.TempDir()
	return dir, oci.Unpack(t.Context(), img, dir, 0)
}

func TestPullAndUnpack(t *testing.T) {
	reg := newRegistry(t)
	base := layer(t, compression.GZip,
		dir("bin", 0o755), file("bin/sh", "#!shell", 0o755),
		dir("etc", 0o755), file("etc/passwd", "root:*:0:0", 0o644), file("etc/old", "gone", 0o644),
		dir("opq", 0o755), file("opq/lower", "hidden", 0o644), dir("opq/sub", 0o755), file("opq/sub/deep", "hidden", 0o644),
		dir("usr/lib", 0o755), file("usr/lib/libc.so", "libc", 0o444),
		symlink("lib", "usr/lib"), symlink("abs", "/etc/passwd"),
		file("sbin/su", "su", 0o4755), dir("tmp", 0o1777),
		ent{name: "home/www", typ: tar.TypeDir, mode: 0o750, uid: 80, gid: 80},
		ent{name: "home/www/index.html", typ: tar.TypeReg, body: "<h1>hi</h1>", mode: 0o640, uid: 80, gid: 80},
		file("replaced", "a file", 0o644),
		dir("ro", 0o555), file("ro/inside", "kept", 0o444),
	)
	upper := layer(t, compression.ZStd,
		file("etc/.wh.old", "", 0o644),
		file("opq/new", "mine", 0o644),
		file("opq/.wh..wh..opq", "", 0o644),
		dir("replaced", 0o700), file("replaced/now", "a dir", 0o600),
		hardlink("bin/sh-link", "bin/sh"),
		file("lib/added", "through the link", 0o644),
	)
	top := layer(t, compression.None, file("etc/passwd", "root:*:0:0\nwww:*:80:80", 0o600))
	ref := reg.push(t, "team/web", image(t, base, upper, top))

	p := &oci.Puller{Dir: t.TempDir()}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 3 || img.Digest != ref.Digest || img.Manifest != ref.Digest || img.Size <= 0 {
		t.Fatalf("Fetch = %+v", img)
	}
	root := t.TempDir()
	if err := oci.Unpack(t.Context(), img, root, 0); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"bin/sh": "#!shell", "etc/passwd": "root:*:0:0\nwww:*:80:80", "opq/new": "mine",
		"usr/lib/libc.so": "libc", "usr/lib/added": "through the link", "replaced/now": "a dir",
		"home/www/index.html": "<h1>hi</h1>", "ro/inside": "kept",
	} {
		if got := read(p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, gone := range []string{"etc/old", "opq/lower", "opq/sub"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it gone (whiteout)", gone, err)
		}
	}
	modes := map[string]fs.FileMode{
		"bin/sh": 0o755, "etc/passwd": 0o600, "usr/lib/libc.so": 0o444, "sbin/su": 0o755 | fs.ModeSetuid,
		"tmp": 0o777 | fs.ModeSticky | fs.ModeDir, "home/www": 0o750 | fs.ModeDir, "ro": 0o555 | fs.ModeDir,
		"replaced": 0o700 | fs.ModeDir,
	}
	for p, want := range modes {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode(), err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "bin/sh")); err != nil || !fi.ModTime().Equal(mtime) {
		t.Errorf("bin/sh modified %v, want %v", fi.ModTime(), mtime)
	}
	if to, err := os.Readlink(filepath.Join(root, "abs")); err != nil || to != "/etc/passwd" {
		t.Errorf("abs -> %q, %v", to, err)
	}
	a, _ := os.Stat(filepath.Join(root, "bin/sh"))
	b, _ := os.Stat(filepath.Join(root, "bin/sh-link"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Error("bin/sh-link is not a hard link of bin/sh")
	}
	if os.Geteuid() == 0 {
		fi, err := os.Stat(filepath.Join(root, "home/www/index.html"))
		if st, ok := fi.Sys().(*syscall.Stat_t); err != nil || !ok || st.Uid != 80 || st.Gid != 80 {
			t.Errorf("home/www/index.html owner: %+v, %v; want 80:80", fi.Sys(), err)
		}
	}

	// A second pull of the same image downloads nothing.
	before := reg.blobs.Load()
	if _, err := p.Fetch(t.Context(), ref, nil); err != nil {
		t.Fatal(err)
	}
	if got := reg.blobs.Load() - before; got != 1 {
		t.Errorf("a cached image's pull fetched %d blobs, want 1 (its config)", got)
	}
}

func TestHostileLayersAreRefused(t *testing.T) {
	reg := newRegistry(t)
	outside := t.TempDir()
	for _, tc := range []struct {
		name string
		ents []ent
		want string
	}{
		{"climbing path", []ent{file("../../escape", "x", 0o644)}, `a path with "..": refused`},
		{"climbing inside", []ent{dir("a", 0o755), file("a/../../escape", "x", 0o644)}, `a path with "..": refused`},
		{"absolute path", []ent{file("/etc/escape", "x", 0o644)}, "an absolute path: refused"},
		{"device node", []ent{{name: "dev/null", typ: tar.TypeChar, mode: 0o666}}, "a device node: refused"},
		{"block device", []ent{{name: "dev/ada0", typ: tar.TypeBlock, mode: 0o640}}, "a device node: refused"},
		{"fifo", []ent{{name: "run/fifo", typ: tar.TypeFifo, mode: 0o644}}, "a FIFO: refused"},
		{"write through a symlink out", []ent{symlink("out", outside), file("out/escape", "x", 0o644)}, "escape"},
		{"write through a relative symlink out", []ent{symlink("up", "../../../../../../.."), file("up/"+strings.TrimPrefix(outside, "/")+"/escape", "x", 0o644)}, "escape"},
		{"hard link out", []ent{hardlink("passwd", "../../../../etc/passwd")}, `a path with "..": refused`},
		{"hard link through a symlink", []ent{symlink("etc", "/etc"), hardlink("passwd", "etc/passwd")}, "not a file of the image"},
		{"whiteout climbing", []ent{file("../.wh.etc", "", 0o644)}, `a path with "..": refused`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := reg.push(t, "hostile/"+strings.ReplaceAll(tc.name, " ", "-"), image(t, layer(t, compression.GZip, tc.ents...)))
			_, err := pullInto(t, &oci.Puller{Dir: t.TempDir()}, ref)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Unpack = %v, want an error containing %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("something was written outside the root: %v", entries)
			}
		})
	}
}

func TestUnpackLimit(t *testing.T) {
	reg := newRegistry(t)
	ref := reg.push(t, "bomb", image(t, layer(t, compression.GZip, file("zeros", strings.Repeat("\x00", 4<<20), 0o644))))
	p := &oci.Puller{Dir: t.TempDir()}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Size > 64<<10 {
		t.Fatalf("the bomb is %d bytes compressed", img.Size)
	}
	if err := oci.Unpack(t.Context(), img, t.TempDir(), 1<<20); err == nil || !strings.Contains(err.Error(), "more than the 1048576 bytes allowed") {
		t.Errorf("Unpack of 4 MiB with a 1 MiB limit = %v", err)
	}
	small := &oci.Puller{Dir: t.TempDir(), MaxCompressed: 100}
	if _, err := small.Fetch(t.Context(), ref, nil); err == nil || !strings.Contains(err.Error(), "more than the 100 bytes allowed (compressed)") {
		t.Errorf("Fetch over MaxCompressed = %v", err)
	}
}

func TestWrongContentIsRefused(t *testing.T) {
	reg := newRegistry(t)
	l := layer(t, compression.GZip, file("etc/motd", "the real one", 0o644))
	ref := reg.push(t, "web", image(t, l))
	ld, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	good, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(good)
	bad := bytes.Clone(data)
	bad[len(bad)-9] ^= 0xff // inside the gzip trailer's CRC: same length, another digest
	serveBad := func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
			return false
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(bad)))
		_, _ = w.Write(bad)
		return true
	}
	reg.serve.Store(&serveBad)
	p := &oci.Puller{Dir: t.TempDir()}
	if _, err := p.Fetch(t.Context(), ref, nil); err == nil || !strings.Contains(err.Error(), "error verifying sha256 checksum") {
		t.Errorf("Fetch of a corrupted layer = %v, want a checksum error", err)
	}
	if blobs, _ := filepath.Glob(filepath.Join(p.Dir, "blobs", "sha256", "*")); len(blobs) != 0 {
		t.Errorf("the corrupted layer is in the cache: %v", blobs)
	}

	// A digest the registry does not hold.
	missing := ref
	missing.Digest = "sha256:" + strings.Repeat("0", 64)
	if _, err := p.Fetch(t.Context(), missing, nil); err == nil || !strings.Contains(err.Error(), "MANIFEST_UNKNOWN") {
		t.Errorf("Fetch of a missing digest = %v", err)
	}

	// A registry that answers the manifest asked for with another.
	other := reg.push(t, "other", image(t, layer(t, compression.GZip, file("x", "y", 0o644))))
	swapped := ref
	swapped.Repository = other.Repository
	if _, err := p.Fetch(t.Context(), swapped, nil); err == nil {
		t.Error("Fetch of a digest under a repository that does not hold it succeeded")
	}
}

func TestUnreachableRegistry(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	ref, err := render.ParseImage(render.OCIPrefix + host + "/web@sha256:" + strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := (&oci.Puller{Dir: t.TempDir()}).Fetch(ctx, ref, nil); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Fetch from a closed port = %v", err)
	}
}

func TestCredentialsFromConfig(t *testing.T) {
	reg := newRegistry(t)
	ref := reg.push(t, "private/web", image(t, layer(t, compression.GZip, file("secret", "s", 0o600))))
	requireAuth := func(w http.ResponseWriter, r *http.Request) bool {
		if u, p, ok := r.BasicAuth(); ok && u == "ci" && p == "s3cret" {
			return false
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
		return true
	}
	reg.serve.Store(&requireAuth)
	if _, err := (&oci.Puller{Dir: t.TempDir()}).Fetch(t.Context(), ref, nil); err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("anonymous Fetch from a private registry = %v", err)
	}
	wrong, err := oci.KeychainFromConfig(fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, reg.host, base64.StdEncoding.EncodeToString([]byte("ci:wrong"))))
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&oci.Puller{Dir: t.TempDir(), Keychain: wrong}).Fetch(t.Context(), ref, nil)
	if err == nil {
		t.Error("Fetch with a wrong password succeeded")
	} else if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error quotes the password: %v", err)
	}
	kc, err := oci.KeychainFromConfig(fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, reg.host, base64.StdEncoding.EncodeToString([]byte("ci:s3cret"))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pullInto(t, &oci.Puller{Dir: t.TempDir(), Keychain: kc}, ref); err != nil {
		t.Errorf("Fetch with the config's credentials: %v", err)
	}
	if _, err := oci.KeychainFromConfig([]byte(`{"auths": `)); err == nil {
		t.Error("a truncated config was taken")
	}
}

func TestConcurrentPullsShareLayers(t *testing.T) {
	reg := newRegistry(t)
	shared := layer(t, compression.GZip, file("usr/lib/big", strings.Repeat("shared ", 1<<16), 0o644))
	refs := []render.ImageRef{
		reg.push(t, "a", image(t, shared, layer(t, compression.GZip, file("app", "a", 0o755)))),
		reg.push(t, "b", image(t, shared, layer(t, compression.GZip, file("app", "b", 0o755)))),
	}
	// Slow the shared layer down so that both pulls want it at once.
	sd, _ := shared.Digest()
	slow := func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/blobs/"+sd.String()) {
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}
	reg.serve.Store(&slow)
	before := reg.blobs.Load()
	p := &oci.Puller{Dir: t.TempDir()}
	var wg gosync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = p.Fetch(t.Context(), refs[i%2], nil) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Per pull a config; the shared layer once, each app layer once.
	if got := reg.blobs.Load() - before; got != 4+3 {
		t.Errorf("four concurrent pulls of two images fetched %d blobs, want 7 (4 configs, 3 layers)", got)
	}
}

func TestIndexPicksThePlatform(t *testing.T) {
	reg := newRegistry(t)
	mk := func(body string, p v1.Platform) mutate.IndexAddendum {
		img := image(t, layer(t, compression.GZip, file("which", body, 0o644)))
		cf, _ := img.ConfigFile()
		cf.OS, cf.Architecture = p.OS, p.Architecture
		img, err := mutate.ConfigFile(img, cf)
		if err != nil {
			t.Fatal(err)
		}
		return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}}
	}
	idx := mutate.AppendManifests(empty.Index,
		mk("freebsd", v1.Platform{OS: "freebsd", Architecture: "amd64"}),
		mk("linux", v1.Platform{OS: "linux", Architecture: "amd64"}))
	tag, _ := name.NewTag(reg.host + "/multi:latest")
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	ref, err := render.ParseImage(render.OCIPrefix + reg.host + "/multi@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	p := &oci.Puller{Dir: t.TempDir(), Platform: v1.Platform{OS: "freebsd", Architecture: "amd64"}}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := oci.Unpack(t.Context(), img, root, 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "which")); string(b) != "freebsd" || img.Digest != d.String() || img.Manifest == img.Digest {
		t.Errorf("the index gave %q (digest %s, manifest %s)", b, img.Digest, img.Manifest)
	}
	p.Platform = v1.Platform{OS: "freebsd", Architecture: "riscv64"}
	if _, err := p.Fetch(t.Context(), ref, nil); err == nil || !strings.Contains(err.Error(), "no child with platform") {
		t.Errorf("Fetch for a platform the index lacks = %v", err)
	}
}
