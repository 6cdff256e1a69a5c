//go:build linux

package e2e

import (
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestGitUnreachable: while the repository cannot be reached, workloads
// keep running where they are (nobody looks dead for lack of news), the
// Service keeps answering on its VIP, and every agent says that git fails;
// once it is back, a new push converges.
func TestGitUnreachable(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":       webService(3, "base/demo", "hello"),
		"jails/exporter.yaml": jail("exporter", "n2", 9100, false),
	}})
	c.converge("first commit")
	// Every agent's last fetch before the outage must have seen the others'
	// last reports, or its proxy keeps endpoints that are gone.
	c.waitEndpoints("web", webPort)
	m := c.model()
	running := c.checkOneEach(m)
	vip := m.Service("web").VIP.Addr

	away := c.Bare + ".away"
	if err := os.Rename(c.Bare, away); err != nil {
		t.Fatal(err)
	}
	c.waitFor("every agent reports git errors", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for n, st := range sts {
			if st.GitOK || st.GitError == "" {
				return false, n + " reports git fine"
			}
		}
		return true, ""
	})

	// For two TTLs, nothing changes: the same processes, each reported
	// running by its node, and the VIP answers.
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		sts, err := c.statuses()
		if err != nil {
			t.Fatal(err)
		}
		for n, st := range sts {
			if st.GitOK {
				t.Errorf("%s reports git fine while the repository is away", n)
			}
		}
		on := runningOn(sts)
		for name, p := range running {
			if got := on[name]; len(got) != 1 || got[0] != p.Node {
				t.Fatalf("while git is unreachable, %s is reported running on %v, not %s", name, got, p.Node)
			}
		}
		if body, err := httpGet(c.ctx, vip, webPort); err != nil || !strings.HasPrefix(body, "hello from web-") {
			t.Errorf("while git is unreachable, the web VIP answered %q, %v", body, err)
		}
		time.Sleep(500 * time.Millisecond) // a sampling period
	}
	if now := c.checkOneEach(m); !maps.Equal(now, running) {
		t.Errorf("instances changed while git was unreachable: %v, then %v", running, now)
	}
	sts := c.mustStatuses()
	for _, n := range c.Nodes {
		t.Logf("%s while git is unreachable: %s", n, sts[n].GitError)
	}

	if err := os.Rename(away, c.Bare); err != nil {
		t.Fatal(err)
	}
	c.commit("greet in Italian", map[string]string{"apps/web.yaml": webService(3, "base/demo", "ciao")})
	c.converge("git is back")
	c.checkAnswers("web", 3, "ciao")
	c.waitFor("every agent reports git fine", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for n, st := range sts {
			if !st.GitOK {
				return false, fmt.Sprintf("%s: %s", n, st.GitError)
			}
		}
		return true, ""
	})
}
