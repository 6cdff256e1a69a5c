package sync_test

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// zeros is an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// hashObject writes size bytes of zeros as a blob, without holding them in
// the test's memory, and returns its hash.
func hashObject(t *testing.T, dir string, size int64) string {
	t.Helper()
	cmd := exec.Command("git", "hash-object", "-w", "--stdin")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	cmd.Stdin = io.LimitReader(zeros{}, size)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git hash-object: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestReportBombCostsOnlyItsReport: a report.yaml that is small on disk and
// inflates to 128 MiB (a decompression bomb), or a signature above its
// limit, is refused from the object's header: the other reports are read,
// the bomb is one node's problem, and reading them all allocates a small
// fraction of the bomb (issue 8 item 5). Both a loose object and a packed
// one are tried.
func TestReportBombCostsOnlyItsReport(t *testing.T) {
	const bombSize = 128 << 20
	for _, packed := range []bool{false, true} {
		t.Run(map[bool]string{false: "loose", true: "packed"}[packed], func(t *testing.T) {
			dir := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
			publish := func(node string, entries ...string) {
				tree := git(t, dir, strings.Join(entries, "\n")+"\n", "mktree")
				commit := git(t, dir, "", "commit-tree", tree, "-m", "report")
				git(t, dir, "", "update-ref", "refs/keel/reports/"+node, commit)
			}
			good := report.Report{Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
			publish("n1", "100644 blob "+git(t, dir, string(good.Marshal()), "hash-object", "-w", "--stdin")+"\treport.yaml")
			publish("n2", "100644 blob "+hashObject(t, dir, bombSize)+"\treport.yaml")
			if packed {
				git(t, dir, "", "repack", "-a", "-d", "-q")
			}
			repo, err := sync.OpenRepo(dir)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			reports, problems, err := sync.ReadReports(repo, render.DefaultReportRefPrefix)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatalf("a bomb made reading every report fail: %v", err)
			}
			if len(reports) != 1 || reports[0].Node != "n1" {
				t.Errorf("reports %v, want n1's alone", reports)
			}
			if len(problems) != 1 || !strings.Contains(problems[0], "n2") || !strings.Contains(problems[0], "too large") {
				t.Errorf("problems %q, want n2's report refused as too large", problems)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > bombSize/8 {
				t.Errorf("reading the reports allocated %d MiB for a %d MiB bomb", alloc>>20, bombSize>>20)
			}
		})
	}
}
