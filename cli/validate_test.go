package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/keel-dev/keel/cli"
)

// TestValidateOutsideARepositoryStopsAtOnce runs keel validate on a tree
// that is not a cluster repository (like /usr, where it once printed 4,316
// errors about every YAML file below): one error, that there is no
// cluster.yaml, and nothing else read.
func TestValidateOutsideARepositoryStopsAtOnce(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{
		"share/doc/compose.yaml":         "services:\n  web:\n    image: nginx\n",
		"share/k8s/deploy.yml":           "apiVersion: apps/v1\nkind: Deployment\n",
		"lib/python3/site/broken.yaml":   "a: [\n",
		"local/etc/keel/nodes/fra1.yaml": "apiVersion: keel/v1\nkind: Node\nmetadata: {name: fra1}\n",
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := keel(t, "validate", "--repo", dir)
	if code != cli.ExitInvalid {
		t.Fatalf("exit %d, want %d\n%s%s", code, cli.ExitInvalid, out, errOut)
	}
	want := "cluster.yaml: missing: there is no cluster.yaml here, so this is not a cluster repository and nothing else was read (is --repo the right directory?)\n" +
		dir + ": invalid: 1 error, 0 warnings\n"
	if out != want {
		t.Errorf("keel validate printed\n%s\nwant\n%s", out, want)
	}

	code, out, _ = keel(t, "validate", "--repo", dir, "-o", "json")
	var got struct {
		Valid  bool
		Errors []struct{ File, Message string }
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if code != cli.ExitInvalid || got.Valid || len(got.Errors) != 1 || got.Errors[0].File != "cluster.yaml" {
		t.Errorf("keel validate -o json: exit %d, %+v", code, got)
	}
}
