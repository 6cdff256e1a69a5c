//go:build linux

package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// ports of the workloads of TestPush, by Service or Jail.
var pushPorts = map[string]int{"web": webPort, "db": 5432, "exporter": 9100, "cache": 9300}

// TestPush: after a push, every instance runs on the node the planner
// chose, answers on its address (and its Service on its VIP), and the
// reports published in the repository say so.
func TestPush(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":       webService(3, "base/demo", "hello"),
		"apps/db.yaml":        dbService(2),
		"jails/exporter.yaml": jail("exporter", "n2", pushPorts["exporter"], false),
	}})
	c.converge("first commit")
	tip := c.commit("add a jail", map[string]string{"jails/cache.yaml": jail("cache", "", pushPorts["cache"], false)})
	c.converge("push")
	m := c.model()

	// The plan every agent computes from the published reports is the one
	// the cluster runs, and every agent acts on that very plan.
	var plan *planner.Plan
	c.waitFor("the published reports show the tip running, and every agent acts on their plan", func() (bool, string) {
		pub, err := c.published()
		if err != nil {
			return false, err.Error()
		}
		var reports []report.Report
		for _, n := range c.Nodes {
			r, ok := pub[n]
			if !ok {
				return false, "no report of " + n
			}
			if r.Commit != tip {
				return false, fmt.Sprintf("%s published commit %.10s, not the tip %.10s", n, r.Commit, tip)
			}
			reports = append(reports, r)
		}
		plan = planner.Compute(planner.Input{Model: m, Commit: tip, Reports: reports, Now: time.Now()})
		if why := planRuns(m, plan, reports); why != "" {
			return false, "published reports: " + why
		}
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, n := range c.Nodes {
			if id := sts[n].Report.PlanID; id != plan.PlanID {
				return false, fmt.Sprintf("%s acts on plan %.10s, the published reports give %.10s", n, id, plan.PlanID)
			}
		}
		return true, ""
	})
	for _, n := range plan.Nodes {
		if !n.Alive {
			t.Errorf("node %s is not alive in the plan", n.Name)
		}
	}
	if len(plan.Unschedulable) > 0 {
		t.Errorf("unschedulable: %+v", plan.Unschedulable)
	}
	for _, inst := range m.Instances {
		if inst.Stateful {
			pl := placementOf(plan, inst.Name)
			if pin := m.Lock.Pins[inst.Name]; pl == nil || pl.Node != pin || pl.Reason != planner.ReasonPinned {
				t.Errorf("stateful %s: placed %+v, pinned to %s", inst.Name, pl, pin)
			}
		}
	}

	// What the agents say now agrees with the plan, and so do the
	// processes.
	sts := c.mustStatuses()
	var reports []report.Report
	for _, n := range c.Nodes {
		reports = append(reports, sts[n].Report)
	}
	if why := planRuns(m, plan, reports); why != "" {
		t.Errorf("agents' statuses: %s", why)
	}
	procs := c.checkOneEach(m)
	for _, pl := range plan.Placements {
		if p := procs[pl.Instance]; p.Node != pl.Node {
			t.Errorf("%s: its process runs on %s, the plan says %s", pl.Instance, p.Node, pl.Node)
		}
	}

	// Every agent proxies each Service to its replicas, and says so.
	c.waitEndpoints("web", webPort)
	c.waitEndpoints("db", pushPorts["db"])

	// Each instance answers on its address (once it listens: running
	// means its process is up), and each Service on its VIP.
	for _, pl := range plan.Placements {
		port := pushPorts[cmp.Or(pl.Service, pl.Instance)]
		want := fmt.Sprintf("from %s on node %s", pl.Instance, pl.Node)
		c.waitFor(pl.Instance+" answers", func() (bool, string) {
			body, err := httpGet(c.ctx, pl.Address, port)
			if err != nil {
				return false, fmt.Sprintf("%s at %s:%d: %v", pl.Instance, pl.Address, port, err)
			}
			if !strings.Contains(body, want) {
				return false, fmt.Sprintf("%s answered %q, want %q", pl.Instance, body, want)
			}
			return true, ""
		})
	}
	for _, s := range plan.Services {
		if len(s.Endpoints) != len(m.Service(s.Name).Instances) {
			t.Errorf("service %s has endpoints %v", s.Name, s.Endpoints)
		}
		seen := map[string]bool{}
		for range 3 * len(s.Endpoints) {
			body, err := httpGet(c.ctx, s.VIP, s.Port)
			if err != nil {
				t.Errorf("service %s at %s:%d: %v", s.Name, s.VIP, s.Port, err)
				break
			}
			if !strings.HasPrefix(body, "hello from "+s.Name+"-") {
				t.Errorf("service %s answered %q", s.Name, body)
				break
			}
			seen[strings.Fields(body)[2]] = true
		}
		t.Logf("service %s at %s:%d: answered by %v", s.Name, s.VIP, s.Port, slices.Sorted(mapKeys(seen)))
	}
}

// planRuns says how the reports differ from the plan: each placed instance
// must be reported running at its current spec and planned address on its
// planned node, and on no other.
func planRuns(m *render.Model, plan *planner.Plan, reports []report.Report) string {
	if len(plan.Placements) != len(m.Instances) {
		return fmt.Sprintf("%d placements for %d instances", len(plan.Placements), len(m.Instances))
	}
	for _, pl := range plan.Placements {
		inst := m.Instance(pl.Instance)
		for _, r := range reports {
			ri := r.Instance(pl.Instance)
			running := ri != nil && ri.State == report.StateRunning
			switch {
			case r.Node == pl.Node && !running:
				return fmt.Sprintf("%s is placed on %s, which does not report it running", pl.Instance, pl.Node)
			case r.Node == pl.Node && ri.SpecHash != inst.SpecHash:
				return fmt.Sprintf("%s runs on %s at an old spec", pl.Instance, pl.Node)
			case r.Node == pl.Node && ri.Address != pl.Address:
				return fmt.Sprintf("%s runs on %s at %s, planned at %s", pl.Instance, pl.Node, ri.Address, pl.Address)
			case r.Node != pl.Node && running:
				return fmt.Sprintf("%s is placed on %s but runs on %s", pl.Instance, pl.Node, r.Node)
			}
		}
	}
	return ""
}

func placementOf(plan *planner.Plan, name string) *planner.Placement {
	for i := range plan.Placements {
		if plan.Placements[i].Instance == name {
			return &plan.Placements[i]
		}
	}
	return nil
}
