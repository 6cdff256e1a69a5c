package cli_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	"github.com/keel-dev/keel/cli"
)

func TestVersionText(t *testing.T) {
	code, out, errOut := keel(t, "version")
	if code != cli.ExitOK {
		t.Fatalf("keel version: exit %d\n%s", code, errOut)
	}
	commit := cli.Commit
	if commit == "" {
		commit = "unknown" // go test records no vcs.revision
	}
	want := fmt.Sprintf("keel %s (commit %s, %s, %s/%s)\n", cli.Version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if out != want {
		t.Errorf("keel version printed\n%q\nwant\n%q", out, want)
	}
}

func TestVersionJSON(t *testing.T) {
	code, out, errOut := keel(t, "version", "-o", "json")
	if code != cli.ExitOK {
		t.Fatalf("keel version -o json: exit %d\n%s", code, errOut)
	}
	// Exactly the documented fields (docs/cli.md#keel-version).
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	want := map[string]any{"version": cli.Version, "commit": cli.Commit, "go": runtime.Version(), "os": runtime.GOOS, "arch": runtime.GOARCH}
	if len(got) != len(want) {
		t.Errorf("fields %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if code, _, errOut := keel(t, "version", "-o", "yaml"); code != cli.ExitUsage {
		t.Errorf("keel version -o yaml: exit %d, want %d (%s)", code, cli.ExitUsage, errOut)
	}
}
