//go:build linux

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestNodeRemovedDecommissions: deleting nodes/n2.yaml makes n2 apply the
// commit as its own decommission: it stops everything it ran (its
// replicas and its Jail run elsewhere, once each), drops its proxies and
// says decommissioned in its report, instead of refusing the commit and
// running a second copy of what its peers now run.
func TestNodeRemovedDecommissions(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":   webService(6, "base/demo", "hello"),
		"jails/tool.yaml": jail("tool", "", 9300, false),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	onN2 := func() []string {
		var out []string
		for name, ps := range c.procsByInstance() {
			for _, p := range ps {
				if p.Node == "n2" {
					out = append(out, name)
				}
			}
		}
		return out
	}
	c.waitFor("n2 runs something", func() (bool, string) { return len(onN2()) > 0, "n2 runs nothing" })
	t.Logf("n2 runs %v", onN2())

	c.commit("n2 leaves", map[string]string{"nodes/n2.yaml": ""})
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	err := c.WaitFor(ctx, func() (bool, string) {
		if on := onN2(); len(on) > 0 {
			return false, fmt.Sprintf("n2 still runs %v", on)
		}
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			if ps := procs[inst.Name]; len(ps) != 1 {
				return false, fmt.Sprintf("%s runs as %v", inst.Name, ps)
			}
		}
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		st := sts["n2"]
		switch {
		case !st.Report.Decommissioned:
			return false, fmt.Sprintf("n2 does not report itself decommissioned (applied %.12s, refused %+v)", st.Applied, st.Report.Refused)
		case len(st.Report.Instances) > 0 || len(st.Report.Services) > 0:
			return false, fmt.Sprintf("n2 still reports %d instances and %d proxied services", len(st.Report.Instances), len(st.Report.Services))
		}
		return true, ""
	})
	if err != nil {
		t.Fatalf("after nodes/n2.yaml was deleted: %v", err)
	}
	// And it stays so: nothing comes back to n2, nothing runs twice.
	deadline := time.Now().Add(ttl)
	for time.Now().Before(deadline) {
		if on := onN2(); len(on) > 0 {
			t.Fatalf("n2 runs %v again after leaving", on)
		}
		c.checkOneEach(m)
		if t.Failed() {
			t.FailNow()
		}
		time.Sleep(200 * time.Millisecond) // a sampling period
	}
}
