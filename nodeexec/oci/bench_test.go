package oci_test

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/render"
)

// benchImage pushes an image of 5 layers of 20 MB each (random bytes, so
// that gzip cannot shrink them: about 100 MB to download and to unpack),
// each layer a file and 200 small ones, to a registry on 127.0.0.1.
func benchImage(b *testing.B) (*ocitest.Registry, render.ImageRef) {
	b.Helper()
	reg := ocitest.NewRegistry(b)
	var layers []v1.Layer
	for i := range 5 {
		big := make([]byte, 20<<20)
		if _, err := rand.Read(big); err != nil {
			b.Fatal(err)
		}
		ents := []ocitest.Entry{ocitest.File(fmt.Sprintf("usr/lib/big%d", i), string(big), 0o644)}
		for j := range 200 {
			ents = append(ents, ocitest.File(fmt.Sprintf("usr/share/l%d/f%d", i, j), fmt.Sprintf("file %d of layer %d\n", j, i), 0o644))
		}
		layers = append(layers, ocitest.Layer(b, compression.GZip, ents...))
	}
	return reg, reg.Push(b, "bench/app", ocitest.Image(b, layers...))
}

// BenchmarkPull: the time to fetch (download and verify) and to unpack
// the 100 MB image, cold (empty cache) and warm (layers cached), and
// skopeo copy of the same image into a directory (download and verify,
// no unpacking) when skopeo is installed.
func BenchmarkPull(b *testing.B) {
	_, ref := benchImage(b)
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
