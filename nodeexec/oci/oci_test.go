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
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/render"
)

func pullInto(t testing.TB, p *oci.Puller, ref render.ImageRef) (string, error) {
	t.Helper()
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		return "", err
	}
	dir := t.TempDir()
	_, err = oci.Unpack(t.Context(), img, dir, 0)
	return dir, err
}

func TestPullAndUnpack(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	base := ocitest.Layer(t, compression.GZip,
		ocitest.Dir("bin", 0o755), ocitest.File("bin/sh", "#!shell", 0o755),
		ocitest.Dir("etc", 0o755), ocitest.File("etc/passwd", "root:*:0:0", 0o644), ocitest.File("etc/old", "gone", 0o644),
		ocitest.Dir("opq", 0o755), ocitest.File("opq/lower", "hidden", 0o644), ocitest.Dir("opq/sub", 0o755), ocitest.File("opq/sub/deep", "hidden", 0o644),
		ocitest.Dir("usr/lib", 0o755), ocitest.File("usr/lib/libc.so", "libc", 0o444),
		ocitest.Symlink("lib", "usr/lib"), ocitest.Symlink("abs", "/etc/passwd"),
		ocitest.File("sbin/su", "su", 0o4755), ocitest.Dir("tmp", 0o1777),
		ocitest.Entry{Name: "home/www", Type: tar.TypeDir, Mode: 0o750, UID: 80, GID: 80},
		ocitest.Entry{Name: "home/www/index.html", Type: tar.TypeReg, Body: "<h1>hi</h1>", Mode: 0o640, UID: 80, GID: 80},
		ocitest.File("replaced", "a file", 0o644),
		ocitest.Dir("ro", 0o555), ocitest.File("ro/inside", "kept", 0o444),
	)
	upper := ocitest.Layer(t, compression.ZStd,
		ocitest.File("etc/.wh.old", "", 0o644),
		ocitest.File("opq/new", "mine", 0o644),
		ocitest.File("opq/.wh..wh..opq", "", 0o644),
		ocitest.Dir("replaced", 0o700), ocitest.File("replaced/now", "a dir", 0o600),
		ocitest.Hardlink("bin/sh-link", "bin/sh"),
		ocitest.File("lib/added", "through the link", 0o644),
	)
	top := ocitest.Layer(t, compression.None, ocitest.File("etc/passwd", "root:*:0:0\nwww:*:80:80", 0o600))
	ref := reg.Push(t, "team/web", ocitest.Image(t, base, upper, top))

	p := &oci.Puller{Dir: t.TempDir()}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 3 || img.Digest != ref.Digest || img.Manifest != ref.Digest || img.Size <= 0 {
		t.Fatalf("Fetch = %+v", img)
	}
	root := t.TempDir()
	if _, err := oci.Unpack(t.Context(), img, root, 0); err != nil {
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
	if fi, err := os.Stat(filepath.Join(root, "bin/sh")); err != nil || !fi.ModTime().Equal(ocitest.MTime) {
		t.Errorf("bin/sh modified %v, want %v", fi.ModTime(), ocitest.MTime)
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
	before := reg.Blobs.Load()
	if _, err := p.Fetch(t.Context(), ref, nil); err != nil {
		t.Fatal(err)
	}
	if got := reg.Blobs.Load() - before; got != 1 {
		t.Errorf("a cached image's pull fetched %d blobs, want 1 (its config)", got)
	}
}

func TestHostileLayersAreRefused(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	outside := t.TempDir()
	for _, tc := range []struct {
		name string
		ents []ocitest.Entry
		want string
	}{
		{"climbing path", []ocitest.Entry{ocitest.File("../../escape", "x", 0o644)}, `a path with "..": refused`},
		{"climbing inside", []ocitest.Entry{ocitest.Dir("a", 0o755), ocitest.File("a/../../escape", "x", 0o644)}, `a path with "..": refused`},
		{"absolute path", []ocitest.Entry{ocitest.File("/etc/escape", "x", 0o644)}, "an absolute path: refused"},
		{"device node", []ocitest.Entry{{Name: "dev/null", Type: tar.TypeChar, Mode: 0o666}}, "a device node: refused"},
		{"block device", []ocitest.Entry{{Name: "dev/ada0", Type: tar.TypeBlock, Mode: 0o640}}, "a device node: refused"},
		{"fifo", []ocitest.Entry{{Name: "run/fifo", Type: tar.TypeFifo, Mode: 0o644}}, "a FIFO: refused"},
		{"write through a symlink out", []ocitest.Entry{ocitest.Symlink("out", outside), ocitest.File("out/escape", "x", 0o644)}, "escape"},
		{"write through a relative symlink out", []ocitest.Entry{ocitest.Symlink("up", "../../../../../../.."), ocitest.File("up/"+strings.TrimPrefix(outside, "/")+"/escape", "x", 0o644)}, "escape"},
		{"hard link out", []ocitest.Entry{ocitest.Hardlink("passwd", "../../../../etc/passwd")}, `a path with "..": refused`},
		{"hard link through a symlink", []ocitest.Entry{ocitest.Symlink("etc", "/etc"), ocitest.Hardlink("passwd", "etc/passwd")}, "not a file of the image"},
		{"whiteout climbing", []ocitest.Entry{ocitest.File("../.wh.etc", "", 0o644)}, `a path with "..": refused`},
		{"whiteout with a body", []ocitest.Entry{ocitest.File("etc/.wh.passwd", strings.Repeat("x", 1024), 0o644)}, "a whiteout that is not an empty file: refused"},
		{"path too deep", []ocitest.Entry{ocitest.File(strings.Repeat("a/", 300)+"f", "x", 0o644)}, "deeper than 256: refused"},
		{"path too long", []ocitest.Entry{ocitest.File(strings.Repeat("abcdefgh/", 500)+"f", "x", 0o644)}, "longer than 4096 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := reg.Push(t, "hostile/"+strings.ReplaceAll(tc.name, " ", "-"), ocitest.Image(t, ocitest.Layer(t, compression.GZip, tc.ents...)))
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
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "bomb", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("zeros", strings.Repeat("\x00", 4<<20), 0o644))))
	p := &oci.Puller{Dir: t.TempDir()}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Size > 64<<10 {
		t.Fatalf("the bomb is %d bytes compressed", img.Size)
	}
	if _, err := oci.Unpack(t.Context(), img, t.TempDir(), 1<<20); err == nil || !strings.Contains(err.Error(), "more than the 1048576 bytes allowed") {
		t.Errorf("Unpack of 4 MiB with a 1 MiB limit = %v", err)
	}
	small := &oci.Puller{Dir: t.TempDir(), MaxCompressed: 100}
	if _, err := small.Fetch(t.Context(), ref, nil); err == nil || !strings.Contains(err.Error(), "more than the 100 bytes allowed (compressed)") {
		t.Errorf("Fetch over MaxCompressed = %v", err)
	}
}

func TestWrongContentIsRefused(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	l := ocitest.Layer(t, compression.GZip, ocitest.File("etc/motd", "the real one", 0o644))
	ref := reg.Push(t, "web", ocitest.Image(t, l))
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
	reg.Serve(serveBad)
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
	other := reg.Push(t, "other", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("x", "y", 0o644))))
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
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "private/web", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("secret", "s", 0o600))))
	requireAuth := func(w http.ResponseWriter, r *http.Request) bool {
		if u, p, ok := r.BasicAuth(); ok && u == "ci" && p == "s3cret" {
			return false
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
		return true
	}
	reg.Serve(requireAuth)
	if _, err := (&oci.Puller{Dir: t.TempDir()}).Fetch(t.Context(), ref, nil); err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("anonymous Fetch from a private registry = %v", err)
	}
	wrong, err := oci.KeychainFromConfig(fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, reg.Host, base64.StdEncoding.EncodeToString([]byte("ci:wrong"))))
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&oci.Puller{Dir: t.TempDir(), Keychain: wrong}).Fetch(t.Context(), ref, nil)
	if err == nil {
		t.Error("Fetch with a wrong password succeeded")
	} else if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error quotes the password: %v", err)
	}
	kc, err := oci.KeychainFromConfig(fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, reg.Host, base64.StdEncoding.EncodeToString([]byte("ci:s3cret"))))
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
	reg := ocitest.NewRegistry(t)
	shared := ocitest.Layer(t, compression.GZip, ocitest.File("usr/lib/big", strings.Repeat("shared ", 1<<16), 0o644))
	refs := []render.ImageRef{
		reg.Push(t, "a", ocitest.Image(t, shared, ocitest.Layer(t, compression.GZip, ocitest.File("app", "a", 0o755)))),
		reg.Push(t, "b", ocitest.Image(t, shared, ocitest.Layer(t, compression.GZip, ocitest.File("app", "b", 0o755)))),
	}
	// Slow the shared layer down so that both pulls want it at once.
	sd, _ := shared.Digest()
	slow := func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/blobs/"+sd.String()) {
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}
	reg.Serve(slow)
	before := reg.Blobs.Load()
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
	if got := reg.Blobs.Load() - before; got != 4+3 {
		t.Errorf("four concurrent pulls of two images fetched %d blobs, want 7 (4 configs, 3 layers)", got)
	}
}

func TestIndexPicksThePlatform(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	mk := func(body string, p v1.Platform) mutate.IndexAddendum {
		img := ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("which", body, 0o644)))
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
	tag, _ := name.NewTag(reg.Host + "/multi:latest")
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	ref, err := render.ParseImage(render.OCIPrefix + reg.Host + "/multi@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	p := &oci.Puller{Dir: t.TempDir(), Platform: v1.Platform{OS: "freebsd", Architecture: "amd64"}}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if _, err := oci.Unpack(t.Context(), img, root, 0); err != nil {
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

func TestWhiteoutsHideLowerLayersOnly(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "wh", ocitest.Image(t,
		ocitest.Layer(t, compression.GZip, ocitest.Dir("d", 0o700), ocitest.File("d/old", "old", 0o644), ocitest.File("lower", "l", 0o644)),
		ocitest.Layer(t, compression.GZip,
			ocitest.File("new", "mine", 0o644), ocitest.File(".wh.new", "", 0o644), // its own layer's: kept
			ocitest.File(".wh.lower", "", 0o644),
			ocitest.File(".wh.d", "", 0o644), ocitest.File("d/fresh", "f", 0o644)), // d made again, implicitly
	))
	root, err := pullInto(t, &oci.Puller{Dir: t.TempDir()}, ref)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "new")); err != nil || string(b) != "mine" {
		t.Errorf("new = %q, %v: a whiteout removed a file of its own layer", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "lower")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lower: %v, want it whited out", err)
	}
	// The removed d's metadata (mode 0700) is not applied to the new d.
	if fi, err := os.Stat(filepath.Join(root, "d")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("d: %v, %v; want the mode of a directory made implicitly (0755)", fi.Mode(), err)
	}
}

func TestTamperedCacheIsRefused(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "tamper", ocitest.Image(t, ocitest.Layer(t, compression.None, ocitest.File("etc/motd", "the real one", 0o644))))
	p := &oci.Puller{Dir: t.TempDir()}
	img, err := p.Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Same size, other bytes: a cache changed after its verification.
	b, err := os.ReadFile(img.Layers[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1 // in the tar's (or gzip's) trailer: a change only the digest sees
	os.Chmod(img.Layers[0].Path, 0o644)
	if err := os.WriteFile(img.Layers[0].Path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := oci.Unpack(t.Context(), img, t.TempDir(), 0); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Errorf("Unpack of a tampered cache = %v", err)
	}
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNoPlainHTTPToARemoteRegistry(t *testing.T) {
	var seen []string
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = append(seen, r.URL.Scheme+"://"+r.URL.Host)
		return nil, errors.New("TLS handshake failed")
	})
	kc, err := oci.KeychainFromConfig([]byte(`{"auths": {"10.11.12.13:5000": {"auth": "Y2k6czNjcmV0"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := render.ParseImage("oci://10.11.12.13:5000/team/web@sha256:" + strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&oci.Puller{Dir: t.TempDir(), Keychain: kc, Transport: next}).Fetch(t.Context(), ref, nil)
	if err == nil {
		t.Fatal("Fetch through a failing TLS succeeded")
	}
	for _, s := range seen {
		if strings.HasPrefix(s, "http://") {
			t.Errorf("a request went over plain HTTP to %s", s)
		}
	}
	if len(seen) == 0 {
		t.Error("no request was made over HTTPS either")
	}
}
