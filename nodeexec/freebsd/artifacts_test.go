package freebsd_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/render"
)

// cacheArtifacts writes each blob into a puller's cache, named by its
// sha256 as FetchArtifact leaves it, and adds the artifacts to the spec
// (the model's and the cached ones the reconciler hands Start). It
// returns the cached files, in the order of arts.
func cacheArtifacts(t *testing.T, spec *nodeexec.InstanceSpec, arts []render.Artifact, blobs [][]byte) []string {
	t.Helper()
	puller := &oci.Puller{Dir: t.TempDir()}
	var paths []string
	for i, a := range arts {
		sum := sha256.Sum256(blobs[i])
		a.SHA256 = hex.EncodeToString(sum[:])
		p, err := puller.ArtifactPath(a.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, blobs[i], 0o600); err != nil {
			t.Fatal(err)
		}
		if !puller.HasArtifact(a) {
			t.Fatalf("the cache does not hold %s", a.Path)
		}
		spec.Spec.Artifacts = append(spec.Spec.Artifacts, a)
		spec.Artifacts = append(spec.Artifacts, oci.CachedArtifact{Artifact: a, Blob: p})
		paths = append(paths, p)
	}
	return paths
}

// wantRootFile checks a file of an instance's root on the simulated host:
// its content and permission bits.
func wantRootFile(t *testing.T, h *host, instance, name, content string, mode fs.FileMode) {
	t.Helper()
	p := filepath.Join(h.root, "zroot/keel/jails", instance, name)
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
		t.Errorf("%s's %s is %v, want a file of mode %v", instance, name, fi.Mode(), mode)
	}
	if got := rootFile(t, h, instance, name); got != content {
		t.Errorf("%s's %s = %q, want %q", instance, name, got, content)
	}
}

// Artifacts are placed in an instance's root (the host path of its
// clone) after the clone and before the jail: a file replacing one of the
// image's, with its mode, and a tar.gz extracted into a directory. The
// image's dataset keeps its own file; each Start places them again; a
// cached file changed since it was verified fails the Start, and the
// Start that made the root then removes it, before any jail was made.
func TestArtifactsArePlacedInTheClone(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{Now: func() time.Time { return imageAdded }})
	ctx := t.Context()
	ref, img := pullImage(t)
	if err := d.AddImage(ctx, img, 0); err != nil {
		t.Fatal(err)
	}
	imageDS := "zroot/keel/images/" + ref.Hex()
	rootDS := "zroot/keel/jails/web-0"

	motd := "from the artifact\n"
	layer := ocitest.Layer(t, compression.GZip, ocitest.Dir("bin", 0o755),
		ocitest.File("bin/tool", "#!/bin/sh\necho tool\n", 0o755), ocitest.File("share/README", "read me\n", 0o640))
	rc, err := layer.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	tgz, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := ociSpec("web-0", ref)
	blobs := cacheArtifacts(t, &s, []render.Artifact{
		{URL: "https://example.org/motd", Path: "/etc/motd", Mode: 0o600},
		{URL: "https://example.org/tool.tar.gz", Path: "/opt/tool", Archive: render.ArchiveTarGz},
	}, [][]byte{[]byte(motd), tgz})

	wantPlaced := func() {
		t.Helper()
		wantRootFile(t, h, "web-0", "etc/motd", motd, 0o600)
		wantRootFile(t, h, "web-0", "opt/tool/bin/tool", "#!/bin/sh\necho tool\n", 0o755)
		wantRootFile(t, h, "web-0", "opt/tool/share/README", "read me\n", 0o640)
		// The rest of the image is there as it was.
		wantRootFile(t, h, "web-0", "usr/bin/env", "#!/bin/sh\n", 0o755)
		ents, err := os.ReadDir(filepath.Join(h.root, rootDS, "etc"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".keel-artifact-") {
				t.Errorf("a temporary file of the placement is left in etc: %s", e.Name())
			}
		}
	}
	// wantImageIntact checks the image's dataset (and its snapshot, the
	// clones' source): its file is the image's, not the artifact.
	wantImageIntact := func() {
		t.Helper()
		st := h.sim.State()
		snap := st.Snapshots[imageDS+"@keel"]
		if snap == nil {
			t.Fatal("the image has no @keel snapshot")
		}
		for _, dir := range []string{filepath.Join(h.root, imageDS), filepath.Join(h.root, snap.Dir)} {
			p := filepath.Join(dir, "etc", "motd")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != "welcome\n" || fi.Mode().Perm() != 0o644 {
				t.Errorf("%s = %q, mode %v; want the image's %q, 0644", p, b, fi.Mode().Perm(), "welcome\n")
			}
			if _, err := os.Stat(filepath.Join(dir, "opt")); err == nil {
				t.Errorf("the archive was extracted into %s", dir)
			}
		}
	}
	// jailCreates counts the jail -c among the commands one Start ran;
	// ran reports whether they include argv.
	jailCreates := func(cmds [][]string) int {
		return len(slices.DeleteFunc(slices.Clone(cmds), func(argv []string) bool {
			return len(argv) < 2 || argv[0] != "jail" || argv[1] != "-c"
		}))
	}
	ran := func(cmds [][]string, argv ...string) bool {
		return slices.ContainsFunc(cmds, func(c []string) bool { return slices.Equal(c, argv) })
	}

	h.rec.take()
	if _, err := d.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	cmds := h.rec.take()
	if !ran(cmds, "zfs", "clone", imageDS+"@keel", rootDS) || jailCreates(cmds) != 1 {
		t.Errorf("the first Start ran %q, want a zfs clone and one jail -c", cmds)
	}
	if o := h.sim.State().Datasets[rootDS].Origin; o != imageDS+"@keel" {
		t.Errorf("the root is a clone of %q, want %s@keel", o, imageDS)
	}
	wantPlaced()
	wantImageIntact()
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})

	// Stopped, the root edited (the placed file, the extracted one): the
	// next Start, on the root and the jail kept, places them again.
	if err := d.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"etc/motd": "edited\n", "opt/tool/bin/tool": "edited\n"} {
		if err := os.WriteFile(filepath.Join(h.root, rootDS, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(h.root, rootDS, "etc/motd"), 0o666); err != nil {
		t.Fatal(err)
	}
	h.rec.take()
	if _, err := d.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	if cmds := h.rec.take(); slices.ContainsFunc(cmds, func(c []string) bool { return len(c) > 1 && c[0] == "zfs" && c[1] == "clone" }) || jailCreates(cmds) != 0 {
		t.Errorf("the restart ran %q, want neither a clone nor a jail -c", cmds)
	}
	wantPlaced()
	wantImageIntact()
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
	if err := d.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}

	// tamper changes a cached file after its verification, keeping its
	// format's first bytes; the returned func puts it back.
	tamper := func(blob string) func() {
		t.Helper()
		orig, err := os.ReadFile(blob)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(blob, append(slices.Clone(orig), '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		return func() {
			t.Helper()
			if err := os.WriteFile(blob, orig, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantTampered := func(err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "does not match its sha256") {
			t.Fatalf("Start with a tampered cached file = %v", err)
		}
	}

	// On the root kept from the last start: the Start fails, and the
	// root (which it did not make) stays as it is, the file it could not
	// place untouched, and nothing runs.
	restore := tamper(blobs[0])
	if err := os.WriteFile(filepath.Join(h.root, rootDS, "etc/motd"), []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(h.root, rootDS, "etc/motd"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = d.Start(ctx, s)
	wantTampered(err)
	restore()
	if h.sim.State().Datasets[rootDS] == nil {
		t.Fatal("a failed Start removed a root it did not make")
	}
	wantRootFile(t, h, "web-0", "etc/motd", "edited\n", 0o644)
	if r, err := d.Running(ctx); err != nil || len(r) != 0 {
		t.Errorf("Running after the failed Start = %v, %v", r, err)
	}
	if err := d.Destroy(ctx, "web-0"); err != nil {
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{})

	// On no root: the Start clones one, fails to place the file (or the
	// archive, after the file was placed) and removes the clone; no jail
	// was made, and none is left.
	for i, blob := range blobs {
		restore := tamper(blob)
		h.rec.take()
		_, err := d.Start(ctx, s)
		wantTampered(err)
		restore()
		cmds := h.rec.take()
		if !ran(cmds, "zfs", "clone", imageDS+"@keel", rootDS) || !ran(cmds, "zfs", "destroy", rootDS) {
			t.Errorf("the failed Start (artifact %d tampered) ran %q, want the root cloned and destroyed", i, cmds)
		}
		if n := jailCreates(cmds); n != 0 {
			t.Errorf("the failed Start (artifact %d tampered) made a jail: %q", i, cmds)
		}
		st := h.sim.State()
		if st.Datasets[rootDS] != nil || st.Jail("keel-web-0") != nil {
			t.Errorf("the failed Start (artifact %d tampered) left the root (%v) or the jail (%v)", i, st.Datasets[rootDS] != nil, st.Jail("keel-web-0") != nil)
		}
		if _, err := os.Lstat(filepath.Join(h.root, rootDS)); err == nil {
			t.Errorf("the failed Start (artifact %d tampered) left the root's directory", i)
		}
		h.leaks(t, fbsdsim.Expect{})
		wantImageIntact()
		if r, err := d.Running(ctx); err != nil || len(r) != 0 {
			t.Errorf("Running after the failed Start = %v, %v", r, err)
		}
	}

	// The cache put back, the instance starts as the first time.
	if _, err := d.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	wantPlaced()
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
	if err := d.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx, "web-0"); err != nil {
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{})
}
