package nodeexec_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/report"
)

// fileServer serves files by path over HTTPS on 127.0.0.1 and counts
// the requests for each.
type fileServer struct {
	*httptest.Server
	files map[string]string
	hits  map[string]*atomic.Int64
}

func newFileServer(t *testing.T, files map[string]string) *fileServer {
	fs := &fileServer{files: files, hits: map[string]*atomic.Int64{}}
	for p := range files {
		fs.hits[p] = &atomic.Int64{}
	}
	fs.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := fs.files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fs.hits[r.URL.Path].Add(1)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(fs.Close)
	return fs
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// withArtifact is a Jail on n1 with one artifact, the file at urlPath.
func withArtifact(name, url, sum, path string) string {
	return jail(name, fmt.Sprintf("  artifacts:\n    - {url: %q, sha256: %s, path: %s, mode: 0755}\n", url, sum, path))
}

func TestArtifactsAreFetchedBeforeTheStart(t *testing.T) {
	srv := newFileServer(t, map[string]string{"/app-v1": "v1", "/app-v2": "v2", "/lying": "not what the spec says"})
	w := newWorld(t, map[string]string{"a.yaml": withArtifact("app", srv.URL+"/app-v1", sha("v1"), "/usr/local/bin/app")})
	w.puller = &oci.Puller{Dir: t.TempDir(), Transport: srv.Client().Transport}
	w.newReconciler()

	// The first pass starts the fetch: the instance waits for it.
	w.passOnce()
	if ri := statusOf(t, w, "app"); ri.State != report.StatePulling || ri.Pull == nil || !strings.Contains(ri.Pull.Image, sha("v1")) {
		t.Fatalf("while fetching: %+v (pull %+v)", ri, ri.Pull)
	}
	w.waitWake()
	w.pass()
	if _, ok := w.running()["app"]; !ok {
		t.Fatal("not started once its artifact was fetched")
	}
	if got := w.drv.Artifacts("app"); got["/usr/local/bin/app"] != sha("v1") {
		t.Fatalf("placed: %v", got)
	}
	pid := w.running()["app"].PID

	// A checksum the file does not have: refused, the instance runs on,
	// the report says why.
	w.set("a.yaml", withArtifact("app", srv.URL+"/lying", sha("v2"), "/usr/local/bin/app"))
	w.passOnce()
	w.waitWake()
	w.passOnce()
	ri := statusOf(t, w, "app")
	if ri.State != report.StateRunning || ri.Pull == nil || ri.Pull.Failures != 1 || !strings.Contains(ri.Pull.Error, "not "+sha("v2")) {
		t.Fatalf("a wrong checksum: %+v (pull %+v)", ri, ri.Pull)
	}
	if w.running()["app"].PID != pid {
		t.Fatal("a failed fetch stopped the instance")
	}

	// The right file: fetched, then the instance is replaced with it.
	w.set("a.yaml", withArtifact("app", srv.URL+"/app-v2", sha("v2"), "/usr/local/bin/app"))
	w.clk.advance(time.Minute)
	w.passOnce()
	w.waitWake()
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("after the fetch: %+v", res)
	}
	if got := w.drv.Artifacts("app"); got["/usr/local/bin/app"] != sha("v2") || w.running()["app"].PID == pid {
		t.Fatalf("not replaced with v2: %v", got)
	}

	// Back to v1: in the cache, not downloaded again.
	w.set("a.yaml", withArtifact("app", srv.URL+"/app-v1", sha("v1"), "/usr/local/bin/app"))
	w.passOnce()
	w.waitWake()
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("back to v1: %+v", res)
	}
	if n := srv.hits["/app-v1"].Load(); n != 1 {
		t.Errorf("v1 downloaded %d times, want once", n)
	}

	// A prune keeps what the instance uses and removes the rest.
	done := make(chan nodeexec.PruneResult, 1)
	if err := w.rec.PruneImages(0, func(res nodeexec.PruneResult, err error) {
		if err != nil {
			t.Error(err)
		}
		done <- res
	}); err != nil {
		t.Fatal(err)
	}
	res := <-done
	w.waitWake()
	w.pass()
	blobs, _ := w.puller.Blobs()
	if _, ok := blobs["sha256:"+sha("v1")]; !ok || len(blobs) != 1 || res.Layers != 1 {
		t.Fatalf("after a prune: cache %v, %d removed; want v1 kept, v2 removed", blobs, res.Layers)
	}
	// The instance restarts from the cache: nothing is downloaded.
	if err := w.drv.Crash("app", 1); err != nil {
		t.Fatal(err)
	}
	w.clk.advance(time.Minute)
	w.pass()
	if _, ok := w.running()["app"]; !ok || srv.hits["/app-v1"].Load() != 1 {
		t.Fatalf("restart: running %v, v1 downloaded %d times", w.running(), srv.hits["/app-v1"].Load())
	}

	// The cached file deleted by hand: the next start fails, the file is
	// fetched again, and the instance starts.
	blob, _ := w.puller.ArtifactPath(sha("v1"))
	if err := os.Remove(blob); err != nil {
		t.Fatal(err)
	}
	if err := w.drv.Crash("app", 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20 && srv.hits["/app-v1"].Load() < 2; i++ {
		w.clk.advance(time.Minute)
		w.passOnce()
		if w.rec.InFlight() > 0 || srv.hits["/app-v1"].Load() < 2 {
			select {
			case <-w.rec.Wake():
			case <-time.After(2 * time.Second):
			}
		}
	}
	w.clk.advance(time.Minute)
	w.pass()
	if _, ok := w.running()["app"]; !ok || srv.hits["/app-v1"].Load() != 2 {
		t.Fatalf("after the cache was deleted: running %v, v1 downloaded %d times (want twice)", w.running(), srv.hits["/app-v1"].Load())
	}
}

// A hostile archive is refused when it is fetched, before anything
// stops: the instance it was to replace runs on, and the report says why.
func TestHostileArchiveIsRefusedBeforeTheReplace(t *testing.T) {
	var good, bad bytes.Buffer
	for _, c := range []struct {
		buf  *bytes.Buffer
		name string
	}{{&good, "bin/app"}, {&bad, "../../etc/cron.d/evil"}} {
		tw := tar.NewWriter(c.buf)
		tw.WriteHeader(&tar.Header{Name: c.name, Mode: 0o755, Size: 2, Typeflag: tar.TypeReg})
		tw.Write([]byte("hi"))
		tw.Close()
	}
	srv := newFileServer(t, map[string]string{"/good.tar": good.String(), "/bad.tar": bad.String()})
	spec := func(file, sum string) string {
		return jail("app", fmt.Sprintf("  artifacts:\n    - {url: %q, sha256: %s, path: /opt/app, archive: tar}\n", srv.URL+file, sum))
	}
	w := newWorld(t, map[string]string{"a.yaml": spec("/good.tar", sha(good.String()))})
	w.puller = &oci.Puller{Dir: t.TempDir(), Transport: srv.Client().Transport}
	w.newReconciler()
	w.passOnce()
	w.waitWake()
	w.pass()
	pid := w.running()["app"].PID
	if pid == 0 {
		t.Fatal("not started")
	}
	w.set("a.yaml", spec("/bad.tar", sha(bad.String())))
	w.passOnce()
	w.waitWake()
	w.passOnce()
	ri := statusOf(t, w, "app")
	if ri.State != report.StateRunning || ri.Pull == nil || !strings.Contains(ri.Pull.Error, `a path with "..": refused`) {
		t.Fatalf("a hostile archive: %+v (pull %+v)", ri, ri.Pull)
	}
	if w.running()["app"].PID != pid {
		t.Fatal("the instance was replaced by one whose archive is refused")
	}
}
