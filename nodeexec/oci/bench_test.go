package oci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
)

// BenchmarkPull: the time to fetch (download and verify) and to unpack
// the 100 MB image, cold (empty cache) and warm (layers cached), and
// skopeo copy of the same image into a directory (download and verify,
// no unpacking) when skopeo is installed.
func BenchmarkPull(b *testing.B) {
	ref := ocitest.NewRegistry(b).Push(b, "bench/app", ocitest.BigImage(b, 5, 20<<20))
	b.Run("fetch-cold", func(b *testing.B) {
		b.SetBytes(100 << 20)
		for b.Loop() {
			b.StopTimer()
			dir := b.TempDir()
			b.StartTimer()
			if _, err := (&oci.Puller{Dir: dir}).Fetch(b.Context(), ref, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	p := &oci.Puller{Dir: b.TempDir()}
	img, err := p.Fetch(b.Context(), ref, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("fetch-warm", func(b *testing.B) {
		for b.Loop() {
			if _, err := p.Fetch(b.Context(), ref, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unpack", func(b *testing.B) {
		b.SetBytes(100 << 20)
		for b.Loop() {
			b.StopTimer()
			dir := b.TempDir()
			b.StartTimer()
			if _, err := oci.Unpack(b.Context(), img, dir, 0); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dir)
			b.StartTimer()
		}
	})
	b.Run("skopeo-copy", func(b *testing.B) {
		skopeo, err := exec.LookPath("skopeo")
		if err != nil {
			b.Skip("skopeo is not installed")
		}
		b.SetBytes(100 << 20)
		for b.Loop() {
			b.StopTimer()
			dir := filepath.Join(b.TempDir(), "img")
			b.StartTimer()
			out, err := exec.Command(skopeo, "copy", "--quiet", "--src-tls-verify=false",
				"docker://"+ref.Name(), "dir:"+dir).CombinedOutput()
			if err != nil {
				b.Fatalf("skopeo copy: %v\n%s", err, out)
			}
		}
	})
}
