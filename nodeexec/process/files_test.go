package process

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLookPath(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	os.Mkdir(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "tool"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(bin, "data"), []byte("not executable"), 0o644)
	for _, tc := range []struct{ file, path, want string }{
		{"/usr/bin/env", "", "/usr/bin/env"},
		{"./run.sh", "", filepath.Join(root, "run.sh")},
		{"bin/tool", "", filepath.Join(root, "bin/tool")},
		{"tool", "/nonexistent:bin", filepath.Join(root, "bin/tool")},
		{"tool", bin, filepath.Join(bin, "tool")},
	} {
		if got, err := lookPath(tc.file, tc.path, root); err != nil || got != tc.want {
			t.Errorf("lookPath(%q, %q) = %q, %v; want %q", tc.file, tc.path, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ file, path string }{{"data", bin}, {"missing", bin}, {"", bin}} {
		if got, err := lookPath(tc.file, tc.path, root); err == nil {
			t.Errorf("lookPath(%q) = %q, want an error", tc.file, got)
		}
	}
}

func lines(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "line %03d\n", i)
	}
	return b.String()
}

func TestLogsTail(t *testing.T) {
	d := newDriver(t, Options{})
	dir := d.instanceDir("web-0")
	os.MkdirAll(dir, 0o755)
	if b, err := d.Logs("web-0", 100); err != nil || len(b) != 0 {
		t.Errorf("Logs with no output = %q, %v", b, err)
	}
	os.WriteFile(filepath.Join(dir, "stdout.log"), []byte(lines(0, 100)), 0o600)
	os.WriteFile(filepath.Join(dir, "stderr.log"), []byte("oops\nno newline at the end"), 0o600)

	all, err := d.Logs("web-0", 1<<20)
	want := "==> stdout <==\n" + lines(0, 100) + "==> stderr <==\noops\nno newline at the end"
	if err != nil || string(all) != want {
		t.Errorf("Logs(1 MiB) = %q, %v", all, err)
	}
	// Room for 200 bytes: stderr needs 31, stdout gets the rest, from a
	// line's start.
	got, err := d.Logs("web-0", 200)
	if err != nil || len(got) > 200 {
		t.Fatalf("Logs(200) = %d bytes, %v", len(got), err)
	}
	wantTail := "==> stdout <==\n" + lines(85, 100) + "==> stderr <==\noops\nno newline at the end"
	if string(got) != wantTail {
		t.Errorf("Logs(200) =\n%s\nwant\n%s", got, wantTail)
	}
	if got, _ := d.Logs("web-0", 5); len(got) > 5 {
		t.Errorf("Logs(5) = %q", got)
	}
	if got, _ := d.Logs("web-0", 0); len(got) != 0 {
		t.Errorf("Logs(0) = %q", got)
	}
}

func TestCopyTreeAndRemoveTree(t *testing.T) {
	src := filepath.Join(t.TempDir(), "img")
	os.MkdirAll(filepath.Join(src, "etc", "ro"), 0o755)
	os.WriteFile(filepath.Join(src, "etc", "conf"), []byte("conf"), 0o640)
	os.Symlink("conf", filepath.Join(src, "etc", "link"))
	os.Chmod(filepath.Join(src, "etc", "ro"), 0o555)
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "etc", "ro"), 0o755) })

	dst := filepath.Join(t.TempDir(), "root")
	if err := copyTree(src, dst, false); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "etc", "link")); !bytes.Equal(b, []byte("conf")) {
		t.Errorf("through the copied link: %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "etc", "conf")); fi.Mode().Perm() != 0o640 {
		t.Errorf("copied file mode %v, want 0640", fi.Mode().Perm())
	}
	// An instance may leave a directory it cannot be removed from.
	os.WriteFile(filepath.Join(dst, "etc", "ro", "f"), nil, 0o600)
	os.Chmod(filepath.Join(dst, "etc", "ro"), 0o500)
	if err := removeTree(dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("%s still exists", dst)
	}
}
