package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
)

// TestHostileCheckoutIsRefusedByName: a checkout whose files are links (to
// a credentials file, to /etc/passwd, to /dev/zero) or a FIFO makes every
// command that reads it (validate, render, plan, lock) fail at once with
// one error naming the path, the verdict the agent gives on the same
// commit, and nothing of what the link points to in the output (issue 8
// items 1 and 2).
func TestHostileCheckoutIsRefusedByName(t *testing.T) {
	const secret = "AKIA-s3cret-token-never-printed"
	secretFile := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(secretFile, []byte("token: "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		make       func(p string) error
	}{
		{"keel.lock links to a secret", "keel.lock", func(p string) error { return os.Symlink(secretFile, p) }},
		{".keelignore links to a secret", ".keelignore", func(p string) error { return os.Symlink(secretFile, p) }},
		{"a spec links to /etc/passwd", "apps/x.yaml", func(p string) error { return os.Symlink("/etc/passwd", p) }},
		{"a spec links to a secret", "apps/creds.yaml", func(p string) error { return os.Symlink(secretFile, p) }},
		{"a spec links to /dev/zero", "apps/zero.yaml", func(p string) error { return os.Symlink("/dev/zero", p) }},
		{".keelignore is a FIFO", ".keelignore", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"a spec is a FIFO", "apps/pipe.yaml", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"a directory links outside", "apps", func(p string) error { return os.Symlink(filepath.Dir(secretFile), p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := copyRepo(t)
			p := filepath.Join(repo, filepath.FromSlash(tc.path))
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(p); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"validate"}, {"render"}, {"plan"}, {"lock", "--check"}} {
				code, out, errOut := keelWithin(t, 30*time.Second, append(args, "--repo", repo)...)
				all := out + errOut
				if code != cli.ExitInvalid || !strings.Contains(all, tc.path+": not a regular file") {
					t.Errorf("keel %s: exit %d, want %d and an error naming %s:\n%s", args[0], code, cli.ExitInvalid, tc.path, all)
				}
				if strings.Contains(all, secret) || strings.Contains(all, "root:") {
					t.Errorf("keel %s printed what the link points to:\n%s", args[0], all)
				}
			}
		})
	}
}

// keelWithin runs keel, failing the test if it has not returned within d:
// a guard only, so that a command that hangs on a FIFO fails the test
// rather than the whole run.
func keelWithin(t *testing.T, d time.Duration, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := keel(t, args...)
		done <- result{code, out, errOut}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(d):
		t.Fatalf("keel %v has not returned after %v", args, d)
		return 0, "", ""
	}
}

// TestHostileReportDirIsReadByName: keel plan --reports DIR reads the
// directory with the checkout's reader, so a report that is a link to a
// credentials file or a FIFO is ignored with a warning naming it, at once,
// and nothing of what it points to is printed.
func TestHostileReportDirIsReadByName(t *testing.T) {
	const secret = "AKIA-s3cret-token-never-printed"
	secretFile := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(secretFile, []byte("node: "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := initRepo(t)
	reports := writeReports(t, dir)
	if err := os.Symlink(secretFile, filepath.Join(reports, "zz-link.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(reports, "zz-pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := keelWithin(t, 30*time.Second, "plan", "--repo", dir, "--reports", reports, "--now", planTime.Format(time.RFC3339))
	all := out + errOut
	if code != cli.ExitOK {
		t.Fatalf("exit %d:\n%s", code, all)
	}
	for _, name := range []string{"zz-link.yaml", "zz-pipe.yaml"} {
		if !strings.Contains(all, "report "+name+" ignored") || !strings.Contains(all, "not a regular file") {
			t.Errorf("no warning naming %s:\n%s", name, all)
		}
	}
	if strings.Contains(all, secret) {
		t.Errorf("keel plan printed what the link points to:\n%s", all)
	}
}

// TestSubmoduleCheckoutGetsTheCommitsVerdict: a submodule is a gitlink in
// the commit, which every agent refuses by name; in a checkout it is a
// directory holding another repository's files (or a nested repository).
// keel validate on the checkout must give the commit's verdict, not read
// that other repository's files as specs (issue 8 item 1).
func TestSubmoduleCheckoutGetsTheCommitsVerdict(t *testing.T) {
	sub := t.TempDir()
	git(t, sub, "init", "-q", "-b", "main")
	spec := "apiVersion: keel/v1\nkind: Service\nmetadata:\n  name: smuggled\nspec:\n  port: 9090\n  template:\n    image: base/14.2-web\n    command: [/bin/sleep, \"1000\"]\n    resources: {cpu: 100m, memory: 64M}\n"
	if err := os.WriteFile(filepath.Join(sub, "smuggled.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, sub, "add", "-A")
	git(t, sub, "commit", "-q", "-m", "sub")
	dir := initRepo(t)
	git(t, dir, "-c", "protocol.file.allow=always", "submodule", "add", "-q", sub, "apps/vendored")
	git(t, dir, "commit", "-q", "-m", "add a submodule")

	const want = "apps/vendored: not a regular file"
	code, out, errOut := keelWithin(t, 30*time.Second, "plan", "--repo", dir, "--head", "HEAD")
	if !strings.Contains(out+errOut, want) {
		t.Fatalf("keel plan on the commit: exit %d, want an error naming apps/vendored:\n%s%s", code, out, errOut)
	}
	// A clone that did not recurse holds the submodule as an empty
	// directory: the index still says it is a gitlink.
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, dir, "clone", "-q", dir, clone)
	if entries, err := os.ReadDir(filepath.Join(clone, "apps/vendored")); err != nil || len(entries) != 0 {
		t.Fatalf("the clone's submodule is not an empty directory: %v, %v", entries, err)
	}
	for _, repo := range []string{dir, clone} {
		for _, args := range [][]string{{"validate"}, {"render"}, {"lock", "--check"}} {
			code, out, errOut := keelWithin(t, 30*time.Second, append(args, "--repo", repo)...)
			all := out + errOut
			if code != cli.ExitInvalid || !strings.Contains(all, want) || strings.Contains(all, "smuggled") {
				t.Errorf("keel %s on the checkout %s: exit %d, want %d and the commit's verdict (%s):\n%s", args[0], repo, code, cli.ExitInvalid, want, all)
			}
		}
	}
}

// TestNonUTF8NameGetsOneVerdict: a file whose name is not valid UTF-8 (git
// takes any bytes) is refused by name as an invalid tree, alike by keel
// validate on the checkout and by keel plan on the commit (the agents'
// reader).
func TestNonUTF8NameGetsOneVerdict(t *testing.T) {
	dir := initRepo(t)
	if err := os.WriteFile(filepath.Join(dir, "apps", "x\xff.yaml"), []byte("a: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "a name that is not UTF-8")
	const want = `apps: invalid tree: the entry "x\xff.yaml" is not valid UTF-8`
	for _, args := range [][]string{{"validate", "--repo", dir}, {"plan", "--repo", dir, "--head", "HEAD"}} {
		code, out, errOut := keelWithin(t, 30*time.Second, args...)
		if code != cli.ExitInvalid || !strings.Contains(out+errOut, want) {
			t.Errorf("keel %s: exit %d, want %d and %s:\n%s%s", args[0], code, cli.ExitInvalid, want, out, errOut)
		}
	}
}
