package logfile

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

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
			if err := Cap(path, tc.limit); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != tc.want {
				t.Errorf("after Cap:\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	if err := Cap(filepath.Join(t.TempDir(), "missing.log"), 10); err != nil {
		t.Errorf("Cap of a missing log: %v", err)
	}
}

func TestTail(t *testing.T) {
	dir := t.TempDir()
	if b, err := Tail(dir, 100); err != nil || len(b) != 0 {
		t.Errorf("Tail with no output = %q, %v", b, err)
	}
	os.WriteFile(Path(dir, "stdout"), []byte(lines(0, 100)), 0o600)
	os.WriteFile(Path(dir, "stderr"), []byte("oops\nno newline at the end"), 0o600)
	all, err := Tail(dir, 1<<20)
	want := "==> stdout <==\n" + lines(0, 100) + "==> stderr <==\noops\nno newline at the end"
	if err != nil || string(all) != want {
		t.Errorf("Tail(1 MiB) = %q, %v", all, err)
	}
	got, err := Tail(dir, 200)
	wantTail := "==> stdout <==\n" + lines(85, 100) + "==> stderr <==\noops\nno newline at the end"
	if err != nil || string(got) != wantTail {
		t.Errorf("Tail(200) =\n%s\nwant\n%s", got, wantTail)
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
