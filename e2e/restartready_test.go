//go:build linux

package e2e

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestAgentRestartKeepsEndpoints: an agent that restarts finds its
// instances running, and its first report must not say they are unready
// before their checks have run: the other nodes would take them out of
// every proxy until its next report. No other agent's plan has a Service
// below its replica count at any moment of the restart (each agent logs
// when its plan does).
func TestAgentRestartKeepsEndpoints(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{"apps/web.yaml": webService(3, "base/demo", "hello")}})
	c.converge("first commit")
	c.waitEndpoints("web", webPort)
	below := func() int {
		n := 0
		for _, node := range []string{"n2", "n3"} {
			b, _ := os.ReadFile(c.LogFile(node))
			n += strings.Count(string(b), "services below their replica count")
		}
		return n
	}
	before := below()
	for range 3 {
		if err := c.Stop("n1", syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := c.Start("n1"); err != nil {
			t.Fatal(err)
		}
		c.waitFor("n1 reports every instance ready again", func() (bool, string) {
			st, err := c.Status(c.ctx, "n1")
			if err != nil {
				return false, err.Error()
			}
			for _, in := range st.Report.Instances {
				if !in.IsReady() {
					return false, in.Name + " not ready"
				}
			}
			return len(st.Report.Instances) > 0, "no instance"
		})
		// Let the peers fetch and plan with n1's reports.
		time.Sleep(scaled(3 * time.Second))
	}
	if after := below(); after != before {
		t.Fatalf("while n1's agent restarted, the other agents' plans had a Service below its replica count %d times:\n%s", after-before, c.LogTail("n2", 20))
	}
}
