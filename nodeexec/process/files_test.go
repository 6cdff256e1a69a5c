package process

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"NAME": "web-0", "A_1": "x", "EMPTY": ""}
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$NAME", "web-0"},
		{"${NAME}", "web-0"},
		{"pre-${NAME}-post", "pre-web-0-post"},
		{"$NAME.log", "web-0.log"},
		{"$A_1$NAME", "xweb-0"},
		{"${A_1}1", "x1"},
		{"$NOPE", ""},
		{"[${NOPE}]", "[]"},
		{"$EMPTY", ""},
		{"$$NAME", "$NAME"},
		{"$$$NAME", "$web-0"},
		{"cost: 5$", "cost: 5$"},
		{"$1 $? $@ $#", "$1 $? $@ $#"},
		{"${x:-default}", "${x:-default}"},
		{"${unclosed", "${unclosed"},
		{"${}", "${}"},
		{"$ NAME", "$ NAME"},
		{"$((i+1))", "$((i+1))"},
	} {
		if got := expand(tc.in, env); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	args := []string{"sh", "-c", "echo $NAME"}
	if got := expandArgs(args, env); !slices.Equal(got, []string{"sh", "-c", "echo web-0"}) || args[2] != "echo $NAME" {
		t.Errorf("expandArgs = %q (input now %q)", got, args)
	}
}

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

func TestCapLog(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		limit         int64
		want          string
	}{
		{"under the limit", lines(0, 10), 1000, lines(0, 10)},
		{"cut at a line", lines(0, 100), 400, lines(78, 100)},          // newest 200 bytes, from the line that starts in them
		{"cut on a line boundary", lines(0, 100), 360, lines(80, 100)}, // exactly 20 lines of 9 bytes
		{"one long line", strings.Repeat("x", 100), 40, strings.Repeat("x", 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stdout.log")
			os.WriteFile(path, []byte(tc.content), 0o600)
			if err := capLog(path, tc.limit); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != tc.want {
				t.Errorf("after capLog:\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	if err := capLog(filepath.Join(t.TempDir(), "missing.log"), 10); err != nil {
		t.Errorf("capLog of a missing log: %v", err)
	}
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

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		sizes []int64
		room  int64
		want  []int64
	}{
		{[]int64{10, 20}, 100, []int64{10, 20}},
		{[]int64{10, 500}, 100, []int64{10, 90}},
		{[]int64{500, 10}, 100, []int64{90, 10}},
		{[]int64{500, 500}, 100, []int64{50, 50}},
		{[]int64{500, 500}, 0, []int64{0, 0}},
		{[]int64{500}, 100, []int64{100}},
		{nil, 100, []int64{}},
	} {
		if got := share(tc.sizes, tc.room); !slices.Equal(got, tc.want) {
			t.Errorf("share(%v, %d) = %v, want %v", tc.sizes, tc.room, got, tc.want)
		}
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
	if err := copyTree(src, dst); err != nil {
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
