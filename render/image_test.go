package render_test

import (
	"strings"
	"testing"

	"github.com/keel-dev/keel/render"
)

func TestParseImage(t *testing.T) {
	hex := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		image string
		want  render.ImageRef
		err   string
	}{
		{image: "base/14.2-web", want: render.ImageRef{Base: "base/14.2-web"}},
		{image: "oci://registry.example.org/team/web@sha256:" + hex,
			want: render.ImageRef{Registry: "registry.example.org", Repository: "team/web", Digest: "sha256:" + hex}},
		{image: "oci://127.0.0.1:5000/web@sha256:" + hex,
			want: render.ImageRef{Registry: "127.0.0.1:5000", Repository: "web", Digest: "sha256:" + hex}},
		{image: "oci://localhost/web@sha256:" + hex,
			want: render.ImageRef{Registry: "localhost", Repository: "web", Digest: "sha256:" + hex}},
		{image: "oci://registry.example.org/team/web:v2", err: "is pinned by tag (v2), which can move: pin it by digest"},
		{image: "oci://registry.example.org/team/web", err: "has no digest: pin it by digest"},
		{image: "oci://registry.example.org/team/web:v2@sha256:" + hex, err: "names both a tag and a digest: keep only the digest (@sha256:" + hex + ")"},
		{image: "oci://registry.example.org/web@sha256:" + hex[:60], err: "is not a valid OCI reference"},
		{image: "oci://registry.example.org/web@sha512:" + hex + hex, err: "unsupported digest algorithm"},
		{image: "oci://registry.example.org/Team/web@sha256:" + hex, err: "is not a valid OCI reference"},
		{image: "oci://web@sha256:" + hex, err: "names no registry"},
		{image: "oci://team/web@sha256:" + hex, err: "oci://docker.io/library/team/web@sha256:…"},
		{image: "oci://registry.example.org/../web@sha256:" + hex, err: "is not a valid OCI reference"},
		{image: "oci://registry.example.org/" + strings.Repeat("a/", 300) + "web@sha256:" + hex, err: "longer than the 512 allowed"},
		{image: "oci://", err: "is not a valid OCI reference"},
		{image: "docker://registry.example.org/web@sha256:" + hex, err: "is not a valid image (want base/<name>, e.g. base/14.2-web); or an OCI image pinned by digest"},
	} {
		got, err := render.ParseImage(tc.image)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseImage(%q) = %v, want an error containing %q", tc.image, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("ParseImage(%q): %v", tc.image, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("ParseImage(%q) = %+v, want %+v", tc.image, got, tc.want)
		}
		if tc.err == "" && got.IsOCI() && (got.Hex() != hex || got.Name() != strings.TrimPrefix(tc.image, render.OCIPrefix)) {
			t.Errorf("ParseImage(%q): Hex %q, Name %q", tc.image, got.Hex(), got.Name())
		}
	}
}
