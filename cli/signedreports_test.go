package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/sync"
)

// TestPlanIgnoresForgedReports: fra1 has a reportKey; keel plan uses its
// report only when the signature beside it verifies.
func TestPlanIgnoresForgedReports(t *testing.T) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed")
	}
	keys := t.TempDir()
	mk := func(name string) string {
		k := filepath.Join(keys, name)
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		return k
	}
	good, evil := mk("fra1"), mk("evil")
	pub, _ := os.ReadFile(good + ".pub")
	dir := initRepo(t)
	editFile(t, dir, "nodes/fra1.yaml", "  address: 192.0.2.11", "  address: 192.0.2.11\n  reportKey: \""+strings.TrimSpace(string(pub))+"\"")
	reports := writeReports(t, dir)
	sign := func(key string) {
		s, err := sync.LoadReportSigner(key)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(filepath.Join(reports, "report-fra1.yaml"))
		sig, err := sync.SignReport(data, s)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(reports, "report-fra1.yaml.sig"), sig, 0o644)
	}
	alive := func() (bool, string) {
		code, out, errOut := keel(t, "plan", "--repo", dir, "--reports", reports, "--now", planTime.Format(time.RFC3339), "-o", "json")
		if code != cli.ExitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var doc struct {
			Nodes []struct {
				Name  string
				Alive bool
			}
			Warnings []struct{ Message string }
		}
		json.Unmarshal([]byte(out), &doc)
		var warnings []string
		for _, w := range doc.Warnings {
			warnings = append(warnings, w.Message)
		}
		for _, n := range doc.Nodes {
			if n.Name == "fra1" {
				return n.Alive, strings.Join(warnings, "\n")
			}
		}
		t.Fatal("no fra1")
		return false, ""
	}
	if ok, w := alive(); ok || !strings.Contains(w, "not signed") {
		t.Fatalf("an unsigned report of a signing node was used (alive=%v): %s", ok, w)
	}
	sign(evil)
	if ok, w := alive(); ok || !strings.Contains(w, "bad signature") {
		t.Fatalf("a forged report was used (alive=%v): %s", ok, w)
	}
	sign(good)
	if ok, w := alive(); !ok {
		t.Fatalf("a validly signed report was refused: %s", w)
	}
}
