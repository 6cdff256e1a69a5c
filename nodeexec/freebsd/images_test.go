package freebsd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// imageAdded is the clock of the drivers that add images in these tests.
var imageAdded = time.Date(2026, 5, 2, 10, 30, 0, 0, time.UTC)

// pullImage pushes an image holding what a jail's workload needs
// (/usr/bin/env, /bin/sleep, an empty /dev) and two files to a registry on
// 127.0.0.1, and pulls it into a blob cache: what the reconciler hands
// AddImage.
func pullImage(t *testing.T) (render.ImageRef, *oci.Image) {
	t.Helper()
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "team/web", ocitest.Image(t,
		ocitest.Layer(t, compression.None, ocitest.Dir("dev", 0o755), ocitest.Dir("usr/bin", 0o755),
			ocitest.File("usr/bin/env", "#!/bin/sh\n", 0o755), ocitest.File("bin/sleep", "#!/bin/sh\n", 0o755),
			ocitest.File("etc/motd", "old\n", 0o644), ocitest.File("etc/big", strings.Repeat("x", 64<<10), 0o644)),
		ocitest.Layer(t, compression.GZip, ocitest.File("etc/motd", "welcome\n", 0o644))))
	img, err := (&oci.Puller{Dir: t.TempDir()}).Fetch(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ref, img
}

// ociSpec is an instance of the image without network, volumes or limits.
func ociSpec(name string, ref render.ImageRef) nodeexec.InstanceSpec {
	return nodeexec.InstanceSpec{
		Name:     name,
		Node:     "n1",
		SpecHash: "hash-" + name,
		Spec: render.JailSpec{
			Image:   ocitest.Spec(ref),
			Command: []string{"/bin/sleep", "300"},
		},
	}
}

// rootFile reads a file of an instance's root on the simulated host.
func rootFile(t *testing.T, h *host, instance, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, "zroot/keel/jails", instance, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantImage checks that the driver has the image, whole, as AddImage of
// img at imageAdded recorded it.
func wantImage(t *testing.T, d *freebsd.Driver, img *oci.Image) {
	t.Helper()
	ctx := t.Context()
	if has, err := d.HasImage(ctx, img.Digest); !has || err != nil {
		t.Fatalf("HasImage = %v, %v; want the image", has, err)
	}
	list, err := d.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("Images = %+v, want one", list)
	}
	got := list[0]
	if got.Digest != img.Digest || got.Manifest != img.Manifest || got.Size != img.Size ||
		got.Unpacked < 64<<10 || !got.Added.Equal(imageAdded) || !slices.Equal(got.Layers, img.LayerDigests()) {
		t.Errorf("Images = %+v\nwant digest %s, manifest %s, size %d, layers %q, added %v", got, img.Digest, img.Manifest, img.Size, img.LayerDigests(), imageAdded)
	}
}

// An OCI image is a read-only dataset under <pool>/keel/images with its
// metadata on its @keel snapshot; instances start from clones of the
// snapshot, and the image cannot be removed while one exists.
func TestOCIImages(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{Now: func() time.Time { return imageAdded }})
	ctx := t.Context()
	ref, img := pullImage(t)
	ds := "zroot/keel/images/" + ref.Hex()

	if _, err := d.Start(ctx, ociSpec("web-0", ref)); err == nil || !strings.Contains(err.Error(), "is not pulled on this node") {
		t.Fatalf("Start before AddImage = %v", err)
	}
	h.leaks(t, fbsdsim.Expect{})
	if has, err := d.HasImage(ctx, ref.Digest); has || err != nil {
		t.Fatalf("HasImage before AddImage = %v, %v", has, err)
	}
	if list, err := d.Images(ctx); len(list) != 0 || err != nil {
		t.Fatalf("Images before AddImage = %v, %v", list, err)
	}

	if err := d.AddImage(ctx, img, 0); err != nil {
		t.Fatal(err)
	}
	wantImage(t, d, img)
	st := h.sim.State()
	if st.Datasets["zroot/keel/images"] == nil || st.Datasets[ds].Props["readonly"] != "on" {
		t.Errorf("the image's dataset is %+v under %+v, want it readonly under a parent the driver made", st.Datasets[ds], st.Datasets["zroot/keel/images"])
	}
	h.rec.take()
	if err := d.AddImage(ctx, img, 0); err != nil {
		t.Fatal(err)
	}
	if c := changing(h.rec.take()); len(c) > 0 {
		t.Errorf("AddImage of an image there ran %q", c)
	}

	// Two instances, each a clone of the snapshot: the image's files,
	// its later layer over the earlier one, and writes of their own.
	for _, name := range []string{"web-0", "web-1"} {
		if _, err := d.Start(ctx, ociSpec(name, ref)); err != nil {
			t.Fatal(err)
		}
		if got := rootFile(t, h, name, "etc/motd"); got != "welcome\n" {
			t.Errorf("%s etc/motd = %q", name, got)
		}
	}
	st = h.sim.State()
	for _, name := range []string{"web-0", "web-1"} {
		if o := st.Datasets["zroot/keel/jails/"+name].Origin; o != ds+"@keel" {
			t.Errorf("%s's root is a clone of %q, want %s@keel", name, o, ds)
		}
		if ro := st.Datasets["zroot/keel/jails/"+name].Props["readonly"]; ro != "" {
			t.Errorf("%s's root has readonly=%s set", name, ro)
		}
	}
	if err := os.WriteFile(filepath.Join(h.root, "zroot/keel/jails/web-0/etc/motd"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := rootFile(t, h, "web-1", "etc/motd"); got != "welcome\n" {
		t.Errorf("a write in web-0's root reached web-1's: %q", got)
	}
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0", "keel-web-1"}})

	// The image is in use: ZFS refuses to destroy it and nothing changes.
	err := d.RemoveImage(ctx, ref.Digest)
	if !errors.Is(err, nodeexec.ErrBusy) || !strings.Contains(err.Error(), "instance web-0, instance web-1") {
		t.Fatalf("RemoveImage while two roots are clones of it = %v, want ErrBusy naming them", err)
	}
	wantImage(t, d, img)
	for _, name := range []string{"web-0", "web-1"} {
		if err := d.Stop(ctx, name, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := d.Destroy(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.RemoveImage(ctx, ref.Digest); err != nil {
		t.Fatal(err)
	}
	if has, err := d.HasImage(ctx, ref.Digest); has || err != nil {
		t.Errorf("HasImage after RemoveImage = %v, %v", has, err)
	}
	if list, err := d.Images(ctx); len(list) != 0 || err != nil {
		t.Errorf("Images after RemoveImage = %v, %v", list, err)
	}
	if st := h.sim.State(); st.Datasets[ds] != nil || st.Snapshots[ds+"@keel"] != nil {
		t.Error("RemoveImage left the dataset or its snapshot")
	}
	if err := d.RemoveImage(ctx, ref.Digest); err != nil {
		t.Errorf("RemoveImage of an image not there = %v", err)
	}
	h.leaks(t, fbsdsim.Expect{})

	for _, bad := range []string{"sha256:../../etc", "sha256:" + strings.Repeat("A", 64), "zroot/keel/jails"} {
		if _, err := d.HasImage(ctx, bad); err == nil {
			t.Errorf("HasImage(%q) took it", bad)
		}
		if err := d.RemoveImage(ctx, bad); err == nil {
			t.Errorf("RemoveImage(%q) took it", bad)
		}
	}
	broken := *img
	broken.Manifest = "sha256:x,keel:size=1"
	if err := d.AddImage(ctx, &broken, 0); err == nil {
		t.Error("AddImage took a manifest digest that is no digest")
	}
}

// An AddImage killed at any of its commands (the agent died: nothing
// more runs) leaves no image that HasImage or Images takes for whole,
// unless the snapshot was taken; a restarted agent's AddImage makes it
// whole, and nothing is left behind.
func TestAddImageKilledAtEachStep(t *testing.T) {
	ref, img := pullImage(t)
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	h.rec.take()
	if err := d.AddImage(t.Context(), img, 0); err != nil {
		t.Fatal(err)
	}
	cmds := h.rec.take()
	for _, after := range []bool{false, true} {
		for at := 1; at <= len(cmds); at++ {
			t.Run(fmt.Sprintf("after=%v/%d", after, at), func(t *testing.T) {
				ctx := t.Context()
				h := newHost(t, fbsdsim.Options{})
				state := t.TempDir()
				k := &killer{inner: h.rec}
				d, err := freebsd.New(ctx, freebsd.Options{Runner: k, Root: h.root, StateDir: state})
				if err != nil {
					t.Fatal(err)
				}
				k.mu.Lock()
				k.at, k.n, k.after, k.dead = at, 0, after, true
				k.mu.Unlock()
				err = d.AddImage(ctx, img, 0)
				t.Logf("killed at %q: AddImage = %v", k.hit, err)
				snapshotted := after && strings.HasPrefix(k.hit, "zfs snapshot ")
				if err == nil && !snapshotted {
					t.Fatal("AddImage succeeded though it was killed")
				}
				d = h.driver(t, state, freebsd.Options{Now: func() time.Time { return imageAdded }})
				has, err := d.HasImage(ctx, ref.Digest)
				if err != nil || has != snapshotted {
					t.Fatalf("HasImage after the kill = %v, %v; want %v", has, err, snapshotted)
				}
				if list, err := d.Images(ctx); err != nil || len(list) != map[bool]int{false: 0, true: 1}[snapshotted] {
					t.Fatalf("Images after the kill = %+v, %v", list, err)
				}
				if !snapshotted {
					if err := d.AddImage(ctx, img, 0); err != nil {
						t.Fatalf("the restarted agent's AddImage: %v", err)
					}
					wantImage(t, d, img)
				}
				if _, err := d.Start(ctx, ociSpec("web-0", ref)); err != nil {
					t.Fatal(err)
				}
				if got := rootFile(t, h, "web-0", "etc/motd"); got != "welcome\n" {
					t.Errorf("etc/motd = %q", got)
				}
				h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
			})
		}
	}
}

// canceler is a Runner that cancels the context once the driver asks
// where the new image's dataset is mounted, just before it unpacks.
type canceler struct {
	*recorder
	cancel context.CancelFunc
}

func (c *canceler) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	res, err := c.recorder.Run(ctx, argv)
	if slices.Contains(argv, "mounted,mountpoint") {
		c.cancel()
	}
	return res, err
}

// An AddImage cut short while it unpacks (its context canceled: a pull
// given up, an agent shutting down), or refused for its size, destroys
// what it made; the next AddImage does it all again.
func TestAddImageCutShort(t *testing.T) {
	ref, img := pullImage(t)
	h := newHost(t, fbsdsim.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	d, err := freebsd.New(ctx, freebsd.Options{Runner: &canceler{recorder: h.rec, cancel: cancel}, Root: h.root, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.AddImage(ctx, img, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("AddImage canceled while it unpacks = %v", err)
	}
	h.leaks(t, fbsdsim.Expect{})
	if st := h.sim.State(); st.Datasets["zroot/keel/images/"+ref.Hex()] != nil {
		t.Error("the canceled AddImage left its dataset")
	}

	d = h.driver(t, "", freebsd.Options{Now: func() time.Time { return imageAdded }})
	if err := d.AddImage(t.Context(), img, 1024); err == nil || !strings.Contains(err.Error(), "bytes allowed") {
		t.Fatalf("AddImage of an image larger than allowed = %v", err)
	}
	h.leaks(t, fbsdsim.Expect{})
	if has, err := d.HasImage(t.Context(), img.Digest); has || err != nil {
		t.Fatalf("HasImage after a refused AddImage = %v, %v", has, err)
	}

	// A dataset an earlier agent left mid-unpacking (no snapshot), with
	// a file no layer holds: never used, and replaced whole.
	ds := "zroot/keel/images/" + ref.Hex()
	run(t, h, "zfs", "create", ds)
	if err := os.WriteFile(filepath.Join(h.root, ds, "half"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if has, err := d.HasImage(t.Context(), img.Digest); has || err != nil {
		t.Fatalf("HasImage of a half-unpacked image = %v, %v", has, err)
	}
	if _, err := d.Start(t.Context(), ociSpec("web-0", ref)); err == nil {
		t.Fatal("Start from a half-unpacked image")
	}
	if err := d.AddImage(t.Context(), img, 0); err != nil {
		t.Fatal(err)
	}
	wantImage(t, d, img)
	if _, err := os.Stat(filepath.Join(h.root, ds, "half")); err == nil {
		t.Error("the half-unpacked dataset's file survived AddImage")
	}
	h.leaks(t, fbsdsim.Expect{})
}

// The reconciler with the freebsd driver and a puller: a Jail of an OCI
// image is pulled, unpacked and started from a clone of its snapshot; a
// new digest replaces it; the collection then removes the old image,
// which no root is a clone of any more.
func TestReconcilerRunsOCIImages(t *testing.T) {
	ctx := t.Context()
	reg := ocitest.NewRegistry(t)
	push := func(motd string) render.ImageRef {
		return reg.Push(t, "team/web", ocitest.Image(t, ocitest.Layer(t, compression.GZip,
			ocitest.File("usr/bin/env", "#!/bin/sh\n", 0o755), ocitest.File("bin/sleep", "#!/bin/sh\n", 0o755),
			ocitest.File("etc/motd", motd, 0o644))))
	}
	v1, v2 := push("v1\n"), push("v2\n")
	h := newHost(t, fbsdsim.Options{})
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	// The driver dates the images it adds by the start: the reconciler's
	// clock only moves forward from there.
	start := now
	d := h.driver(t, "", freebsd.Options{Now: func() time.Time { return start }})
	rec, err := nodeexec.NewReconciler(nodeexec.Config{Node: "n1", Driver: d, StateDir: t.TempDir(),
		Now: func() time.Time { return now }, StopGrace: time.Second, Puller: &oci.Puller{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rec.Close(); err != nil {
			t.Error(err)
		}
	})
	model := func(ref render.ImageRef) *render.Model {
		m, err := render.Render(fstest.MapFS{
			"cluster.yaml":  {Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n")},
			"nodes/n1.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1, capacity: {cpu: \"8\", memory: 8G}}\n")},
			"apps/web.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: web}\nspec: {image: \"" + ocitest.Spec(ref) + "\", command: [/bin/sleep, \"300\"], node: n1}\n")},
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// converge passes, as the agent's loop does, until web runs from ref.
	converge := func(ref render.ImageRef) {
		t.Helper()
		m := model(ref)
		deadline := time.Now().Add(30 * time.Second)
		for {
			insts, vols, err := rec.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			own := report.Report{Node: "n1", Time: now, Instances: insts, Volumes: vols}
			plan := planner.Compute(planner.Input{Model: m, Reports: []report.Report{own}, Now: now})
			res, err := rec.Pass(ctx, nodeexec.Desired{Model: m, Plan: plan, Reports: []report.Report{own}})
			if err != nil {
				t.Fatal(err)
			}
			if st := h.sim.State(); res.InFlight == 0 && st.Jail("keel-web") != nil &&
				st.Datasets["zroot/keel/jails/web"].Origin == "zroot/keel/images/"+ref.Hex()+"@keel" {
				if r, err := d.Running(ctx); err == nil && len(r) == 1 {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("web does not run from %s: %+v", ref.Digest, res)
			}
			select {
			case <-rec.Wake():
			case <-time.After(time.Second):
			}
			now = now.Add(2 * time.Second)
		}
	}
	converge(v1)
	if got := rootFile(t, h, "web", "etc/motd"); got != "v1\n" {
		t.Errorf("etc/motd = %q", got)
	}
	converge(v2)
	if got := rootFile(t, h, "web", "etc/motd"); got != "v2\n" {
		t.Errorf("etc/motd after the replace = %q", got)
	}
	if list, err := d.Images(ctx); err != nil || len(list) != 2 {
		t.Fatalf("Images = %+v, %v; want both", list, err)
	}
	prune := func() nodeexec.PruneResult {
		t.Helper()
		type out struct {
			res nodeexec.PruneResult
			err error
		}
		done := make(chan out, 1)
		if err := rec.PruneImages(0, func(res nodeexec.PruneResult, err error) { done <- out{res, err} }); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil {
			t.Fatal(o.err)
		}
		converge(v2) // folds the collection
		return o.res
	}
	// A root made by hand from v1's snapshot: ZFS keeps v1, and so does
	// the collection, without failing.
	old := "zroot/keel/images/" + v1.Hex() + "@keel"
	run(t, h, "zfs", "clone", old, "zroot/keel/jails/stray")
	if res := prune(); len(res.Removed) != 0 || len(res.Kept) != 2 {
		t.Fatalf("the collection with v1 cloned by hand: removed %+v, kept %+v; want both kept", res.Removed, res.Kept)
	}
	run(t, h, "zfs", "destroy", "zroot/keel/jails/stray")
	if res := prune(); len(res.Removed) != 1 || res.Removed[0].Digest != v1.Digest {
		t.Fatalf("the collection: removed %+v, kept %+v; want v1 removed", res.Removed, res.Kept)
	}
	if list, err := d.Images(ctx); err != nil || len(list) != 1 || list[0].Digest != v2.Digest {
		t.Fatalf("Images after the prune = %+v, %v; want v2", list, err)
	}
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web"}})
}
