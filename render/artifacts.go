package render

// Artifacts: files fetched for an instance, checked against their sha256
// and placed in its root (docs/spec.md, "Artifacts"). Render checks what
// the spec says; fetching and placing them is the agent's.

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
)

// Bounds of spec.artifacts.
const (
	// MaxArtifacts is the most artifacts one spec may have.
	MaxArtifacts    = 64
	maxArtifactURL  = 2048
	maxArtifactPath = 1024
)

var archiveFormats = []string{ArchiveTar, ArchiveTarGz, ArchiveTarZstd}

// archiveAliases are other names of the archive formats, for a hint (keys
// in lower case). Nothing is suggested by spelling alone: tar.xz is one
// edit from tar.gz, and another format.
var archiveAliases = map[string]string{
	"tar": ArchiveTar, "tar.gz": ArchiveTarGz, "tar.zst": ArchiveTarZstd,
	"tgz": ArchiveTarGz, "tar.gzip": ArchiveTarGz, "gz": ArchiveTarGz, "gzip": ArchiveTarGz,
	"tzst": ArchiveTarZstd, "tar.zstd": ArchiveTarZstd, "zst": ArchiveTarZstd, "zstd": ArchiveTarZstd,
}

// resolveArtifacts validates a spec's artifacts (field is "spec" or
// "spec.template") against each other and against the spec's volumes as
// written, and returns them with defaults applied, sorted by path: their
// order in the spec means nothing, since none may be under another.
func (r *renderer) resolveArtifacts(in []artifactInput, volumes []volumeInput, field string, at func(string) Position) []Artifact {
	if len(in) == 0 {
		return nil
	}
	if len(in) > MaxArtifacts {
		p := field + ".artifacts"
		r.diag.errorf(at(p), p, "%d artifacts are more than the %d a spec may have: pack files that go together into one archive", len(in), MaxArtifacts)
		return nil
	}
	out := make([]Artifact, 0, len(in))
	placed := make([]string, len(in)) // artifacts[i].path when valid
	for i, a := range in {
		af := fmt.Sprintf("%s.artifacts[%d]", field, i)
		errorf := func(sub, format string, args ...any) {
			p := af + "." + sub
			r.diag.errorf(at(p), p, format, args...)
		}
		if msg := checkArtifactURL(a.URL); msg != "" {
			errorf("url", "%s", msg)
		}
		sum := strings.ToLower(a.SHA256)
		if msg := checkSHA256(a.SHA256); msg != "" {
			errorf("sha256", "%s", msg)
		}
		if msg := checkArtifactPath(a.Path); msg != "" {
			errorf("path", "%s", msg)
		} else if msg := artifactOverlap(a.Path, in[:i], placed[:i], volumes); msg != "" {
			errorf("path", "%s", msg)
		} else {
			placed[i] = a.Path
		}
		mode := DefaultArtifactMode
		switch {
		case a.Archive != "" && !slices.Contains(archiveFormats, a.Archive):
			msg := fmt.Sprintf("%q is not an archive format (want tar, tar.gz or tar.zst, or leave archive out to place the file as it is)", a.Archive)
			if sug := archiveAliases[strings.ToLower(a.Archive)]; sug != "" {
				msg = fmt.Sprintf("%q is not an archive format (did you mean %q? want tar, tar.gz or tar.zst)", a.Archive, sug)
			}
			errorf("archive", "%s", msg)
		case a.Archive != "" && a.Mode != nil:
			errorf("mode", "not allowed with archive: the archive's entries keep their own modes (leave mode out)")
		case a.Archive == "" && a.Mode != nil && *a.Mode == 0:
			errorf("mode", "%s is not allowed: leave the field out to use the default (%s)", *a.Mode, DefaultArtifactMode)
		case a.Mode != nil:
			mode = *a.Mode
		}
		if a.Archive != "" {
			mode = 0
		}
		out = append(out, Artifact{URL: a.URL, SHA256: sum, Path: a.Path, Mode: mode, Archive: a.Archive})
	}
	slices.SortFunc(out, func(a, b Artifact) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// artifactOverlap returns why p, a valid artifact path, may not be used
// next to the artifacts before it (placed holds their paths, "" for those
// in error) and the spec's volumes: an artifact written into a volume, or
// hidden by one, or placed inside another artifact, is refused.
func artifactOverlap(p string, before []artifactInput, placed []string, volumes []volumeInput) string {
	for j, v := range volumes {
		if checkMountPath(v.MountPath) != "" {
			continue // reported at the volume
		}
		mp := cleanPath(v.MountPath)
		vf := fmt.Sprintf("volumes[%d].mountPath %s", j, mp)
		switch {
		case p == mp:
			return fmt.Sprintf("%q is %s: the volume would hide the artifact (place it outside every volume)", p, vf)
		case pathUnder(p, mp):
			return fmt.Sprintf("%q is under %s: the artifact would be written into the volume (place it outside every volume)", p, vf)
		case pathUnder(mp, p):
			return fmt.Sprintf("%s is under %q: the volume would hide part of the artifact (place it outside every volume)", vf, p)
		}
	}
	for j, q := range placed {
		af := fmt.Sprintf("artifacts[%d].path", j)
		switch {
		case q == "":
		case p == q:
			return fmt.Sprintf("%q is also %s", p, af)
		case pathUnder(p, q):
			return fmt.Sprintf("%q is under %s %s: an artifact may not be placed inside another (put the file in the archive, or place it elsewhere)", p, af, before[j].Path)
		case pathUnder(q, p):
			return fmt.Sprintf("%s %s is under %q: an artifact may not be placed inside another (put the file in the archive, or place it elsewhere)", af, before[j].Path, p)
		}
	}
	return ""
}

// pathUnder reports whether path p is strictly inside directory dir (both
// absolute and clean).
func pathUnder(p, dir string) bool {
	return strings.HasPrefix(p, dir) && len(p) > len(dir) && (dir == "/" || p[len(dir)] == '/')
}

const credentialsMsg = "the URL carries credentials (user@ or user:password@): credentials never belong in the repository, they live on the node (registry credentials in the agent's --registry-config, for an oci:// artifact)"

const artifactURLWant = "https://<host>/<path>, or oci://<registry>/<repository>@sha256:<64 hex digits>"

// checkArtifactURL validates where an artifact comes from: an https URL
// without credentials or fragment, or an OCI artifact pinned by digest.
// Its messages never quote the URL whole: it may hold credentials, or a
// pre-signed query string.
func checkArtifactURL(raw string) string {
	switch {
	case raw == "":
		return "required: where the file comes from, " + artifactURLWant
	case len(raw) > maxArtifactURL:
		return fmt.Sprintf("a URL of %d bytes is longer than the %d allowed", len(raw), maxArtifactURL)
	case strings.HasPrefix(raw, OCIPrefix):
		if registry, _, _ := strings.Cut(strings.TrimPrefix(raw, OCIPrefix), "/"); strings.Contains(registry, "@") {
			return credentialsMsg
		}
		_, msg := parseImage(raw)
		return msg
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Sprintf("not a valid URL (%v): want %s", err, artifactURLWant)
	}
	switch {
	case u.Scheme == "":
		return "not an absolute URL: want " + artifactURLWant
	case u.Scheme == "http":
		return "plain http:// is not allowed (anyone on the way could read the file, or swap it and fail every fetch): use https://, or oci://<registry>/<repository>@sha256:<64 hex digits>"
	case u.Scheme != "https":
		return fmt.Sprintf("the scheme %q is not supported: want %s", u.Scheme, artifactURLWant)
	case u.User != nil:
		return credentialsMsg
	case u.Host == "" || u.Hostname() == "":
		return "the URL has no host: want " + artifactURLWant
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return "the URL has a fragment (#...), which is never sent to the server: remove it"
	}
	return ""
}

// checkSHA256 validates an artifact's sha256: 64 hex digits, in either
// case (render stores them in lower case).
func checkSHA256(sum string) string {
	const how = "sha256sum or shasum -a 256 prints it"
	switch {
	case sum == "":
		return "required: the hex SHA-256 of the file (of the archive, for one extracted); " + how
	case strings.HasPrefix(strings.ToLower(sum), "sha256:"):
		return fmt.Sprintf("%q: write the 64 hex digits without the sha256: prefix", cutValue(sum))
	}
	if _, err := hex.DecodeString(sum); err != nil || len(sum) != 64 {
		return fmt.Sprintf("%q is not a SHA-256: want 64 hex digits (%s)", cutValue(sum), how)
	}
	return ""
}

// checkArtifactPath validates where an artifact goes in the jail's root:
// absolute, written clean (never cleaned behind the user's back), not the
// root.
func checkArtifactPath(p string) string {
	switch {
	case p == "":
		return "required: where the file goes in the jail's root, an absolute path such as /usr/local/bin/app"
	case len(p) > maxArtifactPath:
		return fmt.Sprintf("a path of %d bytes is longer than the %d allowed", len(p), maxArtifactPath)
	case strings.ContainsRune(p, 0):
		return "contains a NUL byte"
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("%q is not an absolute path", p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Sprintf("%q contains \"..\"", p)
	case path.Clean(p) == "/":
		return "cannot place an artifact on the jail's root: name a file, or the directory an archive is extracted into"
	case path.Clean(p) != p:
		return fmt.Sprintf("%q is not a clean path (no //, no . component, no trailing /): write %q", p, path.Clean(p))
	}
	return ""
}
