package process

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/render"
)

func TestInstancesStartFromAnOCIImage(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "team/web", ocitest.Image(t,
		ocitest.Layer(t, compression.GZip, ocitest.Dir("bin", 0o755),
			ocitest.File("bin/hello", "#!/bin/sh\necho \"hello from $1\" > greeting\n", 0o755),
			ocitest.File("etc/big", strings.Repeat("x", 1<<20), 0o644)),
		ocitest.Layer(t, compression.GZip, ocitest.File("etc/motd", "welcome\n", 0o644))))
	d := newDriver(t, Options{})
	ctx := t.Context()

	s := spec("web-0", "bin/hello", "${KEEL_INSTANCE}")
	s.Spec.Image = ocitest.Spec(ref)
	if _, err := d.Start(ctx, s); err == nil || !strings.Contains(err.Error(), "is not pulled on this node") {
		t.Fatalf("Start before the image is added = %v", err)
	}
	if has, err := d.HasImage(ctx, ref.Digest); has || err != nil {
		t.Fatalf("HasImage before AddImage = %v, %v", has, err)
	}
	img, err := (&oci.Puller{Dir: t.TempDir()}).Fetch(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	// An unpacking cut short (a crash) leaves a directory without its
	// metadata: never taken for the image, replaced by the next add.
	dir, _ := d.ociImageDir(ref.Digest)
	os.MkdirAll(filepath.Join(dir, "root", "half"), 0o755)
	if has, _ := d.HasImage(ctx, ref.Digest); has {
		t.Fatal("HasImage took a half-unpacked image")
	}
	if err := d.AddImage(ctx, img, 0); err != nil {
		t.Fatal(err)
	}
	if has, err := d.HasImage(ctx, ref.Digest); !has || err != nil {
		t.Fatalf("HasImage after AddImage = %v, %v", has, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "root", "half")); err == nil {
		t.Error("the half-unpacked directory survived AddImage")
	}
	list, err := d.Images(ctx)
	if err != nil || len(list) != 1 || list[0].Digest != ref.Digest || list[0].Unpacked < 1<<20 || list[0].Size != img.Size {
		t.Fatalf("Images = %+v, %v", list, err)
	}

	// Ten instances of the image share its files (hard links).
	for i := range 10 {
		si := s
		si.Name = "web-" + string(rune('0'+i))
		if e := runToExit(t, d, si); e.Code != 0 {
			t.Fatalf("%s exit %+v", si.Name, e)
		}
		if got := readRootFile(t, d, si.Name, "greeting"); got != "hello from "+si.Name+"\n" {
			t.Errorf("%s greeting = %q", si.Name, got)
		}
	}
	cached, _ := os.Stat(filepath.Join(dir, "root", "etc", "big"))
	root, _ := d.RootDir("web-7")
	linked, _ := os.Stat(filepath.Join(root, "etc", "big"))
	if cached == nil || linked == nil || !os.SameFile(cached, linked) {
		t.Fatal("an instance's root copies the image's files rather than linking them")
	}
	if n := linked.Sys().(*syscall.Stat_t).Nlink; n != 11 {
		t.Errorf("etc/big has %d links, want 11 (the image's and ten roots')", n)
	}

	// Removing the image leaves the roots made from it whole.
	if err := d.RemoveImage(ctx, ref.Digest); err != nil {
		t.Fatal(err)
	}
	if has, _ := d.HasImage(ctx, ref.Digest); has {
		t.Error("HasImage after RemoveImage")
	}
	if got := readRootFile(t, d, "web-7", "etc/motd"); got != "welcome\n" {
		t.Errorf("etc/motd after RemoveImage = %q", got)
	}
	if _, err := d.HasImage(ctx, "sha256:../../etc"); err == nil {
		t.Error("HasImage took a digest that climbs")
	}
}

// BenchmarkStartFromImage: the 100 MB image of 5 layers (as
// nodeexec/oci's BenchmarkPull) made into an instance's root: cold (the
// image pulled and unpacked first, then the root made) and warm (the
// image on the node: only the root, hard links); and the disk that ten
// instances of it take, reported as disk-MB (du of the image and the ten
// roots, hard links counted once).
func BenchmarkStartFromImage(b *testing.B) {
	ref := ocitest.NewRegistry(b).Push(b, "bench/app", ocitest.BigImage(b, 5, 20<<20))
	s := spec("web-0", "true")
	s.Spec.Image = ocitest.Spec(ref)
	root := func(d *Driver, name string) {
		if _, err := d.ensureRoot(name, s.Spec.Image); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			d := newDriver(b, Options{})
			p := &oci.Puller{Dir: b.TempDir()}
			b.StartTimer()
			img, err := p.Fetch(b.Context(), ref, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := d.AddImage(b.Context(), img, 0); err != nil {
				b.Fatal(err)
			}
			root(d, "web-0")
		}
	})
	d := newDriver(b, Options{})
	img, err := (&oci.Puller{Dir: b.TempDir()}).Fetch(b.Context(), ref, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.AddImage(b.Context(), img, 0); err != nil {
		b.Fatal(err)
	}
	b.Run("warm", func(b *testing.B) {
		n := 0
		for b.Loop() {
			n++
			root(d, fmt.Sprintf("web-%d", n))
		}
	})
	b.Run("ten-instances", func(b *testing.B) {
		d := newDriver(b, Options{})
		if err := d.AddImage(b.Context(), img, 0); err != nil {
			b.Fatal(err)
		}
		iter := 0
		for b.Loop() {
			for i := range 10 {
				root(d, fmt.Sprintf("ten-%d-%d", iter, i))
			}
			iter++
		}
		// du counts a file linked from several of its arguments once.
		args := []string{"-skc", filepath.Join(d.root, "images")}
		for i := range 10 {
			args = append(args, d.instanceDir(fmt.Sprintf("ten-0-%d", i)))
		}
		out, err := exec.Command("du", args...).Output()
		if err != nil {
			b.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		kb, _ := strconv.Atoi(strings.Fields(lines[len(lines)-1])[0])
		b.ReportMetric(float64(kb)/1024, "disk-MB")
	})
}

func TestLeftoversOfACrashAreSwept(t *testing.T) {
	state := t.TempDir()
	oci := filepath.Join(state, "images", "oci")
	half := filepath.Join(oci, strings.Repeat("ab", 32), "root", "usr")
	tmp := filepath.Join(oci, ".unpack-123", "root", "usr")
	for _, d := range []string{half, tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	newDriver(t, Options{StateDir: state})
	if entries, _ := os.ReadDir(oci); len(entries) != 0 {
		t.Errorf("left after the driver started: %v", entries)
	}
}

func TestArtifactsArePlacedInTheRootAtEachStart(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	ref := reg.Push(t, "team/web", ocitest.Image(t,
		ocitest.Layer(t, compression.GZip, ocitest.Dir("etc", 0o755), ocitest.File("etc/app.conf", "from the image\n", 0o644))))
	d := newDriver(t, Options{})
	ctx := t.Context()
	puller := &oci.Puller{Dir: t.TempDir()}
	img, err := puller.Fetch(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.AddImage(ctx, img, 0); err != nil {
		t.Fatal(err)
	}
	// Two artifacts in the cache: a file and a tar.gz.
	conf := "from the artifact\n"
	archive := ocitest.Layer(t, compression.GZip, ocitest.Dir("bin", 0o755), ocitest.File("bin/tool", "#!/bin/sh\n", 0o755))
	blobs := filepath.Join(puller.Dir, "blobs", "sha256")
	os.MkdirAll(blobs, 0o700)
	put := func(b []byte) string {
		sum := sha256.Sum256(b)
		h := hex.EncodeToString(sum[:])
		if err := os.WriteFile(filepath.Join(blobs, h), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return h
	}
	rc, err := archive.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	tgz, _ := io.ReadAll(rc)
	rc.Close()
	confSum, tgzSum := put([]byte(conf)), put(tgz)
	s := spec("web-0", "/bin/sh", "-c", "cat etc/app.conf; ls -l etc/app.conf opt/tool/bin/tool | cut -c1-10")
	s.Spec.Image = ocitest.Spec(ref)
	for _, a := range []render.Artifact{
		{URL: "https://example.org/app.conf", SHA256: confSum, Path: "/etc/app.conf", Mode: 0o600},
		{URL: "https://example.org/tool.tar.gz", SHA256: tgzSum, Path: "/opt/tool", Archive: render.ArchiveTarGz},
	} {
		blob, _ := puller.ArtifactPath(a.SHA256)
		s.Spec.Artifacts = append(s.Spec.Artifacts, a)
		s.Artifacts = append(s.Artifacts, oci.CachedArtifact{Artifact: a, Blob: blob})
	}
	if e := runToExit(t, d, s); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	out, _ := d.Logs("web-0", 4096)
	if want := conf + "-rw-------\n-rwxr-xr-x\n"; !strings.Contains(string(out), want) {
		t.Fatalf("the instance saw:\n%s\nwant %q", out, want)
	}
	// The image's own file is untouched: the artifact replaced the
	// root's hard link, it did not write through it.
	dir, _ := d.ociImageDir(ref.Digest)
	if b, _ := os.ReadFile(filepath.Join(dir, "root", "etc", "app.conf")); string(b) != "from the image\n" {
		t.Fatalf("the image's file was changed: %q", b)
	}
	// Changed in the root, the file is placed again at the next start.
	root, _ := d.RootDir("web-0")
	os.WriteFile(filepath.Join(root, "etc", "app.conf"), []byte("edited\n"), 0o644)
	if e := runToExit(t, d, s); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc", "app.conf")); string(b) != conf {
		t.Fatalf("after a restart: %q", b)
	}
	// A cached file changed since it was verified: the start fails.
	os.WriteFile(s.Artifacts[0].Blob, []byte("tampered\n"), 0o600)
	if _, err := d.Start(ctx, s); err == nil || !strings.Contains(err.Error(), "does not match its sha256") {
		t.Fatalf("Start with a tampered cache = %v", err)
	}
}
