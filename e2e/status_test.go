//go:build linux

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/status"
)

// keelStatus runs keel status on the cluster's repository (the bare one
// the agents fetch from, read as a file:// URL into a cache directory, as
// a CI job would read its forge) and returns its exit code and output.
func (c *cluster) keelStatus(cache string, args ...string) (int, string) {
	c.t.Helper()
	argv := append([]string{"status", "--repo", "file://" + c.Bare, "--cache-dir", cache}, args...)
	cmd := exec.CommandContext(c.ctx, keelBin, argv...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	case err != nil:
		c.t.Fatalf("keel status: %v\n%s", err, out)
	}
	return 0, string(out)
}

// TestStatusOnRealAgents: on three real agents, keel status --check turns
// 0 once a push has converged, and a killed agent's node turns dead in
// keel status once its report is older than the liveness TTL.
func TestStatusOnRealAgents(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml": webService(3, "base/demo", "hello"),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	cache := t.TempDir()

	pushed := time.Now()
	tip := c.commit("web says hi", map[string]string{"apps/web.yaml": webService(3, "base/demo", "hi")})
	// --check waits (reading again every 200ms) until the agents have
	// applied and reported the push.
	code, out := c.keelStatus(cache, "--check", "--interval", "200ms", "--timeout", scaled(2*time.Minute).String())
	if code != 0 || !strings.Contains(out, "converged at "+tip[:12]) {
		t.Fatalf("keel status --check after the push: exit %d\n%s", code, out)
	}
	t.Logf("keel status --check: converged %s after the push", time.Since(pushed).Round(10*time.Millisecond))
	if ok, why := c.Converged(c.ctx); !ok {
		t.Fatalf("keel status says converged, the agents do not: %s", why)
	}

	lost := c.Nodes[2]
	c.killAgent(lost)
	killed := time.Now()
	var st status.Status
	c.waitFor(lost+" is dead in keel status", func() (bool, string) {
		code, out := c.keelStatus(cache, "-o", "json")
		if code != 0 {
			return false, fmt.Sprintf("exit %d: %s", code, out)
		}
		st = status.Status{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return false, err.Error()
		}
		for _, n := range st.Nodes {
			if n.Name == lost {
				return n.State == status.NodeDead, "state " + n.State
			}
		}
		return false, "no row for " + lost
	})
	t.Logf("%s dead in keel status %s after its agent was killed (livenessTTL %s, reportInterval %s)",
		lost, time.Since(killed).Round(10*time.Millisecond), ttl, reportInterval)
	if st.Converged || !strings.Contains(st.Headline, "node "+lost+" is dead") {
		t.Fatalf("headline with a dead node: %q", st.Headline)
	}
	if code, out := c.keelStatus(cache, "--check"); code != 3 {
		t.Fatalf("--check with a dead node: exit %d\n%s", code, out)
	}
}
