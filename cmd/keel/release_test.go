package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// semVer is semver.org's regular expression for a version (without the v).
var semVer = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// TestMakeRelease runs `make release` into a temporary directory and checks
// what a user downloads: the four archives, each with the binary for its
// platform, README.md and docs/; SHA256SUMS that sha256sum -c accepts; the
// host's binary printing the version make stamps; and the same bytes when an
// archive is built again.
func TestMakeRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: make release cross-compiles keel four times")
	}
	for _, tool := range []string{"make", "git", "tar", "gzip", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("make release needs %s: %v", tool, err)
		}
	}
	if out, err := exec.Command("tar", "--version").Output(); err != nil || !bytes.Contains(out, []byte("GNU tar")) {
		t.Skip("make release needs GNU tar (--sort, --mtime)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
		}
		return string(out)
	}
	version := strings.TrimSpace(run(root, "make", "-s", "print-version"))
	if !semVer.MatchString(version) {
		t.Fatalf("make stamps %q, which is not a semantic version (minAgentVersion compares it)", version)
	}
	commit := strings.TrimSpace(run(root, "git", "rev-parse", "HEAD"))

	dist := t.TempDir()
	// The version is passed on so that both builds name the same files
	// even if the work tree changes meanwhile.
	run(root, "make", "-s", "release", "DIST="+dist, "VERSION="+version)

	platforms := []string{"freebsd-amd64", "freebsd-arm64", "linux-amd64", "linux-arm64"}
	var want []string
	for _, p := range platforms {
		want = append(want, "keel-"+version+"-"+p+".tar.gz")
	}
	entries, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if wantAll := slices.Sorted(slices.Values(append(slices.Clone(want), "SHA256SUMS"))); !slices.Equal(got, wantAll) {
		t.Fatalf("dist holds %v, want %v and SHA256SUMS", got, want)
	}
	sums := run(dist, "sha256sum", "-c", "SHA256SUMS")
	if n := strings.Count(sums, ": OK\n"); n != len(want) {
		t.Errorf("sha256sum -c SHA256SUMS checked %d archives, want %d:\n%s", n, len(want), sums)
	}

	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	osabis := map[string]elf.OSABI{"linux": elf.ELFOSABI_NONE, "freebsd": elf.ELFOSABI_FREEBSD}
	for i, p := range platforms {
		goos, goarch, _ := strings.Cut(p, "-")
		top := "keel-" + version + "-" + p + "/"
		files := readArchive(t, filepath.Join(dist, want[i]))
		for _, name := range []string{"keel", "README.md", "docs/cli.md", "docs/architecture.md"} {
			if _, ok := files[top+name]; !ok {
				t.Errorf("%s has no %s%s", want[i], top, name)
			}
		}
		bin, ok := files[top+"keel"]
		if !ok {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Errorf("%s: keel is not an ELF binary: %v", want[i], err)
			continue
		}
		if f.Machine != machines[goarch] || f.OSABI != osabis[goos] {
			t.Errorf("%s: keel is for %v/%v, want %v/%v", want[i], f.OSABI, f.Machine, osabis[goos], machines[goarch])
		}
		if p != runtime.GOOS+"-"+runtime.GOARCH {
			continue // not runnable here
		}
		exe := filepath.Join(t.TempDir(), "keel")
		if err := os.WriteFile(exe, bin, 0o755); err != nil {
			t.Fatal(err)
		}
		out := run(dist, exe, "version")
		if w := "keel " + version + " (commit " + commit + ", "; !strings.HasPrefix(out, w) {
			t.Errorf("keel version from %s printed %q, want it to start with %q", want[i], out, w)
		}

		// The same commit gives the same bytes.
		dist2 := t.TempDir()
		run(root, "make", "-s", "DIST="+dist2, "VERSION="+version, filepath.Join(dist2, want[i]))
		again, err := os.ReadFile(filepath.Join(dist2, want[i]))
		if err != nil {
			t.Fatal(err)
		}
		first, err := os.ReadFile(filepath.Join(dist, want[i]))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Errorf("%s built twice from the same commit differs", want[i])
		}
	}
}

// readArchive returns the regular files of a .tar.gz by name, checking on
// the way that every entry has no owner names and numeric ids 0.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("%s: gzip header records name %q, time %v (want neither: gzip -n)", path, zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: %s is owned by %d/%d %q/%q, want 0/0 and no names", path, h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
	return files
}
