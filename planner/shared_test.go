package planner

import (
	"slices"
	"testing"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// sharedRepo is two Jails, app and backup, that share the volume data and
// are both fixed to node b (app by spec.node, backup by its address in b's
// subnet 10.200.2.0/24); backup has a volume of its own too.
func sharedRepo(node string) repoDef {
	addr := map[string]string{"b": "10.200.2.40/24", "c": "10.200.3.40/24"}[node]
	return repoDef{
		Nodes: tableNodes("a", "b", "c"),
		Workloads: []workloadDef{
			{Name: "app", Volumes: []string{"data"}, Node: node},
			{Name: "backup", Volumes: []string{"data", "spool"}, Address: addr},
		},
	}
}

// TestSharedVolume checks that two Jails that share a volume on one node
// are planned together on that node, whatever pins and reports say, and
// that a node listing the shared volume once (for two instances) holds it
// once, not twice.
func TestSharedVolume(t *testing.T) {
	alive := func(rs ...report.Report) []report.Report {
		names := map[string]bool{}
		for _, r := range rs {
			names[r.Node] = true
		}
		for _, n := range []string{"a", "b", "c"} {
			if !names[n] {
				rs = append(rs, reportOf(n, secs(0)))
			}
		}
		return rs
	}
	cases := []struct {
		name       string
		pins       map[string]string
		reports    func(m *render.Model) []report.Report
		wantReason map[string]string // instance → reason; both on b
		wantWarn   []string          // codes, with app or backup as subject
		noWarn     []string
	}{
		{
			name:       "new: both on their node",
			reports:    func(*render.Model) []report.Report { return alive() },
			wantReason: map[string]string{"app": ReasonNew, "backup": ReasonNew},
			wantWarn:   []string{WarnUnpinned},
		},
		{
			name:       "both pinned",
			pins:       map[string]string{"app": "b", "backup": "b"},
			reports:    func(*render.Model) []report.Report { return alive() },
			wantReason: map[string]string{"app": ReasonPinned, "backup": ReasonPinned},
			noWarn:     []string{WarnHeldTwice, WarnUnpinned},
		},
		{
			name: "the node lists the shared volume once, for both: held, not held twice",
			reports: func(m *render.Model) []report.Report {
				return alive(withVolumes(reportOf("b", secs(0),
					seen("app", report.StateRunning, "10.200.2.9", hashOf(t, m, "app")),
					seen("backup", report.StateRunning, "10.200.2.40", hashOf(t, m, "backup"))), "data", "spool"))
			},
			wantReason: map[string]string{"app": ReasonHeld, "backup": ReasonHeld},
			noWarn:     []string{WarnHeldTwice, WarnDuplicate},
		},
		{
			name: "a report listing the shared volume twice is still one holder",
			reports: func(*render.Model) []report.Report {
				return alive(withVolumes(reportOf("b", secs(0)), "data", "data"))
			},
			wantReason: map[string]string{"app": ReasonHeld, "backup": ReasonHeld},
			noWarn:     []string{WarnHeldTwice},
		},
		{
			name: "one pinned, the other follows the pin, not a stale copy on another node",
			pins: map[string]string{"app": "b"},
			reports: func(*render.Model) []report.Report {
				return alive(withVolumes(reportOf("c", secs(0)), "data"))
			},
			wantReason: map[string]string{"app": ReasonPinned, "backup": ReasonPinned},
			noWarn:     []string{WarnHeldTwice, WarnSpecNodeIgnore},
		},
		{
			name: "one pinned to a dead node: the other stays with it",
			pins: map[string]string{"backup": "b"},
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), reportOf("b", secs(-3600)), reportOf("c", secs(0))}
			},
			wantReason: map[string]string{"app": ReasonPinned, "backup": ReasonPinned},
			wantWarn:   []string{WarnPinnedDead},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := sharedRepo("b")
			repo.Pins = tc.pins
			m := repo.model(t)
			p := plan(m, tc.reports(m)...)
			addrs := map[string]bool{}
			for _, name := range []string{"app", "backup"} {
				pl := placementOf(p, name)
				if pl == nil || pl.Node != "b" || pl.Reason != tc.wantReason[name] {
					t.Fatalf("%s placed %+v (unschedulable: %+v), want %s on b; warnings %v", name, pl, unschedulableOf(p, name), tc.wantReason[name], p.Warnings)
				}
				if !planNode(p, "b").PodCIDR.Contains(pl.Address) || addrs[pl.Address.String()] {
					t.Errorf("%s address %s: not in b's subnet, or given twice", name, pl.Address)
				}
				addrs[pl.Address.String()] = true
				for _, code := range tc.wantWarn {
					if warningOf(p, code, name) == nil {
						t.Errorf("no %s warning for %s: %v", code, name, p.Warnings)
					}
				}
				for _, code := range tc.noWarn {
					if w := warningOf(p, code, name); w != nil {
						t.Errorf("unexpected warning %+v", *w)
					}
				}
			}
			if pl := placementOf(p, "backup"); pl.Address.String() != "10.200.2.40" {
				t.Errorf("backup address %s, want its explicit 10.200.2.40", pl.Address)
			}
		})
	}

	t.Run("a stale copy held on two nodes stops both, flagged", func(t *testing.T) {
		m := sharedRepo("b").model(t)
		p := plan(m, alive(withVolumes(reportOf("a", secs(0)), "data"), withVolumes(reportOf("b", secs(0)), "data"))...)
		for _, name := range []string{"app", "backup"} {
			if pl := placementOf(p, name); pl != nil {
				t.Errorf("%s placed on %s, want nowhere while two nodes hold data", name, pl.Node)
			}
			if warningOf(p, WarnHeldTwice, name) == nil {
				t.Errorf("no %s warning for %s: %v", WarnHeldTwice, name, p.Warnings)
			}
		}
	})

	// Break before make: both moved from b to c (spec and pins edited
	// together, as render requires). Each waits for b to report it
	// stopped, on its own.
	t.Run("moved together: each waits for its own stop on the old node", func(t *testing.T) {
		repo := sharedRepo("c")
		repo.Pins = map[string]string{"app": "c", "backup": "c"}
		m := repo.model(t)
		old := func(name string, st report.State) report.Instance {
			return seen(name, st, "", hashOf(t, m, name))
		}
		p := plan(m, alive(withVolumes(reportOf("b", secs(0), old("app", report.StateRunning), old("backup", report.StateRunning)), "data", "spool"))...)
		for _, name := range []string{"app", "backup"} {
			if pl := placementOf(p, name); pl == nil || pl.Node != "c" || !slices.Equal(pl.WaitsFor, []string{"b"}) {
				t.Fatalf("%s placed %+v, want on c waiting for b", name, pl)
			}
		}
		p = plan(m, alive(withVolumes(reportOf("b", secs(0), old("app", report.StateStopped), old("backup", report.StateRunning)), "data", "spool"))...)
		if pl := placementOf(p, "app"); pl == nil || pl.Node != "c" || len(pl.WaitsFor) != 0 {
			t.Errorf("app placed %+v, want on c waiting for nothing once b reports it stopped", pl)
		}
		if pl := placementOf(p, "backup"); pl == nil || pl.Node != "c" || !slices.Equal(pl.WaitsFor, []string{"b"}) {
			t.Errorf("backup placed %+v, want on c still waiting for b", pl)
		}
		if w := warningOf(p, WarnHeldTwice, "app"); w != nil {
			t.Errorf("unexpected warning %+v: the pins place the volumes", *w)
		}
	})
}
