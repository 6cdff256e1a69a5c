package nodeexec_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/report"
)

// withImage is a Jail on n1 whose spec.image is image.
func withImage(name, image string) string {
	return strings.Replace(jail(name, ""), "image: base/x", "image: "+image, 1)
}

func statusOf(t *testing.T, w *world, name string) report.Instance {
	t.Helper()
	inst, _, err := w.rec.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, ri := range inst {
		if ri.Name == name {
			return ri
		}
	}
	return report.Instance{}
}

func TestOCIImageIsPulledBeforeTheStart(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	v1 := reg.Push(t, "team/app", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "v1", 0o755))))
	v2 := reg.Push(t, "team/app", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "v2", 0o755))))

	w := newWorld(t, map[string]string{"a.yaml": withImage("app", ocitest.Spec(v1))})
	w.puller = &oci.Puller{Dir: t.TempDir()}
	w.newReconciler()

	// The first pass only starts the pull: the instance is pulling.
	if res := w.passOnce(); res.InFlight != 0 || len(res.Errors) != 0 {
		t.Fatalf("first pass: %+v", res)
	}
	if ri := statusOf(t, w, "app"); ri.State != report.StatePulling || ri.Pull == nil || ri.Pull.Image != v1.Name() || ri.Address.IsValid() != true {
		t.Fatalf("while pulling: %+v (pull %+v)", ri, ri.Pull)
	}
	w.waitWake() // the pull ended
	w.pass()
	if _, ok := w.running()["app"]; !ok || w.drv.ImageAdds() != 1 {
		t.Fatalf("not started after the pull: running %v, images added %d", w.running(), w.drv.ImageAdds())
	}
	if ri := statusOf(t, w, "app"); ri.State != report.StateRunning || ri.Pull != nil {
		t.Fatalf("after the pull: %+v", ri)
	}
	pid := w.running()["app"].PID

	// A new digest: the old instance runs on while the new image is
	// pulled, then is replaced.
	w.set("a.yaml", withImage("app", ocitest.Spec(v2)))
	w.passOnce()
	waitStart := w.clk.now()
	if ri := statusOf(t, w, "app"); ri.State != report.StateRunning || ri.Pull == nil || ri.Pull.Image != v2.Name() ||
		ri.Pull.SpecHash != w.model.Instance("app").SpecHash || !ri.Pull.Since.Equal(waitStart) || ri.SpecHash == ri.Pull.SpecHash {
		t.Fatalf("replacing: %+v (pull %+v)", ri, ri.Pull)
	}
	if w.running()["app"].PID != pid {
		t.Fatal("the old instance was stopped before its replacement's image was there")
	}
	w.waitWake()
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("after the new image's pull: %+v", res)
	}
	if w.running()["app"].PID == pid || w.drv.ImageAdds() != 2 {
		t.Fatal("the instance was not replaced")
	}

	// A digest the registry does not have: the instance runs on, the
	// report says why, and the pull is tried again after a backoff.
	missing := v2
	missing.Digest = "sha256:" + strings.Repeat("e", 64)
	w.set("a.yaml", withImage("app", ocitest.Spec(missing)))
	pid = w.running()["app"].PID
	w.passOnce()
	w.waitWake()
	w.passOnce()
	ri := statusOf(t, w, "app")
	if ri.State != report.StateRunning || ri.Pull == nil || ri.Pull.Failures != 1 || !strings.Contains(ri.Pull.Error, "MANIFEST_UNKNOWN") {
		t.Fatalf("a missing digest: %+v (pull %+v)", ri, ri.Pull)
	}
	if w.running()["app"].PID != pid {
		t.Fatal("a failed pull stopped the instance")
	}
	w.passOnce()
	select {
	case <-w.rec.Wake():
		t.Fatal("the pull was retried before its backoff")
	case <-time.After(100 * time.Millisecond):
	}
	since := statusOf(t, w, "app").Pull.Since
	w.clk.advance(time.Second)
	w.passOnce()
	w.waitWake()
	w.passOnce()
	if ri := statusOf(t, w, "app"); ri.Pull == nil || ri.Pull.Failures != 2 || !ri.Pull.Since.Equal(since) {
		t.Fatalf("after the retry: %+v (the wait began at %v)", ri.Pull, since)
	}

	// Back to v1: its image is still on the node, nothing is downloaded.
	before := reg.Blobs.Load()
	w.set("a.yaml", withImage("app", ocitest.Spec(v1)))
	w.passOnce()
	w.waitWake()
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("back to v1: %+v", res)
	}
	if got := reg.Blobs.Load() - before; got != 0 || w.drv.ImageAdds() != 2 {
		t.Errorf("going back to an image the node has fetched %d blobs and added %d images", got, w.drv.ImageAdds())
	}
	if in := w.rec.ImagesInUse(); len(in) != 1 || in[0] != v1.Digest {
		t.Errorf("ImagesInUse = %v, want [%s]", in, v1.Digest)
	}
}

func TestUnreachableRegistryKeepsTheInstance(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	v1 := reg.Push(t, "app", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "v1", 0o755))))
	v2 := reg.Push(t, "app", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "v2", 0o755))))
	w := newWorld(t, map[string]string{"a.yaml": withImage("app", ocitest.Spec(v1))})
	w.puller = &oci.Puller{Dir: t.TempDir()}
	w.newReconciler()
	w.passOnce()
	w.waitWake()
	w.pass()
	pid := w.running()["app"].PID

	reg.Serve(func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	w.set("a.yaml", withImage("app", ocitest.Spec(v2)))
	w.passOnce()
	w.waitWake()
	w.passOnce()
	ri := statusOf(t, w, "app")
	if w.running()["app"].PID != pid || ri.State != report.StateRunning || ri.Pull == nil || !strings.Contains(ri.Pull.Error, "503") {
		t.Fatalf("registry down: running %v, %+v (pull %+v)", w.running(), ri, ri.Pull)
	}
	reg.Serve(nil)
	w.clk.advance(time.Second)
	w.passOnce()
	w.waitWake()
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("registry back: %+v", res)
	}
}
