package nodeexec_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"

	"github.com/keel-dev/keel/nodeexec"
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

func TestPruneImages(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	shared := ocitest.Layer(t, compression.GZip, ocitest.File("usr/lib/libc.so", strings.Repeat("c", 4096), 0o644))
	v1 := reg.Push(t, "app", ocitest.Image(t, shared, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "v1", 0o755))))
	v2 := reg.Push(t, "app", ocitest.Image(t, shared, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "v2", 0o755))))
	w := newWorld(t, map[string]string{"a.yaml": withImage("app", ocitest.Spec(v2))})
	w.puller = &oci.Puller{Dir: t.TempDir()}
	w.newReconciler()
	w.passOnce()
	w.waitWake()
	w.pass()
	w.set("a.yaml", withImage("app", ocitest.Spec(v1)))
	w.passOnce()
	w.waitWake()
	w.pass()
	if imgs, _ := w.drv.Images(t.Context()); len(imgs) != 2 {
		t.Fatalf("images on the node: %+v", imgs)
	}
	prune := func(grace time.Duration) (nodeexec.PruneResult, error) {
		t.Helper()
		type out struct {
			res nodeexec.PruneResult
			err error
		}
		ch := make(chan out, 1)
		if err := w.rec.PruneImages(grace, func(res nodeexec.PruneResult, err error) { ch <- out{res, err} }); err != nil {
			t.Fatal(err)
		}
		if err := w.rec.PruneImages(grace, nil); !errors.Is(err, nodeexec.ErrPruning) {
			t.Errorf("a second prune while one runs: %v", err)
		}
		o := <-ch
		w.waitWake()
		w.pass() // folds it
		return o.res, o.err
	}
	// Within the grace period both are kept.
	if res, err := prune(time.Hour); err != nil || len(res.Removed) != 0 || len(res.Kept) != 2 {
		t.Fatalf("prune within the grace: %+v, %v", res, err)
	}
	// An image the driver cannot remove (busy: on FreeBSD a clone of its
	// snapshot) is kept with its layers, and the collection goes on.
	w.drv.SetImageBusy(v2.Digest, true)
	if res, err := prune(0); err != nil || len(res.Removed) != 0 || len(res.Kept) != 2 || res.Layers != 0 {
		t.Fatalf("prune of a busy image: %+v, %v; want both kept, no layer removed", res, err)
	}
	w.drv.SetImageBusy(v2.Digest, false)
	res, err := prune(0)
	if err != nil || len(res.Removed) != 1 || res.Removed[0].Digest != v2.Digest || res.Layers != 1 {
		t.Fatalf("prune: %+v, %v; want v2 and its own layer removed", res, err)
	}
	blobs, _ := w.puller.Blobs()
	if len(blobs) != 2 {
		t.Errorf("layers left: %v, want v1's two", blobs)
	}
	if _, ok := w.running()["app"]; !ok {
		t.Fatal("the prune stopped the instance")
	}
	// Back to v2: pulled again (its shared layer is still there).
	before := reg.Blobs.Load()
	w.set("a.yaml", withImage("app", ocitest.Spec(v2)))
	w.passOnce()
	if ri := statusOf(t, w, "app"); ri.Pull == nil {
		t.Fatalf("v2 after its prune: %+v, want it pulled again", ri)
	}
	w.waitWake()
	if res := w.pass(); res.Replaced != 1 {
		t.Fatalf("v2 after its prune: %+v", res)
	}
	if got := reg.Blobs.Load() - before; got != 2 {
		t.Errorf("pulling v2 again fetched %d blobs, want 2 (its config and its own layer)", got)
	}

	// The automatic collection: only past a bound, only past the grace.
	w.rec.Close()
	w.newReconcilerWith(func(c *nodeexec.Config) { c.ImageGC = nodeexec.ImageGC{MaxSize: 1, MinFree: -1} })
	collect := func() nodeexec.PruneResult {
		t.Helper()
		w.pass()
		ch := make(chan nodeexec.PruneResult, 1)
		w.rec.CollectImages(func(res nodeexec.PruneResult, err error) {
			if err != nil {
				t.Error(err)
			}
			ch <- res
		})
		res := <-ch
		w.pass() // folds it
		return res
	}
	if res := collect(); len(res.Removed) != 0 || res.Reason == "" {
		t.Fatalf("the collection within the grace: %+v", res)
	}
	if imgs, _ := w.drv.Images(t.Context()); len(imgs) != 2 {
		t.Fatalf("the collection removed an image within its grace: %+v", imgs)
	}
	w.clk.advance(2 * time.Hour)
	if res := collect(); len(res.Removed) != 1 || !strings.Contains(res.Reason, "more than the 1 allowed") {
		t.Fatalf("the collection past the grace: %+v", res)
	}
	if imgs, _ := w.drv.Images(t.Context()); len(imgs) != 1 || imgs[0].Digest != v2.Digest {
		t.Fatalf("after the collection: %+v, want v2 only (in use)", imgs)
	}
}

func TestUnwantedPullGivesUpItsSlot(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	x := reg.Push(t, "x", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "x", 0o755))))
	y := reg.Push(t, "y", ocitest.Image(t, ocitest.Layer(t, compression.GZip, ocitest.File("bin/app", "y", 0o755))))
	// The registry stalls x's requests until the client gives up.
	reg.Serve(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.Contains(r.URL.Path, "/x/") {
			return false
		}
		<-r.Context().Done()
		return true
	})
	w := newWorld(t, map[string]string{"a.yaml": withImage("app", ocitest.Spec(x))})
	w.puller = &oci.Puller{Dir: t.TempDir()}
	w.newReconcilerWith(func(c *nodeexec.Config) { c.MaxPulls = 1 })
	w.passOnce() // x's pull starts, and stalls
	w.set("a.yaml", withImage("app", ocitest.Spec(y)))
	w.passOnce() // x is wanted no more: cancelled
	w.waitWake()
	w.passOnce() // y's pull starts in the slot
	w.waitWake()
	w.pass()
	if _, ok := w.running()["app"]; !ok {
		t.Fatalf("app does not run from y: %+v", statusOf(t, w, "app"))
	}
}
