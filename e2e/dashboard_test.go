//go:build linux

package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/status"
)

// TestDashboardShowsDeadNode runs keel dashboard over the repository of
// three real agents: it shows the cluster converged, then, once one agent
// is killed, that node dead, as keel status --check says; Ctrl-C stops it.
func TestDashboardShowsDeadNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml": webService(3, "base/demo", "hello"),
	}})
	c.converge("first commit")
	c.waitAllAlive()

	out := filepath.Join(t.TempDir(), "dashboard.out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(keelBin, "dashboard", "--repo", c.Bare, "--listen", "127.0.0.1:0", "--refresh", "1s")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	serving := regexp.MustCompile(`serving .* on (http://127\.0\.0\.1:[0-9]+/)`)
	var url string
	c.waitFor("keel dashboard serves", func() (bool, string) {
		data, _ := os.ReadFile(out)
		if m := serving.FindSubmatch(data); m != nil {
			url = string(m[1])
			return true, ""
		}
		return false, string(data)
	})
	apiStatus := func() (*status.Status, string) {
		res, err := http.Get(url + "api/status")
		if err != nil {
			return nil, err.Error()
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		var st status.Status
		if res.StatusCode != http.StatusOK || json.Unmarshal(body, &st) != nil {
			return nil, res.Status + " " + string(body)
		}
		return &st, st.Headline
	}
	page := func(path string) string {
		res, err := http.Get(url + path)
		if err != nil {
			return err.Error()
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return string(body)
	}
	tip := c.tip()
	c.waitFor("the dashboard shows the cluster converged", func() (bool, string) {
		st, why := apiStatus()
		return st != nil && st.Converged && st.Tip.Hash == tip, why
	})
	if body := page(""); !strings.Contains(body, "converged at "+tip[:12]) || !strings.Contains(body, `class="headline good"`) {
		t.Fatalf("GET /: not the converged page:\n%s", body)
	}
	c.waitFor("keel status --check exits 0", func() (bool, string) { return keelStatusCheck(t, c.Bare) == 0, "" })

	lost := c.Nodes[len(c.Nodes)-1]
	c.killAgent(lost)
	killed := time.Now()
	c.waitFor("the dashboard shows "+lost+" dead", func() (bool, string) {
		st, why := apiStatus()
		if st == nil {
			return false, why
		}
		for _, n := range st.Nodes {
			if n.Name == lost {
				return n.State == status.NodeDead && !st.Converged, n.State
			}
		}
		return false, "no node " + lost
	})
	t.Logf("the dashboard shows %s dead %s after its agent was killed (livenessTTL %s, refresh 1s)", lost, time.Since(killed).Round(100*time.Millisecond), ttl)
	if body := page(""); !strings.Contains(body, "node "+lost+" is dead") || !strings.Contains(body, `class="headline bad"`) {
		t.Errorf("GET /: the page does not show %s dead:\n%s", lost, body)
	}
	if body := page("nodes/" + lost); !strings.Contains(body, lost+": dead") {
		t.Errorf("GET /nodes/%s: not its dead page:\n%s", lost, body)
	}
	c.waitFor("keel status --check exits 3", func() (bool, string) { return keelStatusCheck(t, c.Bare) == 3, "" })

	// Ctrl-C: a clean stop.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			data, _ := os.ReadFile(out)
			t.Errorf("keel dashboard after SIGINT: %v\n%s", err, data)
		}
		exited <- err // for the cleanup
	case <-c.ctx.Done():
		t.Fatal("keel dashboard did not stop on SIGINT")
	}
}

// keelStatusCheck runs keel status --check on repo and returns its exit
// code. (Callers wait for the code they expect: a read may meet a report
// ref that an agent's go-git push is rewriting in place, exit 2.)
func keelStatusCheck(t *testing.T, repo string) int {
	t.Helper()
	out, err := exec.Command(keelBin, "status", "--repo", repo, "--check").CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		t.Logf("keel status --check: exit %d: %s", ee.ExitCode(), strings.TrimSpace(string(out)))
		return ee.ExitCode()
	default:
		t.Fatal(err)
		return -1
	}
}
