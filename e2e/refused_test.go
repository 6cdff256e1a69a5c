//go:build linux

package e2e

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/report"
)

// TestRefusedCommits: a commit with an invalid spec, and one that deletes
// every workload, are refused by every node, which stays on the last good
// commit, keeps its instances running and says why in its status and its
// published report; a fixing commit converges.
func TestRefusedCommits(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":       webService(3, "base/demo", "hello"),
		"jails/exporter.yaml": jail("exporter", "n2", 9100, false),
	}})
	c.converge("first commit")
	good := c.tip()
	m := c.model()
	running := c.checkOneEach(m)

	typo := strings.Replace(webService(3, "base/demo", "hello"), "replicas:", "replcas:", 1)
	bad := c.commit("a typo", map[string]string{"apps/web.yaml": typo})
	c.checkRefused(good, bad, "invalid specs", `apps/web.yaml:`, "replcas")

	empty := c.commit("delete every workload", map[string]string{"apps/web.yaml": "", "jails/exporter.yaml": ""})
	c.checkRefused(good, empty, "renders no workload", "allowEmpty")

	if now := c.checkOneEach(m); !maps.Equal(now, running) {
		t.Errorf("instances changed while commits were refused: %v, then %v", running, now)
	}

	c.commit("fixed", map[string]string{
		"apps/web.yaml":       webService(2, "base/demo", "hello"),
		"jails/exporter.yaml": jail("exporter", "n2", 9100, false),
	})
	c.converge("a fixing commit")
	sts := c.mustStatuses()
	for n, st := range sts {
		if st.Report.Refused != nil {
			t.Errorf("%s still reports a refusal: %+v", n, st.Report.Refused)
		}
	}
	c.checkOneEach(c.model())
}

// checkRefused waits until every node has seen commit refused, reports it
// refused for a reason that contains each of why, still applies good, and
// has published a report that says the same.
func (c *cluster) checkRefused(good, refused string, why ...string) {
	c.t.Helper()
	check := func(node, applied string, ref *report.Refusal) string {
		switch {
		case applied != good:
			return fmt.Sprintf("%s applies %.10s, not the last good commit %.10s", node, applied, good)
		case ref == nil:
			return node + " reports no refusal"
		case ref.Commit != refused:
			return fmt.Sprintf("%s reports commit %.10s refused, not %.10s", node, ref.Commit, refused)
		}
		for _, w := range why {
			if !strings.Contains(ref.Reason, w) {
				return fmt.Sprintf("%s refused %.10s for %q, which does not say %q", node, refused, ref.Reason, w)
			}
		}
		return ""
	}
	var reason string
	c.waitFor(fmt.Sprintf("every node refuses %.10s", refused), func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, n := range c.Nodes {
			st := sts[n]
			if st.Newest != refused {
				return false, fmt.Sprintf("%s has not seen %.10s yet", n, refused)
			}
			if r := st.Report.Refused; r != nil {
				reason = r.Reason
			}
			if why := check(n, st.Applied, st.Report.Refused); why != "" {
				return false, why
			}
		}
		pub, err := c.published()
		if err != nil {
			return false, err.Error()
		}
		for _, n := range c.Nodes {
			r, ok := pub[n]
			if !ok {
				return false, "no published report of " + n
			}
			if why := check(n, r.Commit, r.Refused); why != "" {
				return false, "published: " + why
			}
		}
		return true, ""
	})
	c.t.Logf("every node refused %.10s: %s", refused, reason)
}
