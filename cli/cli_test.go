package cli_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-dev/keel/cli"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// keel runs the CLI in-process and returns its exit code and output.
func keel(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cli -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (run go test ./cli -update after checking the change):\n--- got\n%s", name, got)
	}
}

// copyRepo copies repo-example to a temporary directory.
func copyRepo(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS("../repo-example")); err != nil {
		t.Fatal(err)
	}
	// The private halves of the example's report keys are nowhere: the
	// tests' synthetic reports are unsigned, so the copies have no keys
	// (the test of signed reports sets its own).
	nodes, _ := filepath.Glob(filepath.Join(dst, "nodes", "*.yaml"))
	for _, n := range nodes {
		data, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		var keep []string
		for _, l := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(l, "  reportKey:") {
				keep = append(keep, l)
			}
		}
		if err := os.WriteFile(n, []byte(strings.Join(keep, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func TestRenderExampleGolden(t *testing.T) {
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			code, out, errOut := keel(t, "render", "--repo", "../repo-example", "-o", format)
			if code != cli.ExitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			golden(t, "render-example."+format, out)
		})
	}
}

func TestRenderShowsEveryReplica(t *testing.T) {
	_, out, _ := keel(t, "render", "--repo", "../repo-example")
	for _, want := range []string{"name: web-0", "name: web-1", "name: web-2", "name: db-0", "name: db-1", "name: db-0-data",
		"podCIDR: 10.200.", "vip: 10.201.", "specHash: "} {
		if !strings.Contains(out, want) {
			t.Errorf("keel render output lacks %q", want)
		}
	}
}

func TestValidateExample(t *testing.T) {
	code, out, errOut := keel(t, "validate", "--repo", "../repo-example")
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "valid:") || strings.Contains(out, "warning") && !strings.Contains(out, "0 warnings") {
		t.Errorf("unexpected output:\n%s", out)
	}
}

func TestValidateReportsTypoWithPosition(t *testing.T) {
	dir := copyRepo(t)
	web := filepath.Join(dir, "apps/web.yaml")
	data, _ := os.ReadFile(web)
	data = bytes.Replace(data, []byte("    image: base/14.2-web"), []byte("    imgae: base/14.2-web"), 1)
	if err := os.WriteFile(web, data, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := keel(t, "validate", "--repo", dir)
	if code != cli.ExitInvalid {
		t.Fatalf("exit %d, want %d", code, cli.ExitInvalid)
	}
	want := `apps/web.yaml:11:5: spec.template.imgae: unknown field "imgae" (did you mean "image"?)`
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}

	code, out, _ = keel(t, "validate", "--repo", dir, "-o", "json")
	if code != cli.ExitInvalid || !strings.Contains(out, `"valid": false`) || !strings.Contains(out, `"field": "spec.template.imgae"`) {
		t.Errorf("json: exit %d\n%s", code, out)
	}
}

func TestUsageAndIOErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"validate", "--no-such-flag"},
		{"validate", "--repo", filepath.Join(t.TempDir(), "missing")},
		{"render", "-o", "xml", "--repo", "../repo-example"},
		{"validate", "extra-argument"},
		{"no-such-command"},
	} {
		if code, _, errOut := keel(t, args...); code != cli.ExitUsage || errOut == "" {
			t.Errorf("keel %v: exit %d (stderr %q), want %d with a message", args, code, errOut, cli.ExitUsage)
		}
	}
}

func TestHelpOnEveryCommand(t *testing.T) {
	for _, c := range []string{"validate", "render", "lock", "version"} {
		code, out, _ := keel(t, c, "--help")
		if code != cli.ExitOK || !strings.Contains(out, "Usage:") {
			t.Errorf("keel %s --help: exit %d\n%s", c, code, out)
		}
	}
}

func TestLockCheckOnExample(t *testing.T) {
	if code, out, errOut := keel(t, "lock", "--check", "--repo", "../repo-example"); code != cli.ExitOK {
		t.Fatalf("the committed keel.lock is stale: exit %d\n%s%s", code, out, errOut)
	}
}

func TestLockWritesThenIsIdempotent(t *testing.T) {
	dir := copyRepo(t)
	lockPath := filepath.Join(dir, "keel.lock")
	committed, _ := os.ReadFile(lockPath)
	if err := os.Remove(lockPath); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := keel(t, "lock", "--check", "--repo", dir); code != cli.ExitInvalid || !strings.Contains(out, "missing") {
		t.Fatalf("--check without a lock: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(lockPath); err == nil {
		t.Fatal("--check wrote keel.lock")
	}
	if code, _, errOut := keel(t, "lock", "--repo", dir); code != cli.ExitOK {
		t.Fatalf("lock: exit %d: %s", code, errOut)
	}
	first, _ := os.ReadFile(lockPath)
	if !bytes.Equal(first, committed) {
		t.Errorf("regenerated lock differs from the committed one:\n%s\nvs\n%s", first, committed)
	}
	code, out, _ := keel(t, "lock", "--repo", dir)
	second, _ := os.ReadFile(lockPath)
	if code != cli.ExitOK || !bytes.Equal(first, second) || !strings.Contains(out, "up to date") {
		t.Errorf("second keel lock changed something: exit %d, %s", code, out)
	}

	// A new service gets a VIP only once locked; --check says so.
	svc := "apiVersion: keel/v1\nkind: Service\nmetadata: {name: api}\nspec: {port: 9000, template: {image: base/x}}\n"
	if err := os.WriteFile(filepath.Join(dir, "apps/api.yaml"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := keel(t, "lock", "--check", "--repo", dir); code != cli.ExitInvalid || !strings.Contains(out, "+ vips.api: ") {
		t.Errorf("--check with a new service: exit %d\n%s", code, out)
	}
	if code, _, _ := keel(t, "lock", "--repo", dir); code != cli.ExitOK {
		t.Fatal("lock failed")
	}
	third, _ := os.ReadFile(lockPath)
	for _, line := range strings.Split(string(first), "\n") {
		if !strings.Contains(string(third), line) {
			t.Errorf("existing entry %q changed when a service was added", line)
		}
	}
}
