package render

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// OCIPrefix starts an image that is an OCI reference pinned by digest
// (oci://registry.example.org/team/web@sha256:…) rather than a node-local
// base (base/<name>).
const OCIPrefix = "oci://"

// maxImageRef bounds an OCI reference (the distribution spec allows 255
// characters for a repository name, plus the registry and the digest).
const maxImageRef = 512

// ImageRef is a spec.image parsed: a node-local base or an OCI image.
type ImageRef struct {
	// Base is the node-local base (base/<name>), empty for an OCI image.
	Base string
	// Registry (host[:port]), Repository (its path) and Digest
	// ("sha256:<64 hex>") name an OCI image, pinned by its manifest's
	// (or index's) digest.
	Registry, Repository, Digest string
}

// IsOCI reports whether the image comes from an OCI registry.
func (r ImageRef) IsOCI() bool { return r.Digest != "" }

// Name is the image to pull, registry/repository@digest, without oci://.
func (r ImageRef) Name() string { return r.Registry + "/" + r.Repository + "@" + r.Digest }

// Hex is the digest's 64 hex digits, safe in a path or a dataset name.
func (r ImageRef) Hex() string { _, h, _ := strings.Cut(r.Digest, ":"); return h }

// ParseImage parses and validates a spec.image, for drivers and pullers
// that receive it from a model (render has checked it already) or from
// elsewhere.
func ParseImage(image string) (ImageRef, error) {
	ref, msg := parseImage(image)
	if msg != "" {
		return ImageRef{}, fmt.Errorf("%s", msg)
	}
	return ref, nil
}

func parseImage(image string) (ImageRef, string) {
	rest, ok := strings.CutPrefix(image, OCIPrefix)
	if !ok {
		if msg := checkImage(image); msg != "" {
			return ImageRef{}, msg + "; or an OCI image pinned by digest (oci://registry.example.org/team/web@sha256:…)"
		}
		return ImageRef{Base: image}, ""
	}
	const pin = "pin it by digest: oci://<registry>/<repository>@sha256:<64 hex digits> (`crane digest <registry>/<repository>:<tag>` or `skopeo inspect` prints it)"
	if len(image) > maxImageRef {
		return ImageRef{}, fmt.Sprintf("an OCI reference of %d characters is longer than the %d allowed", len(image), maxImageRef)
	}
	parsed, err := reference.Parse(rest)
	if err != nil {
		return ImageRef{}, fmt.Sprintf("%q is not a valid OCI reference (%v): %s", image, err, pin)
	}
	named, ok := parsed.(reference.Named)
	if !ok {
		return ImageRef{}, fmt.Sprintf("%q names no repository: %s", image, pin)
	}
	domain, path := reference.Domain(named), reference.Path(named)
	if domain == "" || !strings.ContainsAny(domain, ".:") && domain != "localhost" {
		// reference.Parse takes team/web's "team" for a registry; Docker
		// would take docker.io. Keel takes neither: a registry is a host
		// name with a dot or a port, or localhost.
		path = named.Name()
		return ImageRef{}, fmt.Sprintf("%q names no registry: write it out, as in oci://docker.io/library/%s@sha256:… (Keel never picks a default registry)", image, path)
	}
	digested, hasDigest := parsed.(reference.Digested)
	tagged, hasTag := parsed.(reference.Tagged)
	switch {
	case !hasDigest && hasTag:
		return ImageRef{}, fmt.Sprintf("%q is pinned by tag (%s), which can move: %s", image, tagged.Tag(), pin)
	case !hasDigest:
		return ImageRef{}, fmt.Sprintf("%q has no digest: %s", image, pin)
	case hasTag:
		return ImageRef{}, fmt.Sprintf("%q names both a tag and a digest: keep only the digest (@%s); the tag is never used", image, digested.Digest())
	case digested.Digest().Algorithm() != digest.SHA256:
		return ImageRef{}, fmt.Sprintf("%q: digest algorithm %s is not supported (want sha256)", image, digested.Digest().Algorithm())
	}
	return ImageRef{Registry: domain, Repository: path, Digest: digested.Digest().String()}, ""
}
