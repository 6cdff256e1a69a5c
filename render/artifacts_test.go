package render_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/keel-dev/keel/render"
)

// spec.artifacts, in the corpus's style: each invalid case is the corpus
// base with one file added, and lists every error with its exact position
// and field path.

const (
	artSumA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	artSumB = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	artURL  = "https://downloads.example.org/tools/app-1.2.3"
	artOCI  = "oci://registry.example.org/team/tools@sha256:" + artSumB
)

// artifactsJail is a Jail tools whose spec has the artifacts lines after
// "  artifacts:" on line 7: the first item starts on line 8, its keys at
// column 7 ("    - url: ..."), and spec lines after them.
func artifactsJail(items string) map[string]string {
	return map[string]string{"jails/tools.yaml": checksJail("  artifacts:\n" + items)}
}

// artifactItem is one artifact in block style, three lines (url on the
// item's first line, value at column 12; sha256 value at column 15; path
// value at column 13), then the extra lines, indented 6.
func artifactItem(url, sum, path string, extra ...string) string {
	s := "    - url: " + url + "\n      sha256: " + sum + "\n      path: " + path + "\n"
	for _, e := range extra {
		s += "      " + e + "\n"
	}
	return s
}

var artifactsInvalid = []corpusInvalidCase{
	// url
	{
		name:  "artifact without a url",
		files: artifactsJail("    - sha256: " + artSumA + "\n      path: /usr/local/bin/app\n"),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 7, "spec.artifacts[0].url", "required: where the file comes from, https://<host>/<path>, or oci://<registry>/<repository>@sha256:<64 hex digits>"}},
	},
	{
		name:  "artifact url written empty",
		files: artifactsJail(artifactItem(`""`, artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "required: where the file comes from"}},
	},
	{
		name:  "artifact over plain http",
		files: artifactsJail(artifactItem("http://downloads.example.org/app", artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "plain http:// is not allowed (anyone on the way could read the file, or swap it and fail every fetch): use https://, or oci://<registry>/<repository>@sha256:<64 hex digits>"}},
	},
	{
		name:  "artifact over ftp",
		files: artifactsJail(artifactItem("ftp://downloads.example.org/app", artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", `the scheme "ftp" is not supported: want https://<host>/<path>, or oci://<registry>/<repository>@sha256:<64 hex digits>`}},
	},
	{
		name:  "artifact url that is not absolute",
		files: artifactsJail(artifactItem("downloads.example.org/app", artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "not an absolute URL: want https://<host>/<path>"}},
	},
	{
		name:  "artifact url that does not parse",
		files: artifactsJail(artifactItem(`"https://downloads.example.org:port/app"`, artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", `not a valid URL (invalid port ":port" after host): want https://<host>/<path>`}},
	},
	{
		name:  "artifact url with credentials",
		files: artifactsJail(artifactItem("https://ci:s3cr3t@downloads.example.org/app", artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "the URL carries credentials (user@ or user:password@): credentials never belong in the repository, they live on the node (registry credentials in the agent's --registry-config, for an oci:// artifact)"}},
	},
	{
		name:  "artifact url without a host",
		files: artifactsJail(artifactItem("https:///app", artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "the URL has no host: want https://<host>/<path>"}},
	},
	{
		name:  "artifact url with a fragment",
		files: artifactsJail(artifactItem(`"https://downloads.example.org/app#v2"`, artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "the URL has a fragment (#...), which is never sent to the server: remove it"}},
	},
	{
		name:  "artifact url too long",
		files: artifactsJail(artifactItem("https://downloads.example.org/"+strings.Repeat("a", 2019), artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "a URL of 2049 bytes is longer than the 2048 allowed"}},
	},
	{
		name:  "oci artifact pinned by tag",
		files: artifactsJail(artifactItem("oci://registry.example.org/team/tools:v1", artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", `"oci://registry.example.org/team/tools:v1" is pinned by tag (v1), which can move: pin it by digest: oci://<registry>/<repository>@sha256:<64 hex digits>`}},
	},
	{
		name:  "oci artifact without a registry",
		files: artifactsJail(artifactItem("oci://team/tools@sha256:"+artSumB, artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "names no registry: write it out, as in oci://docker.io/library/team/tools@sha256:… (Keel never picks a default registry)"}},
	},

	{
		name:  "oci artifact with credentials",
		files: artifactsJail(artifactItem("oci://ci:pw@registry.example.org/team/tools@sha256:"+artSumB, artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "the URL carries credentials (user@ or user:password@): credentials never belong in the repository"}},
	},

	// sha256
	{
		name:  "artifact without a sha256",
		files: artifactsJail("    - url: " + artURL + "\n      path: /usr/local/bin/app\n"),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 7, "spec.artifacts[0].sha256", "required: the hex SHA-256 of the file (of the archive, for one extracted); sha256sum or shasum -a 256 prints it"}},
	},
	{
		name:  "artifact sha256 too short",
		files: artifactsJail(artifactItem(artURL, artSumA[:63], "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 9, 15, "spec.artifacts[0].sha256", `"` + artSumA[:60] + `…" is not a SHA-256: want 64 hex digits (sha256sum or shasum -a 256 prints it)`}},
	},
	{
		name:  "artifact sha256 not hex",
		files: artifactsJail(artifactItem(artURL, strings.Repeat("g", 64), "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 9, 15, "spec.artifacts[0].sha256", "is not a SHA-256: want 64 hex digits"}},
	},
	{
		name:  "artifact sha256 with its algorithm",
		files: artifactsJail(artifactItem(artURL, "sha256:"+artSumA, "/usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 9, 15, "spec.artifacts[0].sha256", ": write the 64 hex digits without the sha256: prefix"}},
	},

	// path
	{
		name:  "artifact without a path",
		files: artifactsJail("    - url: " + artURL + "\n      sha256: " + artSumA + "\n"),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 7, "spec.artifacts[0].path", "required: where the file goes in the jail's root, an absolute path such as /usr/local/bin/app"}},
	},
	{
		name:  "relative artifact path",
		files: artifactsJail(artifactItem(artURL, artSumA, "usr/local/bin/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", `"usr/local/bin/app" is not an absolute path`}},
	},
	{
		name:  "artifact path climbing with ..",
		files: artifactsJail(artifactItem(artURL, artSumA, "/usr/local/../../etc/app")),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", `"/usr/local/../../etc/app" contains ".."`}},
	},
	{
		name:  "artifact path on the jail's root",
		files: artifactsJail(artifactItem(artURL, artSumA, "/")),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", "cannot place an artifact on the jail's root: name a file, or the directory an archive is extracted into"}},
	},
	{
		name:  "artifact path // on the jail's root",
		files: artifactsJail(artifactItem(artURL, artSumA, "//")),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", "cannot place an artifact on the jail's root"}},
	},
	{
		name:  "artifact path with a trailing slash",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app/")),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", `"/opt/app/" is not a clean path (no //, no . component, no trailing /): write "/opt/app"`}},
	},
	{
		name:  "artifact path with // and .",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt//./app")),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", `"/opt//./app" is not a clean path (no //, no . component, no trailing /): write "/opt/app"`}},
	},
	{
		name:  "artifact path with a NUL byte",
		files: artifactsJail(artifactItem(artURL, artSumA, `"/opt/a\0b"`)),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", "contains a NUL byte"}},
	},
	{
		name:  "artifact path too long",
		files: artifactsJail(artifactItem(artURL, artSumA, "/"+strings.Repeat("a", 1024))),
		want:  []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", "a path of 1025 bytes is longer than the 1024 allowed"}},
	},
	{
		name: "artifact paths against volumes: on, under and above a mount path",
		files: artifactsJail(artifactItem(artURL, artSumA, "/var/db") +
			artifactItem(artURL, artSumA, "/var/db/app.conf") +
			artifactItem(artURL, artSumA, "/srv", "archive: tar.gz") +
			artifactItem(artURL, artSumA, "/var/dbx") +
			"  volumes:\n    - {name: data, mountPath: /var/db/}\n    - {name: www, mountPath: /srv/www}\n"),
		want: []corpusDiag{
			{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", `"/var/db" is volumes[0].mountPath /var/db: the volume would hide the artifact (place it outside every volume)`},
			{"jails/tools.yaml", 13, 13, "spec.artifacts[1].path", `"/var/db/app.conf" is under volumes[0].mountPath /var/db: the artifact would be written into the volume (place it outside every volume)`},
			{"jails/tools.yaml", 16, 13, "spec.artifacts[2].path", `volumes[1].mountPath /srv/www is under "/srv": the volume would hide part of the artifact (place it outside every volume)`},
		},
	},
	{
		name: "artifact paths against each other",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "archive: tar") +
			artifactItem(artURL, artSumB, "/opt/app") +
			artifactItem(artURL, artSumB, "/opt/app/etc/app.conf") +
			artifactItem(artURL, artSumB, "/opt", "archive: tar.zst") +
			artifactItem(artURL, artSumB, "/opt/application")),
		want: []corpusDiag{
			{"jails/tools.yaml", 14, 13, "spec.artifacts[1].path", `"/opt/app" is also artifacts[0].path`},
			{"jails/tools.yaml", 17, 13, "spec.artifacts[2].path", `"/opt/app/etc/app.conf" is under artifacts[0].path /opt/app: an artifact may not be placed inside another (put the file in the archive, or place it elsewhere)`},
			{"jails/tools.yaml", 20, 13, "spec.artifacts[3].path", `artifacts[0].path /opt/app is under "/opt": an artifact may not be placed inside another (put the file in the archive, or place it elsewhere)`},
		},
	},

	// mode and archive
	{
		name:  "artifact mode with an archive",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "archive: tar.gz", "mode: 0755")),
		want:  []corpusDiag{{"jails/tools.yaml", 12, 13, "spec.artifacts[0].mode", "not allowed with archive: the archive's entries keep their own modes (leave mode out)"}},
	},
	{
		name:  "artifact mode 0",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "mode: 0")),
		want:  []corpusDiag{{"jails/tools.yaml", 11, 13, "spec.artifacts[0].mode", "0000 is not allowed: leave the field out to use the default (0644)"}},
	},
	{
		name:  "artifact mode without its leading 0",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "mode: 755")),
		want:  []corpusDiag{{"jails/tools.yaml", 11, 13, "spec.artifacts[0].mode", `"755" has no leading 0: write the mode in octal, as in 0755 (without the 0, YAML reads it as a decimal number)`}},
	},
	{
		name:  "artifact mode setuid",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "mode: 04755")),
		want:  []corpusDiag{{"jails/tools.yaml", 11, 13, "spec.artifacts[0].mode", `"04755" sets the setuid, setgid or sticky bit, which an artifact may not have (want 0 to 0777 in octal, e.g. 0644 or 0755)`}},
	},
	{
		name:  "artifact mode not octal",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "mode: 0999") + artifactItem(artURL, artSumB, "/opt/b", "mode: rwxr-xr-x") + artifactItem(artURL, artSumB, "/opt/c", "mode: 0x1ed")),
		want: []corpusDiag{
			{"jails/tools.yaml", 11, 13, "spec.artifacts[0].mode", `"0999" is not a file mode (want 0 to 0777 in octal, e.g. 0644 or 0755)`},
			{"jails/tools.yaml", 15, 13, "spec.artifacts[1].mode", `"rwxr-xr-x" is not a file mode`},
			{"jails/tools.yaml", 19, 13, "spec.artifacts[2].mode", `"0x1ed" is not a file mode`},
		},
	},
	{
		name:  "artifact mode as a list",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "mode: [0755]")),
		want:  []corpusDiag{{"jails/tools.yaml", 11, 13, "spec.artifacts[0].mode", "expected a single value, got a list"}},
	},
	{
		name:  "artifact archive of an unknown format",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "archive: zip") + artifactItem(artURL, artSumB, "/opt/b", "archive: tgz") + artifactItem(artURL, artSumB, "/opt/c", "archive: TAR.GZ") + artifactItem(artURL, artSumB, "/opt/d", "archive: tar.xz")),
		want: []corpusDiag{
			{"jails/tools.yaml", 11, 16, "spec.artifacts[0].archive", `"zip" is not an archive format (want tar, tar.gz or tar.zst, or leave archive out to place the file as it is)`},
			{"jails/tools.yaml", 15, 16, "spec.artifacts[1].archive", `"tgz" is not an archive format (did you mean "tar.gz"? want tar, tar.gz or tar.zst)`},
			{"jails/tools.yaml", 19, 16, "spec.artifacts[2].archive", `"TAR.GZ" is not an archive format (did you mean "tar.gz"? want tar, tar.gz or tar.zst)`},
			{"jails/tools.yaml", 23, 16, "spec.artifacts[3].archive", `"tar.xz" is not an archive format (want tar, tar.gz or tar.zst, or leave archive out to place the file as it is)`},
		},
	},
	{
		name:  "artifact archive written empty",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", `archive: ""`)),
		want:  []corpusDiag{{"jails/tools.yaml", 11, 16, "spec.artifacts[0].archive", `"" is not allowed: leave the field out to use the default (none: the file is placed as it is)`}},
	},

	// The list.
	{
		name:  "artifact with an unknown field",
		files: artifactsJail(artifactItem(artURL, artSumA, "/opt/app", "sha265: "+artSumA)),
		want:  []corpusDiag{{"jails/tools.yaml", 11, 7, "spec.artifacts[0].sha265", `unknown field "sha265" (did you mean "sha256"?)`}},
	},
	{
		name:  "artifacts as a mapping",
		files: artifactsJail("    url: " + artURL + "\n"),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 5, "spec.artifacts", "expected a list, got a mapping"}},
	},
	{
		name:  "artifact written empty",
		files: artifactsJail("    - ~\n"),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 7, "spec.artifacts[0]", "expected a mapping (key: value), got nothing"}},
	},
	{
		name:  "more artifacts than a spec may have",
		files: artifactsJail(strings.Repeat("    - {url: "+artURL+", sha256: "+artSumA+", path: /x}\n", 65)),
		want:  []corpusDiag{{"jails/tools.yaml", 8, 5, "spec.artifacts", "65 artifacts are more than the 64 a spec may have: pack files that go together into one archive"}},
	},
	{
		name: "every field of an artifact wrong, in order",
		files: artifactsJail(artifactItem("http://a.example.org/x", "abc", "x", "mode: 0o7777", "archive: rar") +
			artifactItem("https://a.example.org/y", artSumA, "/y", "mode: 0644")),
		want: []corpusDiag{
			{"jails/tools.yaml", 8, 12, "spec.artifacts[0].url", "plain http:// is not allowed"},
			{"jails/tools.yaml", 9, 15, "spec.artifacts[0].sha256", `"abc" is not a SHA-256`},
			{"jails/tools.yaml", 10, 13, "spec.artifacts[0].path", `"x" is not an absolute path`},
			{"jails/tools.yaml", 11, 13, "spec.artifacts[0].mode", `"0o7777" sets the setuid, setgid or sticky bit`},
			{"jails/tools.yaml", 12, 16, "spec.artifacts[0].archive", `"rar" is not an archive format`},
		},
	},
	{
		name: "a Service template's artifacts",
		files: map[string]string{"apps/web.yaml": checksService("", "    artifacts:\n      - {url: "+artURL+", sha256: "+artSumA+", path: /srv/www/app}\n"+
			"      - {url: "+artURL+", sha256: "+artSumA+", path: srv/app}\n"+
			"    volumes: [{name: www, mountPath: /srv/www}]\n")},
		want: []corpusDiag{
			{"apps/web.yaml", 10, 142, "spec.template.artifacts[0].path", `"/srv/www/app" is under volumes[0].mountPath /srv/www`},
			{"apps/web.yaml", 11, 142, "spec.template.artifacts[1].path", `"srv/app" is not an absolute path`},
		},
	},
}

func TestArtifactsInvalid(t *testing.T) {
	t.Parallel()
	runCorpusInvalid(t, artifactsInvalid)
}

// The URL's credentials never reach a diagnostic.
func TestArtifactURLCredentialsNotShown(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"https://ci:s3cr3t@downloads.example.org/app",
		"http://ci:s3cr3t@downloads.example.org/app",
		"https://ci:s3cr3t@downloads.example.org:port/app",
		"https://ci:s3cr3t@/app",
		"oci://ci:s3cr3t@registry.example.org/team/tools@sha256:" + artSumB,
		"oci://ci:s3cr3t@registry.example.org/team/tools:v1",
	} {
		_, err := render.Render(corpusFS(artifactsJail(artifactItem(`"`+u+`"`, artSumA, "/opt/app")), nil))
		if err == nil {
			t.Errorf("%s: rendered", u)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: the password is shown:\n%v", u, err)
		}
	}
}

var artifactsValid = []corpusValidCase{
	{
		name: "artifacts with defaults applied, sorted by path",
		files: artifactsJail(artifactItem(artURL, strings.ToUpper(artSumA), "/usr/local/bin/app", "mode: 0o755") +
			artifactItem(artOCI, artSumA, "/usr/local/etc/app.conf") +
			artifactItem(artURL+".tar.gz?X-Amz-Signature=abc", artSumB, "/opt/app", "archive: tar.gz") +
			artifactItem(artURL, artSumA, "/usr/local/bin/helper", `mode: "0750"`) +
			artifactItem(artURL, artSumA, "/usr/local/bin/other", "mode: 0700") +
			artifactItem(artURL, artSumA, "/var/dbx") +
			"  volumes:\n    - {name: data, mountPath: /var/db}\n"),
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "tools.Spec.Artifacts", corpusInstance(t, m, "tools").Spec.Artifacts, []render.Artifact{
				{URL: artURL + ".tar.gz?X-Amz-Signature=abc", SHA256: artSumB, Path: "/opt/app", Archive: render.ArchiveTarGz},
				{URL: artURL, SHA256: artSumA, Path: "/usr/local/bin/app", Mode: 0o755},
				{URL: artURL, SHA256: artSumA, Path: "/usr/local/bin/helper", Mode: 0o750},
				{URL: artURL, SHA256: artSumA, Path: "/usr/local/bin/other", Mode: 0o700},
				{URL: artOCI, SHA256: artSumA, Path: "/usr/local/etc/app.conf", Mode: render.DefaultArtifactMode},
				{URL: artURL, SHA256: artSumA, Path: "/var/dbx", Mode: render.DefaultArtifactMode},
			})
			corpusEqual(t, "tools.Stateful", corpusInstance(t, m, "tools").Stateful, true)
		},
	},
	{
		name:  "artifacts empty, or written empty",
		files: map[string]string{"jails/tools.yaml": checksJail("  artifacts: []\n"), "jails/other.yaml": strings.Replace(checksJail("  artifacts:\n"), "tools", "other", 1)},
		check: func(t *testing.T, m *render.Model) {
			for _, name := range []string{"tools", "other"} {
				corpusEqual(t, name+".Spec.Artifacts", corpusInstance(t, m, name).Spec.Artifacts, []render.Artifact(nil))
			}
		},
	},
	{
		name: "a template's artifacts go to every replica, surge instances too",
		files: map[string]string{"apps/web.yaml": checksService("  replicas: 3\n  strategy: {maxSurge: 1}\n",
			"    artifacts:\n      - {url: "+artURL+", sha256: "+artSumA+", path: /usr/local/bin/web, mode: 0755}\n")},
		check: func(t *testing.T, m *render.Model) {
			want := []render.Artifact{{URL: artURL, SHA256: artSumA, Path: "/usr/local/bin/web", Mode: 0o755}}
			hash := corpusInstance(t, m, "web-0").SpecHash
			for _, name := range []string{"web-0", "web-1", "web-2", "web-3"} {
				inst := corpusInstance(t, m, name)
				corpusEqual(t, name+".Spec.Artifacts", inst.Spec.Artifacts, want)
				corpusEqual(t, name+".SpecHash", inst.SpecHash, hash)
			}
			corpusEqual(t, "web.Stateful", corpusService(t, m, "web").Stateful, false)
		},
	},
}

func TestArtifactsValid(t *testing.T) {
	t.Parallel()
	runCorpusValid(t, artifactsValid)
}

// TestSpecHashWithoutArtifacts pins the specHash of specs without
// artifacts as it was before artifacts existed: adding them must not
// replace every instance of a cluster that uses none.
func TestSpecHashWithoutArtifacts(t *testing.T) {
	t.Parallel()
	m := checksRender(t, map[string]string{
		"jails/tools.yaml": checksJail("  command: [/usr/sbin/sshd, -D]\n  env: {TZ: UTC}\n  network: {address: 10.200.1.10}\n" +
			"  resources: {cpu: 250m, memory: 128M}\n  volumes:\n    - {name: home, mountPath: /home, size: 10G}\n" +
			"  checks:\n    liveness: {tcp: {port: 22}, failureThreshold: 5}\n  terminationGracePeriod: 30s\n"),
		"apps/web.yaml": corpusWeb,
		"apps/db.yaml":  corpusDB,
	})
	for name, want := range map[string]string{
		"tools": "67d541904db561236c495ba8455a8e74d991d99b2572f448",
		"web-0": "70e12037e2ccfbe9037057bda4705b0f767d03f75ca684c8",
		"db-0":  "685cac9aba241d66037057bda4705b0f55d14b8793232d56",
		"db-1":  "c294ae6f7b2aff0c037057bda4705b0f55d14b8793232d56",
	} {
		corpusEqual(t, name+".SpecHash", corpusInstance(t, m, name).SpecHash, want)
	}
	corpusEqual(t, "SpecHash(JailSpec{})", render.SpecHash(render.JailSpec{}), "ec937c0fcc8ea17bdc182211c1c5fc725f0a5682ad7a8c4f")
}

// A change of artifacts is a replace: the first part of the specHash.
// Their order in the spec changes nothing.
func TestArtifactsChangeClass(t *testing.T) {
	t.Parallel()
	item := func(sum, path string, extra ...string) string { return artifactItem(artURL, sum, path, extra...) }
	hashOf := func(items string) (string, render.JailSpec) {
		t.Helper()
		files := map[string]string{"jails/tools.yaml": checksJail("")}
		if items != "" {
			files = artifactsJail(items)
		}
		inst := corpusInstance(t, checksRender(t, files), "tools")
		return inst.SpecHash, inst.Spec
	}
	baseHash, baseSpec := hashOf("")
	twoHash, twoSpec := hashOf(item(artSumA, "/a") + item(artSumB, "/b"))
	if c := render.ClassifyHashChange(baseHash, twoHash); c != render.ChangeReplace {
		t.Errorf("artifacts added: a %q change, want replace", c)
	}
	if baseHash[16:] != twoHash[16:] {
		t.Errorf("artifacts added: hash %s → %s, want only the replace part changed", baseHash, twoHash)
	}
	corpusEqual(t, "CompareSpecs", render.CompareSpecs(baseSpec, twoSpec), []render.FieldChange{{Field: "artifacts", Class: render.ChangeReplace,
		Detail: "artifacts: +/a (sha256 e3b0c442…); +/b (sha256 9f86d081…)"}})
	if h, _ := hashOf(item(artSumB, "/b") + item(artSumA, "/a")); h != twoHash {
		t.Errorf("the same artifacts in another order hash %s, want %s", h, twoHash)
	}
	if h, _ := hashOf(item(strings.ToUpper(artSumA), "/a") + item(artSumB, "/b", "mode: 0644")); h != twoHash {
		t.Errorf("the default mode written out, an upper-case sha256: hash %s, want %s", h, twoHash)
	}
	for _, tc := range []struct{ name, items, detail string }{
		{"one removed", item(artSumA, "/a"), "artifacts: -/b"},
		{"a new sha256", item(artSumB, "/a") + item(artSumB, "/b"), "artifacts: /a: sha256 e3b0c442… → 9f86d081…"},
		{"a new mode", item(artSumA, "/a", "mode: 0755") + item(artSumB, "/b"), "artifacts: /a: mode 0644 → 0755"},
		{"now an archive", item(artSumA, "/a", "archive: tar") + item(artSumB, "/b"), "artifacts: /a: mode 0644 → (none), archive (none) → tar"},
		{"a new url, its query never shown", artifactItem("https://mirror.example.org/a?X-Amz-Signature=s1", artSumA, "/a") + item(artSumB, "/b"),
			"artifacts: /a: url " + artURL + " → https://mirror.example.org/a?…"},
		{"moved, and another added", item(artSumA, "/c") + item(artSumB, "/b") + item(artSumB, "/d"), "artifacts: -/a; +/c (sha256 e3b0c442…); +/d (sha256 9f86d081…)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hash, spec := hashOf(tc.items)
			corpusEqual(t, "CompareSpecs", render.CompareSpecs(twoSpec, spec), []render.FieldChange{{Field: "artifacts", Class: render.ChangeReplace, Detail: tc.detail}})
			corpusEqual(t, "ClassifyHashChange", render.ClassifyHashChange(twoHash, hash), render.ChangeReplace)
		})
	}
	// Only a pre-signed URL's query string changed.
	a, b := twoSpec, twoSpec
	a.Artifacts = []render.Artifact{{URL: artURL + "?sig=1", SHA256: artSumA, Path: "/a", Mode: 0o644}}
	b.Artifacts = []render.Artifact{{URL: artURL + "?sig=2", SHA256: artSumA, Path: "/a", Mode: 0o644}}
	corpusEqual(t, "CompareSpecs", render.CompareSpecs(a, b), []render.FieldChange{{Field: "artifacts", Class: render.ChangeReplace, Detail: "artifacts: /a: url query string changed"}})
}

// keel render prints a mode as it is written, in octal, and the model
// reads its own JSON back (the agent keeps specs in its state file).
func TestFileModeEncoding(t *testing.T) {
	t.Parallel()
	a := render.Artifact{URL: artURL, SHA256: artSumA, Path: "/usr/local/bin/app", Mode: 0o755}
	y, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), `mode: "0755"`) {
		t.Errorf("YAML:\n%s\nwant mode: \"0755\"", y)
	}
	j, err := json.Marshal([]render.Artifact{a, {URL: artURL, SHA256: artSumB, Path: "/opt/app", Archive: render.ArchiveTar}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`[{"url":%q,"sha256":%q,"path":"/usr/local/bin/app","mode":"0755"},{"url":%q,"sha256":%q,"path":"/opt/app","archive":"tar"}]`, artURL, artSumA, artURL, artSumB)
	corpusEqual(t, "JSON", string(j), want)
	var back []render.Artifact
	if err := json.Unmarshal(j, &back); err != nil {
		t.Fatal(err)
	}
	corpusEqual(t, "JSON read back", back, []render.Artifact{a, {URL: artURL, SHA256: artSumB, Path: "/opt/app", Archive: render.ArchiveTar}})
}
