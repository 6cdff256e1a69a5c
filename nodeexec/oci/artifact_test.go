package oci_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/render"
)

// secret is the signature of the pre-signed URLs the tests fetch: it
// must never appear in an error or a log line.
const secret = "s3cr3t-signature"

// publicPart is a URL without its query, for messages.
func publicPart(u string) string { s, _, _ := strings.Cut(u, "?"); return s }

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// httpsServer is an HTTPS server on 127.0.0.1 counting its requests.
type httpsServer struct {
	*httptest.Server
	hits atomic.Int64
}

func newHTTPS(t *testing.T, h http.HandlerFunc) *httpsServer {
	t.Helper()
	s := &httpsServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes refused on purpose
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// puller fetches from s, whose certificate it trusts, and logs into logs
// (when not nil) at debug level.
func (s *httpsServer) puller(t *testing.T, logs *bytes.Buffer) *oci.Puller {
	p := &oci.Puller{Dir: t.TempDir(), Transport: s.Client().Transport}
	if logs != nil {
		p.Log = slog.New(slog.NewTextHandler(&lockedWriter{w: logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return p
}

type lockedWriter struct {
	mu gosync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// cacheFiles are the names in the puller's blob directory, hidden ones
// (downloads under way) included.
func cacheFiles(t *testing.T, p *oci.Puller) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(p.Dir, "blobs", "sha256"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func assertCacheEmpty(t *testing.T, p *oci.Puller) {
	t.Helper()
	if files := cacheFiles(t, p); len(files) != 0 {
		t.Errorf("the cache holds %v, want nothing (no blob, no partial download)", files)
	}
}

// noSecret fails when err's text holds the pre-signed URL's signature.
func noSecret(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("the error quotes the URL's signature: %v", err)
	}
}

func TestFetchArtifactHTTPS(t *testing.T) {
	body := []byte("#!/bin/sh\necho an artifact\n")
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/dl/tool" || r.URL.Query().Get("X-Signature") != secret {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(body)
	})
	var logs bytes.Buffer
	p := srv.puller(t, &logs)
	a := render.Artifact{URL: srv.URL + "/dl/tool?X-Signature=" + secret, SHA256: sum(body), Path: "/usr/local/bin/tool"}
	if p.HasArtifact(a) {
		t.Fatal("HasArtifact before any fetch")
	}
	var last oci.Progress
	got, err := p.FetchArtifact(t.Context(), a, func(pr oci.Progress) { last = pr })
	if err != nil {
		t.Fatal(err)
	}
	want, err := p.ArtifactPath(a.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || want != filepath.Join(p.Dir, "blobs", "sha256", a.SHA256) {
		t.Errorf("FetchArtifact = %s, ArtifactPath = %s; want both %s", got, want, filepath.Join(p.Dir, "blobs", "sha256", a.SHA256))
	}
	if b, err := os.ReadFile(got); err != nil || !bytes.Equal(b, body) {
		t.Errorf("cached file = %q, %v; want %q", b, err, body)
	}
	if n := int64(len(body)); last != (oci.Progress{Done: n, Total: n}) {
		t.Errorf("last progress = %+v, want %d of %d", last, n, n)
	}
	if !p.HasArtifact(a) {
		t.Error("HasArtifact after the fetch = false")
	}
	if files := cacheFiles(t, p); !slices.Equal(files, []string{a.SHA256}) {
		t.Errorf("cache = %v, want only the artifact", files)
	}
	blobs, err := p.Blobs()
	if err != nil || blobs["sha256:"+a.SHA256].Size != int64(len(body)) {
		t.Errorf("Blobs = %v, %v; want the artifact of %d bytes", blobs, err, len(body))
	}

	// Cached: no request again.
	if again, err := p.FetchArtifact(t.Context(), a, nil); err != nil || again != got {
		t.Errorf("second FetchArtifact = %s, %v", again, err)
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("the server was asked %d times, want 1", n)
	}
	if !strings.Contains(logs.String(), "artifact downloaded") || strings.Contains(logs.String(), secret) {
		t.Errorf("log = %q: want the download logged, without the URL's signature", logs.String())
	}

	// The scheme in capitals, which render takes: fetched all the same.
	q := srv.puller(t, nil)
	upper := a
	upper.URL = "HTTPS" + strings.TrimPrefix(a.URL, "https")
	if _, err := q.FetchArtifact(t.Context(), upper, nil); err != nil || !q.HasArtifact(a) {
		t.Errorf("FetchArtifact of %s = %v", publicPart(upper.URL), err)
	}
	srv.hits.Add(-1)

	// An artifact not in the cache is not there; a bad sha256 is no path.
	if p.HasArtifact(render.Artifact{SHA256: sum([]byte("other"))}) {
		t.Error("HasArtifact of another file = true")
	}
	for _, bad := range []string{"", "../../../../etc/passwd", strings.ToUpper(a.SHA256), a.SHA256[:63], "sha256:" + a.SHA256} {
		if path, err := p.ArtifactPath(bad); err == nil {
			t.Errorf("ArtifactPath(%q) = %s, want an error", bad, path)
		}
		if p.HasArtifact(render.Artifact{SHA256: bad}) {
			t.Errorf("HasArtifact(%q) = true", bad)
		}
		if _, err := p.FetchArtifact(t.Context(), render.Artifact{URL: a.URL, SHA256: bad}, nil); err == nil {
			t.Errorf("FetchArtifact of sha256 %q succeeded", bad)
		}
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("invalid sha256s made %d requests", n-1)
	}
}

// A server that stores a .tar.gz with "Content-Encoding: gzip" (S3
// object metadata, a misconfigured web server): the artifact is the
// bytes as served, which is what curl downloads and sha256sum hashes,
// not what a client decoding the encoding makes of them.
func TestFetchArtifactKeepsContentEncoding(t *testing.T) {
	l := ocitest.Layer(t, compression.GZip, ocitest.File("bin/tool", "the tool", 0o755))
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	archive, _ := io.ReadAll(rc)
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(archive)
	})
	p := srv.puller(t, nil)
	a := render.Artifact{URL: srv.URL + "/tool.tar.gz", SHA256: sum(archive), Path: "/opt/tool", Archive: render.ArchiveTarGz}
	blob, err := p.FetchArtifact(t.Context(), a, nil)
	if err != nil {
		t.Fatalf("FetchArtifact of a file served with Content-Encoding: gzip = %v", err)
	}
	if b, _ := os.ReadFile(blob); !bytes.Equal(b, archive) {
		t.Errorf("cached %d bytes, want the %d served", len(b), len(archive))
	}
	root := t.TempDir()
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{{Artifact: a, Blob: blob}}, 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "opt/tool/bin/tool")); err != nil || string(b) != "the tool" {
		t.Errorf("opt/tool/bin/tool = %q, %v", b, err)
	}
}

func TestFetchArtifactChecksumMismatch(t *testing.T) {
	good, evil := []byte("the real file"), []byte("someone else's file")
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(evil) })
	p := srv.puller(t, nil)
	a := render.Artifact{URL: srv.URL + "/f?X-Signature=" + secret, SHA256: sum(good), Path: "/f"}
	_, err := p.FetchArtifact(t.Context(), a, nil)
	want := fmt.Sprintf("its sha256 is %s, not %s as the spec says: refused", sum(evil), sum(good))
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("FetchArtifact of the wrong file = %v, want an error containing %q", err, want)
	}
	noSecret(t, err)
	assertCacheEmpty(t, p)
	if p.HasArtifact(a) {
		t.Error("HasArtifact after a refused download")
	}
	// Refused again next time, not taken from the cache.
	if _, err := p.FetchArtifact(t.Context(), a, nil); err == nil || srv.hits.Load() != 2 {
		t.Errorf("second FetchArtifact = %v after %d requests; want a refusal after 2", err, srv.hits.Load())
	}
}

func TestFetchArtifactOversize(t *testing.T) {
	const limit = 1024
	big := bytes.Repeat([]byte("x"), 4*limit)
	for _, tc := range []struct {
		name  string
		serve func(w http.ResponseWriter)
		want  string
	}{
		{"announced", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			_, _ = w.Write(big)
		}, fmt.Sprintf("the server announces %d bytes, more than the %d allowed", len(big), limit)},
		{"chunked", func(w http.ResponseWriter) {
			// Flushed before the end: no Content-Length, chunked.
			for chunk := range slices.Chunk(big, 256) {
				_, _ = w.Write(chunk)
				w.(http.Flusher).Flush()
			}
		}, fmt.Sprintf("more than the %d bytes allowed", limit)},
		{"chunked, endless", func(w http.ResponseWriter) {
			for i := 0; i < 1<<20; i++ { // 256 MiB unless the client leaves
				if _, err := w.Write(big[:256]); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}, fmt.Sprintf("more than the %d bytes allowed", limit)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var chunked atomic.Bool
			srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) { tc.serve(w) })
			p := srv.puller(t, nil)
			p.MaxCompressed = limit
			tr := srv.Client().Transport.(*http.Transport).Clone()
			p.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := tr.RoundTrip(r)
				if err == nil && resp.ContentLength < 0 {
					chunked.Store(true)
				}
				return resp, err
			})
			start := time.Now()
			_, err := p.FetchArtifact(t.Context(), render.Artifact{URL: srv.URL + "/big", SHA256: sum(big), Path: "/big"}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("FetchArtifact over MaxCompressed = %v, want an error containing %q", err, tc.want)
			}
			if announced := !strings.HasPrefix(tc.name, "chunked"); chunked.Load() == announced {
				t.Errorf("the response was chunked: %v, want %v", chunked.Load(), !announced)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("the refusal took %v", d)
			}
			assertCacheEmpty(t, p)
		})
	}

	// Exactly the limit is allowed.
	exact := big[:limit]
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(exact) })
	p := srv.puller(t, nil)
	p.MaxCompressed = limit
	if _, err := p.FetchArtifact(t.Context(), render.Artifact{URL: srv.URL + "/exact", SHA256: sum(exact), Path: "/exact"}, nil); err != nil {
		t.Errorf("FetchArtifact of exactly MaxCompressed bytes = %v", err)
	}
}

func TestFetchArtifactServerErrors(t *testing.T) {
	body := []byte("the file behind the redirects")
	var plainHits atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainHits.Add(1)
		_, _ = w.Write(body)
	}))
	t.Cleanup(plain.Close)
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			http.NotFound(w, r)
		case "/broken":
			http.Error(w, "boom "+secret, http.StatusInternalServerError)
		case "/partial":
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(body)
		case "/to-http":
			http.Redirect(w, r, plain.URL+"/file?X-Signature="+secret, http.StatusFound)
		case "/to-https":
			http.Redirect(w, r, "/file?X-Amz-Signature="+secret, http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop?X-Signature="+secret+"&n="+fmt.Sprint(len(r.URL.RawQuery)), http.StatusFound)
		case "/truncated":
			w.Header().Set("Content-Length", fmt.Sprint(2*len(body)))
			_, _ = w.Write(body)
		case "/file":
			if r.URL.Query().Get("X-Amz-Signature") != secret {
				http.Error(w, "unsigned", http.StatusForbidden)
				return
			}
			_, _ = w.Write(body)
		}
	})
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "https://" + closed.Addr().String()
	closed.Close()

	var logs bytes.Buffer
	for _, tc := range []struct {
		name, url, want string
		untrusted       bool
	}{
		{"404", srv.URL + "/missing", "the server answered 404 Not Found", false},
		{"500", srv.URL + "/broken", "the server answered 500 Internal Server Error", false},
		{"206", srv.URL + "/partial", "the server answered 206 Partial Content", false},
		{"redirect to http", srv.URL + "/to-http", "only https is followed", false},
		{"redirect loop", srv.URL + "/loop", "more than 5 redirects", false},
		{"truncated", srv.URL + "/truncated", "unexpected EOF", false},
		{"closed port", closedURL + "/f", "connection refused", false},
		{"untrusted certificate", srv.URL + "/file", "certificate", true},
		{"plain http", plain.URL + "/file", "only https:// and oci:// URLs are fetched", false},
		{"file", "file:///etc/passwd", "only https:// and oci:// URLs are fetched", false},
		{"ftp", "ftp://example.com/f", "only https:// and oci:// URLs are fetched", false},
		{"oci by tag", render.OCIPrefix + "127.0.0.1:1/repo:latest", "not an OCI reference pinned by digest", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := srv.puller(t, &logs)
			if tc.untrusted {
				p.Transport = nil // the system's roots: the test certificate is not among them
			}
			sep := "?"
			if strings.Contains(tc.url, "?") {
				sep = "&"
			}
			u := tc.url + sep + "X-Signature=" + secret
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := p.FetchArtifact(ctx, render.Artifact{URL: u, SHA256: sum(body), Path: "/f"}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("FetchArtifact = %v, want an error containing %q", err, tc.want)
			}
			noSecret(t, err)
			assertCacheEmpty(t, p)
		})
	}
	if plainHits.Load() != 0 {
		t.Errorf("plain http was fetched %d times", plainHits.Load())
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the log quotes the URL's signature: %s", logs.String())
	}

	// An https redirect is followed, its query string sent.
	p := srv.puller(t, nil)
	blob, err := p.FetchArtifact(t.Context(), render.Artifact{URL: srv.URL + "/to-https", SHA256: sum(body), Path: "/f"}, nil)
	if err != nil {
		t.Fatalf("FetchArtifact through an https redirect = %v", err)
	}
	if b, _ := os.ReadFile(blob); !bytes.Equal(b, body) {
		t.Errorf("cached %q, want %q", b, body)
	}
}

func TestFetchArtifactConcurrent(t *testing.T) {
	body := bytes.Repeat([]byte("concurrent "), 10000)
	var gate gosync.Mutex // guards release, replaced for the second round
	release := make(chan struct{})
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		gate.Lock()
		wait := release
		gate.Unlock()
		<-wait
		_, _ = w.Write(body)
	})
	p := srv.puller(t, nil)
	a := render.Artifact{URL: srv.URL + "/f", SHA256: sum(body), Path: "/f"}
	var wg gosync.WaitGroup
	paths, errs := make([]string, 8), make([]error, 8)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = p.FetchArtifact(t.Context(), a, nil) })
	}
	// The first download is under way; give the others time to wait for it.
	for srv.hits.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	want, _ := p.ArtifactPath(a.SHA256)
	for i := range paths {
		if errs[i] != nil || paths[i] != want {
			t.Errorf("fetch %d = %s, %v", i, paths[i], errs[i])
		}
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("8 concurrent fetches made %d requests, want 1", n)
	}
	if b, _ := os.ReadFile(want); !bytes.Equal(b, body) {
		t.Error("the cached file is not the one served")
	}
	if files := cacheFiles(t, p); !slices.Equal(files, []string{a.SHA256}) {
		t.Errorf("cache = %v", files)
	}

	// A refusal is shared too: one request, every fetch refused.
	p = srv.puller(t, nil)
	wrong := render.Artifact{URL: srv.URL + "/f", SHA256: sum([]byte("another file")), Path: "/f"}
	gate.Lock()
	release = make(chan struct{})
	gate.Unlock()
	before := srv.hits.Load()
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = p.FetchArtifact(t.Context(), wrong, nil) })
	}
	for srv.hits.Load() == before {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	gate.Lock()
	close(release)
	gate.Unlock()
	wg.Wait()
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "as the spec says: refused") {
			t.Errorf("fetch %d of the wrong file = %v", i, err)
		}
	}
	if n := srv.hits.Load() - before; n != 1 {
		t.Errorf("8 concurrent fetches of a wrong file made %d requests, want 1", n)
	}
	assertCacheEmpty(t, p)
}

func TestFetchArtifactCancelled(t *testing.T) {
	body := bytes.Repeat([]byte("slow "), 4000)
	started := make(chan struct{}, 4)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("stall") == "" && r.Header.Get("X-Stall") == "" {
			_, _ = w.Write(body)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body[:1000])
		w.(http.Flusher).Flush()
		started <- struct{}{}
		select { // stalls mid-body
		case <-r.Context().Done():
		case <-stop:
		}
	})
	a := render.Artifact{URL: srv.URL + "/f?stall=1", SHA256: sum(body), Path: "/f"}

	p := srv.puller(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := p.FetchArtifact(ctx, a, nil); done <- err }()
	<-started
	time.Sleep(50 * time.Millisecond) // into the read of the stalled body
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "context canceled") {
			t.Errorf("cancelled FetchArtifact = %v, want context canceled", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("FetchArtifact returned %v after its context ended", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("FetchArtifact did not return after its context was cancelled")
	}
	assertCacheEmpty(t, p)

	// A fetch that waits for another's gives up with its own context,
	// and takes over when the other gives up with its.
	p = srv.puller(t, nil)
	stallOnce := &atomic.Bool{}
	base := srv.Client().Transport
	p.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if stallOnce.CompareAndSwap(false, true) {
			r = r.Clone(r.Context())
			r.Header.Set("X-Stall", "1")
		}
		return base.RoundTrip(r)
	})
	a.URL = srv.URL + "/f"
	first, cancelFirst := context.WithCancel(t.Context())
	defer cancelFirst()
	firstDone := make(chan error, 1)
	go func() { _, err := p.FetchArtifact(first, a, nil); firstDone <- err }()
	<-started
	impatient, cancelImpatient := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancelImpatient()
	if _, err := p.FetchArtifact(impatient, a, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a waiting fetch whose context ends = %v, want its deadline", err)
	}
	secondDone := make(chan error, 1)
	go func() { _, err := p.FetchArtifact(t.Context(), a, nil); secondDone <- err }()
	time.Sleep(100 * time.Millisecond) // waiting for the first
	cancelFirst()
	if err := <-firstDone; err == nil {
		t.Error("the cancelled fetch succeeded")
	}
	if err := <-secondDone; err != nil {
		t.Errorf("the fetch that waited = %v, want it to download once the first gave up", err)
	}
	if b, err := os.ReadFile(filepath.Join(p.Dir, "blobs", "sha256", a.SHA256)); err != nil || !bytes.Equal(b, body) {
		t.Errorf("cached file: %v", err)
	}
	if n := srv.hits.Load(); n != 3 {
		t.Errorf("%d requests, want 3 (a stalled one, another stalled one, the one that got the file)", n)
	}
}

// artifactImage is an OCI artifact: a manifest whose layers are files.
func artifactImage(t *testing.T, files ...[]byte) (v1.Image, []v1.Layer) {
	t.Helper()
	var layers []v1.Layer
	for _, f := range files {
		layers = append(layers, static.NewLayer(f, "application/vnd.keel.test.file"))
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return img, layers
}

func layerHex(t *testing.T, l v1.Layer) string {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hex
}

func TestFetchArtifactOCI(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	file := []byte("a file published as an OCI artifact\n")
	img, layers := artifactImage(t, []byte("its README"), file)
	ref := reg.Push(t, "team/tools", img)
	p := &oci.Puller{Dir: t.TempDir()}
	a := render.Artifact{URL: ocitest.Spec(ref), SHA256: sum(file), Path: "/usr/local/bin/tool", Mode: 0o755}
	if layerHex(t, layers[1]) != a.SHA256 {
		t.Fatal("the layer's digest is not the file's sha256")
	}
	before := reg.Blobs.Load()
	var last oci.Progress
	blob, err := p.FetchArtifact(t.Context(), a, func(pr oci.Progress) { last = pr })
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(blob); err != nil || !bytes.Equal(b, file) {
		t.Errorf("cached %q, %v; want %q", b, err, file)
	}
	if n := int64(len(file)); last != (oci.Progress{Done: n, Total: n}) {
		t.Errorf("progress = %+v", last)
	}
	if got := reg.Blobs.Load() - before; got != 1 {
		t.Errorf("the fetch downloaded %d blobs, want 1 (the file's layer only)", got)
	}
	if !p.HasArtifact(a) || !slices.Equal(cacheFiles(t, p), []string{a.SHA256}) {
		t.Errorf("cache = %v", cacheFiles(t, p))
	}
	// Cached: the registry is not needed again (a node that restarts
	// while its registry is down still starts what it has).
	var asked atomic.Int64
	reg.Serve(func(w http.ResponseWriter, r *http.Request) bool {
		asked.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	})
	if again, err := p.FetchArtifact(t.Context(), a, nil); err != nil || again != blob || asked.Load() != 0 {
		t.Errorf("a second fetch = %s, %v after %d requests; want the cached file, the registry not asked", again, err, asked.Load())
	}
	reg.Serve(nil)
	root := t.TempDir()
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{{Artifact: a, Blob: blob}}, 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/bin/tool")); err != nil || fi.Mode() != 0o755 {
		t.Errorf("placed: %v, %v", fi, err)
	}

	// A sha256 that is none of the manifest's layers.
	q := &oci.Puller{Dir: t.TempDir()}
	other := a
	other.SHA256 = sum([]byte("not published"))
	if _, err := q.FetchArtifact(t.Context(), other, nil); err == nil || !strings.Contains(err.Error(), "none of the manifest's 2 layers is sha256:"+other.SHA256) {
		t.Errorf("FetchArtifact of a file not in the manifest = %v", err)
	}
	// The config blob is not a layer.
	cd, _ := img.ConfigName()
	other.SHA256 = cd.Hex
	if _, err := q.FetchArtifact(t.Context(), other, nil); err == nil || !strings.Contains(err.Error(), "none of the manifest's 2 layers") {
		t.Errorf("FetchArtifact of the config = %v", err)
	}
	// A manifest that does not exist.
	missing := a
	missing.URL = render.OCIPrefix + ref.Registry + "/" + ref.Repository + "@sha256:" + strings.Repeat("0", 64)
	if _, err := q.FetchArtifact(t.Context(), missing, nil); err == nil || !strings.Contains(err.Error(), "MANIFEST_UNKNOWN") {
		t.Errorf("FetchArtifact of a missing manifest = %v", err)
	}
	// A repository that does not hold the manifest.
	missing.URL = render.OCIPrefix + ref.Registry + "/elsewhere@" + ref.Digest
	if _, err := q.FetchArtifact(t.Context(), missing, nil); err == nil {
		t.Error("FetchArtifact from a repository without the manifest succeeded")
	}
	// Declared over MaxCompressed.
	small := &oci.Puller{Dir: t.TempDir(), MaxCompressed: 8}
	if _, err := small.FetchArtifact(t.Context(), a, nil); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("declared as %d bytes, more than the 8 allowed", len(file))) {
		t.Errorf("FetchArtifact over MaxCompressed = %v", err)
	}
	assertCacheEmpty(t, q)
	assertCacheEmpty(t, small)
}

func TestFetchArtifactOCIHostile(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	file := []byte("the published file, with some length to it")

	// The registry serves other bytes for the layer.
	img, layers := artifactImage(t, file)
	ref := reg.Push(t, "corrupt", img)
	ld, _ := layers[0].Digest()
	reg.Serve(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
			return false
		}
		bad := bytes.ToUpper(file)
		w.Header().Set("Content-Length", fmt.Sprint(len(bad)))
		_, _ = w.Write(bad)
		return true
	})
	p := &oci.Puller{Dir: t.TempDir()}
	a := render.Artifact{URL: ocitest.Spec(ref), SHA256: sum(file), Path: "/f"}
	if _, err := p.FetchArtifact(t.Context(), a, nil); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("FetchArtifact of a corrupted layer = %v", err)
	}
	assertCacheEmpty(t, p)
	reg.Serve(nil)

	// A layer to be fetched from elsewhere.
	foreign, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(file, types.DockerForeignLayer), URLs: []string{"https://evil.example/f"}})
	if err != nil {
		t.Fatal(err)
	}
	ref = reg.Push(t, "foreign", foreign)
	a.URL = ocitest.Spec(ref)
	if _, err := p.FetchArtifact(t.Context(), a, nil); err == nil || !strings.Contains(err.Error(), "fetched from elsewhere than the registry (https://evil.example/f): refused") {
		t.Errorf("FetchArtifact of a foreign layer = %v", err)
	}
	assertCacheEmpty(t, p)

	// A manifest that lies about its layer's size: shorter, or longer,
	// than what the registry holds (and serves).
	repo, err := name.NewRepository(reg.Host + "/liar")
	if err != nil {
		t.Fatal(err)
	}
	cfg := static.NewLayer([]byte("{}"), "application/vnd.oci.empty.v1+json")
	for _, l := range []v1.Layer{cfg, static.NewLayer(file, "application/octet-stream")} {
		if err := remote.WriteLayer(repo, l); err != nil {
			t.Fatal(err)
		}
	}
	for _, size := range []int64{int64(len(file)) - 5, int64(len(file)) + 5, 0} {
		m := v1.Manifest{
			SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
			Config: v1.Descriptor{MediaType: "application/vnd.oci.empty.v1+json", Size: 2, Digest: v1.Hash{Algorithm: "sha256", Hex: sum([]byte("{}"))}},
			Layers: []v1.Descriptor{{MediaType: "application/octet-stream", Size: size, Digest: v1.Hash{Algorithm: "sha256", Hex: sum(file)}}},
		}
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		d := repo.Digest("sha256:" + sum(raw))
		if err := remote.Put(d, rawManifest(raw)); err != nil {
			t.Fatal(err)
		}
		p := &oci.Puller{Dir: t.TempDir()}
		a := render.Artifact{URL: render.OCIPrefix + d.String(), SHA256: sum(file), Path: "/f"}
		if _, err := p.FetchArtifact(t.Context(), a, nil); err == nil {
			t.Errorf("FetchArtifact of a layer declared as %d bytes (it has %d) succeeded", size, len(file))
		}
		assertCacheEmpty(t, p)
	}
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// writeBlob writes data as a cached file and returns its path.
func writeBlob(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), sum(data))
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func fileArtifact(t *testing.T, path string, data []byte, mode render.FileMode) oci.CachedArtifact {
	return oci.CachedArtifact{Artifact: render.Artifact{URL: "https://example.com/f", SHA256: sum(data), Path: path, Mode: mode}, Blob: writeBlob(t, data)}
}

// withUmask sets the process's umask for the test.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// noTempFiles fails when an artifact's temporary file is left in the root.
func noTempFiles(t *testing.T, root string) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".keel-artifact-") {
			t.Errorf("a temporary file is left: %s", p)
		}
		return nil
	})
}

func TestPlaceArtifactFiles(t *testing.T) {
	withUmask(t, 0o077)
	root := t.TempDir()
	tool, conf := []byte("#!/bin/sh\n"), []byte("key = value\n")
	arts := []oci.CachedArtifact{
		fileArtifact(t, "/usr/local/bin/tool", tool, 0o755),
		fileArtifact(t, "/usr/local/etc/tool.conf", conf, 0), // the default
		fileArtifact(t, "/secret", []byte("s"), 0o600),
	}
	if err := oci.PlaceArtifacts(t.Context(), root, arts, 0); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]struct {
		body string
		mode fs.FileMode
	}{
		"usr/local/bin/tool": {string(tool), 0o755}, "usr/local/etc/tool.conf": {string(conf), 0o644}, "secret": {"s", 0o600},
	} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || fi.Mode() != want.mode {
			t.Errorf("%s: %v, %v; want mode %v despite the umask", p, fi.Mode(), err, want.mode)
		}
		if got := readFile(t, filepath.Join(root, p)); got != want.body {
			t.Errorf("%s = %q, want %q", p, got, want.body)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/etc")); err != nil || !fi.IsDir() {
		t.Errorf("usr/local/etc: %v, %v", fi, err)
	}
	noTempFiles(t, root)

	// Placed again (each start): the same.
	if err := oci.PlaceArtifacts(t.Context(), root, arts, 0); err != nil || readFile(t, filepath.Join(root, "usr/local/bin/tool")) != string(tool) {
		t.Errorf("placing again: %v", err)
	}
	if err := oci.PlaceArtifacts(t.Context(), root, nil, 0); err != nil {
		t.Errorf("no artifacts: %v", err)
	}
}

func TestPlaceArtifactOverAHardLink(t *testing.T) {
	// The root's etc/motd is a hard link to a file of the image cache.
	cache, root := t.TempDir(), t.TempDir()
	image := filepath.Join(cache, "motd")
	if err := os.WriteFile(image, []byte("the image's"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	if err := os.Link(image, filepath.Join(root, "etc/motd")); err != nil {
		t.Fatal(err)
	}
	art := fileArtifact(t, "/etc/motd", []byte("the artifact's"), 0o600)
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "etc/motd")); got != "the artifact's" {
		t.Errorf("etc/motd = %q", got)
	}
	fi, err := os.Stat(image)
	if got := readFile(t, image); got != "the image's" || err != nil || fi.Mode() != 0o644 {
		t.Errorf("the image's file = %q (%v, %v): written through the hard link", got, fi.Mode(), err)
	}
	placed, _ := os.Stat(filepath.Join(root, "etc/motd"))
	if os.SameFile(fi, placed) {
		t.Error("etc/motd is still the image's file")
	}
}

func TestPlaceArtifactRefusals(t *testing.T) {
	data := []byte("new content")
	t.Run("a directory at the path", func(t *testing.T) {
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "etc/app.conf/keep"), 0o755)
		err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{fileArtifact(t, "/etc/app.conf", data, 0)}, 0)
		if err == nil || !strings.Contains(err.Error(), "artifact /etc/app.conf: a directory is there") {
			t.Errorf("PlaceArtifacts over a directory = %v", err)
		}
		if fi, err := os.Stat(filepath.Join(root, "etc/app.conf/keep")); err != nil || !fi.IsDir() {
			t.Errorf("the directory is gone: %v", err)
		}
		noTempFiles(t, root)
	})
	t.Run("a parent that is a file", func(t *testing.T) {
		root := t.TempDir()
		os.WriteFile(filepath.Join(root, "etc"), []byte("a file"), 0o644)
		if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{fileArtifact(t, "/etc/app.conf", data, 0)}, 0); err == nil {
			t.Error("PlaceArtifacts under a file succeeded")
		}
		if got := readFile(t, filepath.Join(root, "etc")); got != "a file" {
			t.Errorf("etc = %q", got)
		}
	})
	t.Run("a cache altered since its fetch", func(t *testing.T) {
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "etc"), 0o755)
		os.WriteFile(filepath.Join(root, "etc/app.conf"), []byte("the old one"), 0o640)
		art := fileArtifact(t, "/etc/app.conf", data, 0o644)
		if err := os.WriteFile(art.Blob, []byte("new CONTENT"), 0o600); err != nil { // same size
			t.Fatal(err)
		}
		err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0)
		if err == nil || !errors.Is(err, oci.ErrArtifactCache) {
			t.Errorf("PlaceArtifacts of an altered cache = %v", err)
		}
		fi, _ := os.Stat(filepath.Join(root, "etc/app.conf"))
		if got := readFile(t, filepath.Join(root, "etc/app.conf")); got != "the old one" || fi.Mode() != 0o640 {
			t.Errorf("the old file is now %q (%v), want it left as it was", got, fi.Mode())
		}
		noTempFiles(t, root)
	})
	t.Run("a cached file gone", func(t *testing.T) {
		art := fileArtifact(t, "/etc/app.conf", data, 0)
		os.Remove(art.Blob)
		if err := oci.PlaceArtifacts(t.Context(), t.TempDir(), []oci.CachedArtifact{art}, 0); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("PlaceArtifacts without its file = %v", err)
		}
	})
	t.Run("paths not absolute and clean", func(t *testing.T) {
		root := t.TempDir()
		for _, p := range []string{"", "/", "etc/x", "/etc/../../x", "/etc/./x", "/etc/x/", "//etc/x", "/..", "/etc/\x00x"} {
			for _, archive := range []string{"", render.ArchiveTar} {
				art := fileArtifact(t, p, data, 0)
				art.Archive = archive
				if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err == nil {
					t.Errorf("PlaceArtifacts at %q (archive %q) succeeded", p, archive)
				}
			}
		}
		if entries, _ := os.ReadDir(root); len(entries) != 0 {
			t.Errorf("the root holds %v", entries)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		root := t.TempDir()
		if err := oci.PlaceArtifacts(ctx, root, []oci.CachedArtifact{fileArtifact(t, "/f", data, 0)}, 0); !errors.Is(err, context.Canceled) {
			t.Errorf("PlaceArtifacts with its context ended = %v", err)
		}
		if _, err := os.Lstat(filepath.Join(root, "f")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("f: %v, want nothing placed", err)
		}
		noTempFiles(t, root)
	})
}

// outsideDir is a directory beside the root, which must stay empty.
func outsideDir(t *testing.T) string {
	t.Helper()
	return t.TempDir()
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	var found []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if p != dir {
			found = append(found, p)
		}
		return nil
	})
	if len(found) != 0 {
		t.Errorf("something was written outside the root: %v", found)
	}
}

func TestPlaceArtifactSymlinksOut(t *testing.T) {
	data := []byte("must stay in the root")
	for _, tc := range []struct {
		name string
		link func(outside string) string // the target of root/etc
	}{
		{"absolute", func(outside string) string { return outside }},
		{"relative", func(outside string) string {
			return strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outside, root := outsideDir(t), t.TempDir()
			if err := os.Symlink(tc.link(outside), filepath.Join(root, "etc")); err != nil {
				t.Fatal(err)
			}
			for _, art := range []oci.CachedArtifact{
				fileArtifact(t, "/etc/app.conf", data, 0),
				fileArtifact(t, "/etc/sub/app.conf", data, 0),
				archiveArtifact(t, "/etc/app", render.ArchiveTar, compression.None, ocitest.File("f", string(data), 0o644)),
			} {
				if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err == nil || !strings.Contains(err.Error(), "path escapes") {
					t.Errorf("PlaceArtifacts at %s through a link out of the root = %v, want the root to refuse the path", art.Path, err)
				}
			}
			assertEmpty(t, outside)
		})
	}

	// The path itself a link out: the link is replaced, not followed.
	outside, root := outsideDir(t), t.TempDir()
	target := filepath.Join(outside, "app.conf")
	os.WriteFile(target, []byte("outside"), 0o644)
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	os.Symlink(target, filepath.Join(root, "etc/app.conf"))
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{fileArtifact(t, "/etc/app.conf", data, 0)}, 0); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, target); got != "outside" {
		t.Errorf("the file outside = %q: written through the link", got)
	}
	if fi, err := os.Lstat(filepath.Join(root, "etc/app.conf")); err != nil || !fi.Mode().IsRegular() || readFile(t, filepath.Join(root, "etc/app.conf")) != string(data) {
		t.Errorf("etc/app.conf: %v, %v; want the artifact in place of the link", fi, err)
	}
	// An archive's directory a link (even inside the root): refused.
	os.Symlink("etc", filepath.Join(root, "opt"))
	art := archiveArtifact(t, "/opt", render.ArchiveTar, compression.None, ocitest.File("f", "x", 0o644))
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err == nil || !strings.Contains(err.Error(), "something other than a directory") {
		t.Errorf("extracting into a link = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/f")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("etc/f: %v, want nothing extracted through the link", err)
	}
}

// archive is the bytes of a tar of the entries, compressed with comp.
func archive(t *testing.T, comp compression.Compression, ents ...ocitest.Entry) []byte {
	t.Helper()
	l := ocitest.Layer(t, comp, ents...)
	open := l.Compressed
	if comp == compression.None {
		open = l.Uncompressed // Compressed would gzip it
	}
	rc, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func archiveArtifact(t *testing.T, path, format string, comp compression.Compression, ents ...ocitest.Entry) oci.CachedArtifact {
	t.Helper()
	data := archive(t, comp, ents...)
	return oci.CachedArtifact{Artifact: render.Artifact{URL: "https://example.com/a", SHA256: sum(data), Path: path, Archive: format}, Blob: writeBlob(t, data)}
}

func TestPlaceArtifactArchives(t *testing.T) {
	withUmask(t, 0o077)
	ents := []ocitest.Entry{
		ocitest.Dir("bin", 0o755), ocitest.File("bin/tool", "#!tool", 0o755),
		ocitest.File("etc/tool.conf", "conf", 0o640), // its directory implicit
		ocitest.Dir("share", 0o555), ocitest.File("share/doc", "doc", 0o444),
		ocitest.Dir("tmp", 0o1777), ocitest.File("sbin/su", "su", 0o4755),
		ocitest.Symlink("bin/t", "tool"), ocitest.Hardlink("bin/tool2", "bin/tool"),
		ocitest.Symlink("abs", "/usr/local/bin/tool"), // kept as written: resolved in the jail
		// Not whiteouts in an artifact: files like any other.
		ocitest.File(".wh.old", "a file named .wh.old", 0o644),
		ocitest.File("share2/.wh..wh..opq", "", 0o644),
		ocitest.File("share2/.wh.x", "", 0o600),
	}
	for _, tc := range []struct {
		format string
		comp   compression.Compression
	}{
		{render.ArchiveTar, compression.None},
		{render.ArchiveTarGz, compression.GZip},
		{render.ArchiveTarZstd, compression.ZStd},
	} {
		t.Run(tc.format, func(t *testing.T) {
			root := t.TempDir()
			app := filepath.Join(root, "opt/app")
			// What is there already: kept, unless an entry replaces it.
			os.MkdirAll(filepath.Join(app, "share2"), 0o755)
			os.WriteFile(filepath.Join(app, "old"), []byte("kept"), 0o644)
			os.WriteFile(filepath.Join(app, "share2/x"), []byte("kept"), 0o644)
			os.WriteFile(filepath.Join(app, "bin"), []byte("a file where the archive has a directory"), 0o644)
			art := archiveArtifact(t, "/opt/app", tc.format, tc.comp, ents...)
			if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err != nil {
				t.Fatal(err)
			}
			for p, want := range map[string]string{
				"bin/tool": "#!tool", "bin/t": "#!tool", "bin/tool2": "#!tool", "etc/tool.conf": "conf", "share/doc": "doc",
				".wh.old": "a file named .wh.old", "old": "kept", "share2/x": "kept", "share2/.wh..wh..opq": "", "share2/.wh.x": "",
			} {
				if got := readFile(t, filepath.Join(app, p)); got != want {
					t.Errorf("%s = %q, want %q", p, got, want)
				}
			}
			for p, want := range map[string]fs.FileMode{
				"bin": fs.ModeDir | 0o755, "bin/tool": 0o755, "etc/tool.conf": 0o640, "share": fs.ModeDir | 0o555,
				"share/doc": 0o444, "tmp": fs.ModeDir | fs.ModeSticky | 0o777, "sbin/su": fs.ModeSetuid | 0o755,
				"share2/.wh.x": 0o600, "bin/t": fs.ModeSymlink | 0o777,
			} {
				fi, err := os.Lstat(filepath.Join(app, p))
				if err != nil || fi.Mode() != want {
					t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode(), err, want)
				}
			}
			if fi, err := os.Stat(filepath.Join(app, "bin/tool")); err != nil || !fi.ModTime().Equal(ocitest.MTime) {
				t.Errorf("bin/tool modified %v, want %v", fi.ModTime(), ocitest.MTime)
			}
			a, _ := os.Stat(filepath.Join(app, "bin/tool"))
			b, _ := os.Stat(filepath.Join(app, "bin/tool2"))
			if a == nil || b == nil || !os.SameFile(a, b) {
				t.Error("bin/tool2 is not a hard link of bin/tool")
			}
			if to, err := os.Readlink(filepath.Join(app, "abs")); err != nil || to != "/usr/local/bin/tool" {
				t.Errorf("abs -> %q, %v", to, err)
			}
			// Extracted again (each start): the same, over itself.
			if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err != nil {
				t.Errorf("extracting again: %v", err)
			}
			if got := readFile(t, filepath.Join(app, "bin/tool")); got != "#!tool" {
				t.Errorf("bin/tool after a second extraction = %q", got)
			}
		})
	}
}

func TestPlaceArtifactArchiveFormats(t *testing.T) {
	ents := []ocitest.Entry{ocitest.File("f", "x", 0o644)}
	for _, tc := range []struct {
		declared string
		comp     compression.Compression
		want     string
	}{
		{render.ArchiveTarGz, compression.None, "the spec says tar.gz, but the file is not"},
		{render.ArchiveTar, compression.GZip, "the spec says tar, but the file is tar.gz"},
		{render.ArchiveTar, compression.ZStd, "the spec says tar, but the file is tar.zst"},
		{render.ArchiveTarZstd, compression.GZip, "the spec says tar.zst, but the file is not"},
		{render.ArchiveTarGz, compression.ZStd, "the spec says tar.gz, but the file is not"},
		{"zip", compression.None, `archive format "zip" is not one Keel extracts`},
	} {
		t.Run(tc.declared+" of "+string(tc.comp), func(t *testing.T) {
			root := t.TempDir()
			err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{archiveArtifact(t, "/opt/app", tc.declared, tc.comp, ents...)}, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("PlaceArtifacts = %v, want an error containing %q", err, tc.want)
			}
			assertEmpty(t, root)
		})
	}
	// Not an archive at all.
	root := t.TempDir()
	art := fileArtifact(t, "/opt/app", bytes.Repeat([]byte("not a tar "), 100), 0)
	art.Archive = render.ArchiveTar
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err == nil {
		t.Error("extracting a text file as a tar succeeded")
	}
	// A gzip stream that is not a tar inside.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte("not a tar "), 100))
	zw.Close()
	art = fileArtifact(t, "/opt/app", gz.Bytes(), 0)
	art.Archive = render.ArchiveTarGz
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err == nil {
		t.Error("extracting gzipped text as a tar.gz succeeded")
	}
}

func TestPlaceArtifactHostileArchives(t *testing.T) {
	outside := outsideDir(t)
	rel := strings.TrimPrefix(outside, "/")
	up := strings.Repeat("../", 20)
	for _, tc := range []struct {
		name string
		ents []ocitest.Entry
		want string
	}{
		{"climbing path", []ocitest.Entry{ocitest.File("../x", "x", 0o644)}, `a path with "..": refused`},
		{"climbing far", []ocitest.Entry{ocitest.File(up+rel+"/escape", "x", 0o644)}, `a path with "..": refused`},
		{"climbing inside", []ocitest.Entry{ocitest.Dir("a", 0o755), ocitest.File("a/../../x", "x", 0o644)}, `a path with "..": refused`},
		{"absolute path", []ocitest.Entry{ocitest.File(outside+"/escape", "x", 0o644)}, "an absolute path: refused"},
		{"device node", []ocitest.Entry{{Name: "null", Type: tar.TypeChar, Mode: 0o666}}, "a device node: refused"},
		{"block device", []ocitest.Entry{{Name: "disk", Type: tar.TypeBlock, Mode: 0o666}}, "a device node: refused"},
		{"fifo", []ocitest.Entry{{Name: "fifo", Type: tar.TypeFifo, Mode: 0o644}}, "a FIFO: refused"},
		{"file through an absolute symlink out", []ocitest.Entry{ocitest.Symlink("out", outside), ocitest.File("out/escape", "x", 0o644)}, "escape"},
		{"dir through an absolute symlink out", []ocitest.Entry{ocitest.Symlink("out", outside), ocitest.Dir("out/escape", 0o755)}, "escape"},
		{"file through a relative symlink out", []ocitest.Entry{ocitest.Symlink("up", up), ocitest.File("up/"+rel+"/escape", "x", 0o644)}, "escape"},
		{"file through a symlink to the root above", []ocitest.Entry{ocitest.Symlink("up", "../.."), ocitest.File("up/etc/passwd", "pwned", 0o644)}, "escape"},
		{"hard link out", []ocitest.Entry{ocitest.Hardlink("passwd", "../../etc/passwd")}, `a path with "..": refused`},
		{"hard link absolute", []ocitest.Entry{ocitest.Hardlink("passwd", "/etc/passwd")}, "an absolute path: refused"},
		{"hard link through a symlink out", []ocitest.Entry{ocitest.Symlink("etc", "../../etc"), ocitest.Hardlink("passwd", "etc/passwd")}, "not a file of the image"},
		{"hard link to a directory", []ocitest.Entry{ocitest.Dir("d", 0o755), ocitest.Hardlink("d2", "d")}, "not a file of the image"},
		{"hard link then written", []ocitest.Entry{ocitest.Symlink("up", "../.."), ocitest.Hardlink("x", "up/etc/passwd")}, "not a file of the image"},
		{"root not a directory", []ocitest.Entry{ocitest.File(".", "x", 0o644)}, "the root is not a directory: refused"},
		{"path too deep", []ocitest.Entry{ocitest.File(strings.Repeat("a/", 300)+"f", "x", 0o644)}, "deeper than 256: refused"},
		{"symlink loop", []ocitest.Entry{ocitest.Symlink("a", "b"), ocitest.Symlink("b", "a"), ocitest.File("a/x", "x", 0o644)}, "too many levels of symbolic links"},
		{"unknown entry type", []ocitest.Entry{{Name: "x", Type: 'Z', Mode: 0o644}}, "entry type 'Z': refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "etc"), 0o755)
			passwd := filepath.Join(root, "etc/passwd")
			os.WriteFile(passwd, []byte("root:*:0:0"), 0o644)
			for _, c := range []struct {
				format string
				comp   compression.Compression
			}{{render.ArchiveTar, compression.None}, {render.ArchiveTarGz, compression.GZip}} {
				art := archiveArtifact(t, "/opt/app", c.format, c.comp, tc.ents...)
				err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: PlaceArtifacts = %v, want an error containing %q", c.format, err, tc.want)
				}
			}
			assertEmpty(t, outside)
			// Confined to its directory, not only to the root.
			if got := readFile(t, passwd); got != "root:*:0:0" {
				t.Errorf("the root's etc/passwd = %q", got)
			}
			if entries, _ := os.ReadDir(root); len(entries) != 2 { // etc, opt
				t.Errorf("the root holds %v, want etc and opt", entries)
			}
		})
	}
}

// An archive extracted where the root's files are hard links to an
// image's, and its links lead out: nothing is written through them.
func TestPlaceArtifactArchiveOverLinks(t *testing.T) {
	cache, outside, root := t.TempDir(), outsideDir(t), t.TempDir()
	image := filepath.Join(cache, "conf")
	os.WriteFile(image, []byte("the image's"), 0o644)
	before := must(os.Stat(image))
	app := filepath.Join(root, "opt/app")
	os.MkdirAll(app, 0o755)
	os.Link(image, filepath.Join(app, "conf"))
	os.Symlink(outside, filepath.Join(app, "out"))     // an image's links
	os.Symlink("../../etc", filepath.Join(app, "etc")) // in the root, out of the directory
	for i, ents := range [][]ocitest.Entry{
		{ocitest.File("conf", "the artifact's", 0o600)},
		{ocitest.File("out/escape", "x", 0o644)},
		{ocitest.File("etc/passwd", "x", 0o644)},
		{ocitest.Dir("out/d", 0o755)},
		{ocitest.Dir("etc/d", 0o755)},
	} {
		art := archiveArtifact(t, "/opt/app", render.ArchiveTar, compression.None, ents...)
		if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); (err == nil) != (i == 0) {
			t.Errorf("%s: PlaceArtifacts = %v", ents[0].Name, err)
		}
	}
	if got, fi := readFile(t, image), must(os.Stat(image)); got != "the image's" || fi.Mode() != 0o644 || !fi.ModTime().Equal(before.ModTime()) {
		t.Errorf("the image's file = %q (%v, %v): changed through its hard link", got, fi.Mode(), fi.ModTime())
	}
	if got := readFile(t, filepath.Join(app, "conf")); got != "the artifact's" {
		t.Errorf("conf = %q", got)
	}
	assertEmpty(t, outside)
	if _, err := os.Lstat(filepath.Join(root, "etc")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("root/etc: %v, want nothing written above the archive's directory", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestPlaceArtifactArchiveLimits(t *testing.T) {
	root := t.TempDir()
	bomb := archiveArtifact(t, "/opt/bomb", render.ArchiveTarGz, compression.GZip, ocitest.File("zeros", strings.Repeat("\x00", 4<<20), 0o644))
	if fi, _ := os.Stat(bomb.Blob); fi.Size() > 64<<10 {
		t.Fatalf("the bomb is %d bytes", fi.Size())
	}
	err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{bomb}, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "more than the 1048576 bytes allowed") {
		t.Errorf("PlaceArtifacts of 4 MiB with 1 MiB allowed = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "opt/bomb/zeros")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("zeros: %v, want nothing written", err)
	}
	// The bytes of all its files count.
	many := archiveArtifact(t, "/opt/many", render.ArchiveTar, compression.None,
		ocitest.File("a", strings.Repeat("a", 600<<10), 0o644), ocitest.File("b", strings.Repeat("b", 600<<10), 0o644))
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{many}, 1<<20); err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Errorf("PlaceArtifacts of 1.2 MiB in two files with 1 MiB allowed = %v", err)
	}
	// Within the limit.
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{many}, 2<<20); err != nil {
		t.Errorf("PlaceArtifacts within the limit = %v", err)
	}
	// Each artifact has the limit to itself.
	other := archiveArtifact(t, "/opt/other", render.ArchiveTar, compression.None, ocitest.File("c", strings.Repeat("c", 600<<10), 0o644))
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{many, other}, 2<<20); err != nil {
		t.Errorf("two artifacts each within the limit = %v", err)
	}
}

func TestPlaceArtifactArchiveTampered(t *testing.T) {
	root := t.TempDir()
	art := archiveArtifact(t, "/opt/app", render.ArchiveTar, compression.None, ocitest.File("f", "content", 0o644))
	b, _ := os.ReadFile(art.Blob)
	i := bytes.Index(b, []byte("content"))
	b[i] = 'C' // in the file's body, which no tar checksum covers
	os.WriteFile(art.Blob, b, 0o600)
	err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0)
	if err == nil || !strings.Contains(err.Error(), "does not match its sha256") {
		t.Errorf("PlaceArtifacts of a tampered archive = %v", err)
	}
	// Checked before anything is extracted: nothing of it is in the root.
	if _, err := os.Lstat(filepath.Join(root, "opt/app/f")); err == nil {
		t.Error("a tampered archive was extracted before it was refused")
	}
	// A tar's trailer changed: refused too.
	b, _ = os.ReadFile(art.Blob)
	b[i] = 'c'
	b[len(b)-1] ^= 1
	os.WriteFile(art.Blob, b, 0o600)
	if err := oci.PlaceArtifacts(t.Context(), t.TempDir(), []oci.CachedArtifact{art}, 0); err == nil {
		t.Error("PlaceArtifacts of an archive with a tampered trailer succeeded")
	}
	// Extracting into an existing file, or into a path taken by a file.
	root = t.TempDir()
	os.MkdirAll(filepath.Join(root, "opt"), 0o755)
	os.WriteFile(filepath.Join(root, "opt/app"), []byte("a file"), 0o644)
	art = archiveArtifact(t, "/opt/app", render.ArchiveTar, compression.None, ocitest.File("f", "content", 0o644))
	if err := oci.PlaceArtifacts(t.Context(), root, []oci.CachedArtifact{art}, 0); err == nil || !strings.Contains(err.Error(), "something other than a directory") {
		t.Errorf("extracting over a file = %v", err)
	}
	if got := readFile(t, filepath.Join(root, "opt/app")); got != "a file" {
		t.Errorf("opt/app = %q", got)
	}
}

// End to end: fetched over HTTPS, placed as a file and as an archive.
func TestFetchAndPlaceArtifacts(t *testing.T) {
	tool := []byte("#!/bin/sh\necho tool\n")
	tgz := archive(t, compression.GZip, ocitest.Dir("lib", 0o755), ocitest.File("lib/x.so", "elf", 0o555))
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/tool":
			_, _ = w.Write(tool)
		case "/lib.tgz":
			_, _ = w.Write(tgz)
		}
	})
	p := srv.puller(t, nil)
	arts := []render.Artifact{
		{URL: srv.URL + "/tool", SHA256: sum(tool), Path: "/usr/local/bin/tool", Mode: 0o750},
		{URL: srv.URL + "/lib.tgz?X-Signature=" + secret, SHA256: sum(tgz), Path: "/usr/local/lib/x", Archive: render.ArchiveTarGz},
	}
	var cached []oci.CachedArtifact
	for _, a := range arts {
		blob, err := p.FetchArtifact(t.Context(), a, nil)
		if err != nil {
			t.Fatal(err)
		}
		cached = append(cached, oci.CachedArtifact{Artifact: a, Blob: blob})
	}
	root := t.TempDir()
	if err := oci.PlaceArtifacts(t.Context(), root, cached, 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/bin/tool")); err != nil || fi.Mode() != 0o750 || readFile(t, filepath.Join(root, "usr/local/bin/tool")) != string(tool) {
		t.Errorf("tool: %v, %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/lib/x/lib/x.so")); err != nil || fi.Mode() != 0o555 || readFile(t, filepath.Join(root, "usr/local/lib/x/lib/x.so")) != "elf" {
		t.Errorf("lib/x.so: %v, %v", fi, err)
	}
}

func TestFetchArtifactStalled(t *testing.T) {
	body := bytes.Repeat([]byte("slow "), 4000)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	srv := newHTTPS(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body[:1000])
		w.(http.Flusher).Flush()
		select { // stalls mid-body
		case <-r.Context().Done():
		case <-stop:
		}
	})
	p := srv.puller(t, nil)
	p.Stall = 300 * time.Millisecond
	a := render.Artifact{URL: srv.URL + "/f", SHA256: sum(body), Path: "/f"}
	start := time.Now()
	if _, err := p.FetchArtifact(t.Context(), a, nil); err == nil || !strings.Contains(err.Error(), "the server stalled") {
		t.Errorf("FetchArtifact from a stalled server = %v", err)
	} else if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the stall was noticed after %v", d)
	}
	assertCacheEmpty(t, p)
}
