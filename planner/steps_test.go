package planner

// Table tests for the ten placement steps of docs/architecture.md ("Placement
// (planner)"), plus liveness and AssumeAlive. Each test builds a real
// repository, renders it, and plans it with hand-written reports.

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// stepsRepo is a small cluster with a bit of everything: five nodes (one
// drained, labels for selectors and ingress), stateless and stateful
// Services, Jails with and without volumes, and two Ingresses.
func stepsRepo() repoDef {
	nodes := tableNodes("a", "b", "c", "d", "e")
	nodes[0].Labels = map[string]string{"zone": "x", IngressLabel: "true"}
	nodes[1].Labels = map[string]string{"zone": "y"}
	nodes[2].Labels = map[string]string{"zone": "x", "disk": "ssd"}
	nodes[3].Drained = true
	nodes[4].CPU, nodes[4].Memory = "2", "2G"
	return repoDef{
		Nodes: nodes,
		Workloads: []workloadDef{
			svc("web", 4),
			{Service: true, Name: "api", Replicas: 3, CPU: "500m", Selector: map[string]string{"zone": "x"}},
			{Service: true, Name: "db", Replicas: 2, Volumes: []string{"data"}},
			{Name: "cache", Env: map[string]string{"SIZE": "1G"}},
			{Name: "vault", Volumes: []string{"vault-data"}, Node: "c"},
			{Name: "fixed", Address: "10.200.2.40"},
		},
		Ingresses: []ingressDef{{Name: "site", Host: "www.example.com", Service: "web"}, {Name: "apis", Host: "api.example.com", Service: "api"}},
		Pins:      map[string]string{"db-0": "b"},
	}
}

// stepsReports are reports for stepsRepo: a, b, c and e alive (with skewed
// clocks), d alive but drained; the instances spread over them.
func stepsReports(t *testing.T, m *render.Model) []report.Report {
	a := reportOf("a", secs(-3),
		seen("web-0", report.StateRunning, "10.200.1.10", hashOf(t, m, "web-0")),
		seen("api-0", report.StateRunning, "10.200.1.11", hashAfter(t, m, "api-0", editImage)))
	a.Certificates = []report.Certificate{{Host: "www.example.com", Expires: secs(86400 * 60)}}
	b := withVolumes(reportOf("b", secs(5),
		seen("db-0", report.StateRunning, "10.200.2.20", hashOf(t, m, "db-0")),
		seen("web-1", report.StateCrashLoop, "10.200.2.21", hashOf(t, m, "web-1"))), "db-0-data")
	c := withVolumes(reportOf("c", secs(-12),
		seen("vault", report.StateRunning, "10.200.3.7", hashOf(t, m, "vault")),
		seen("api-1", report.StateRunning, "10.200.3.8", hashAfter(t, m, "api-1", editImage))), "vault-data")
	d := reportOf("d", secs(1), seen("web-2", report.StateRunning, "10.200.4.9", hashOf(t, m, "web-2")))
	e := reportOf("e", secs(0), seen("web-0", report.StateRunning, "10.200.5.9", hashOf(t, m, "web-0")))
	e.Refused = &report.Refusal{Commit: commitC, Reason: "minAgentVersion 9.9.9"}
	return []report.Report{a, b, c, d, e}
}

func TestStep1FixedOrder(t *testing.T) {
	repo := stepsRepo()
	m := repo.model(t)
	reports := stepsReports(t, m)
	want := plan(m, reports...)
	wantJSON := planJSON(t, want)

	t.Run("file layout and document order do not matter", func(t *testing.T) {
		for seed := range uint64(8) {
			m2 := renderFS(t, repo.fs(rand.New(rand.NewPCG(seed, 1))))
			if got := planJSON(t, plan(m2, reports...)); !bytes.Equal(got, wantJSON) {
				t.Fatalf("layout %d: plan differs:\n%s\nwant\n%s", seed, got, wantJSON)
			}
		}
	})
	t.Run("report order and the order inside reports do not matter", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 7))
		for i := range 30 {
			rs := slices.Clone(reports)
			rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
			for k := range rs {
				rs[k].Instances = slices.Clone(rs[k].Instances)
				rng.Shuffle(len(rs[k].Instances), func(i, j int) {
					rs[k].Instances[i], rs[k].Instances[j] = rs[k].Instances[j], rs[k].Instances[i]
				})
			}
			if got := planJSON(t, plan(m, rs...)); !bytes.Equal(got, wantJSON) {
				t.Fatalf("order %d: plan differs:\n%s\nwant\n%s", i, got, wantJSON)
			}
		}
	})
	t.Run("an older copy of a node's report is ignored in any position", func(t *testing.T) {
		old := reportOf("b", secs(-20), seen("web-3", report.StateRunning, "10.200.2.99", hashOf(t, m, "web-3")))
		for _, rs := range [][]report.Report{append([]report.Report{old}, reports...), append(slices.Clone(reports), old)} {
			if got := planJSON(t, plan(m, rs...)); !bytes.Equal(got, wantJSON) {
				t.Fatalf("an older report of b changed the plan:\n%s\nwant\n%s", got, wantJSON)
			}
		}
	})
	t.Run("two reports of a node at the same time: the choice does not depend on order", func(t *testing.T) {
		x := reportOf("b", secs(5), seen("web-3", report.StateRunning, "10.200.2.99", hashOf(t, m, "web-3")))
		one := planJSON(t, plan(m, append(slices.Clone(reports), x)...))
		two := planJSON(t, plan(m, append([]report.Report{x}, reports...)...))
		if !bytes.Equal(one, two) {
			t.Fatalf("tie between two reports of b depends on order:\n%s\n%s", one, two)
		}
	})
	t.Run("the reader's clock does not matter within MaxClockLead", func(t *testing.T) {
		// The newest report is at secs(5); TTL/3 is 10 s.
		for _, now := range []time.Time{secs(-5), secs(30), secs(3000)} {
			got := planJSON(t, Compute(Input{Model: m, Commit: commitC, Reports: reports, Now: now}))
			if !bytes.Equal(got, wantJSON) {
				t.Fatalf("now %s: plan differs", now)
			}
		}
	})
	t.Run("repeated runs give the same bytes", func(t *testing.T) {
		for range 20 {
			if got := planJSON(t, plan(m, reports...)); !bytes.Equal(got, wantJSON) {
				t.Fatal("two runs on the same input differ")
			}
		}
	})
	t.Run("slices are sorted by name", func(t *testing.T) {
		names := func(n int, f func(int) string) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = f(i)
			}
			return out
		}
		for what, s := range map[string][]string{
			"nodes":         names(len(want.Nodes), func(i int) string { return want.Nodes[i].Name }),
			"placements":    names(len(want.Placements), func(i int) string { return want.Placements[i].Instance }),
			"unschedulable": names(len(want.Unschedulable), func(i int) string { return want.Unschedulable[i].Instance }),
			"services":      names(len(want.Services), func(i int) string { return want.Services[i].Name }),
			"ingresses":     names(len(want.Ingresses), func(i int) string { return want.Ingresses[i].Name }),
		} {
			if !slices.IsSorted(s) {
				t.Errorf("%s not sorted: %v", what, s)
			}
		}
	})
}

// statefulRepo has three nodes and a stateful Jail db with one volume.
func statefulRepo() repoDef {
	return repoDef{
		Nodes:     tableNodes("a", "b", "c"),
		Workloads: []workloadDef{{Name: "db", Volumes: []string{"db-data"}}, svc("web", 2)},
	}
}

func TestStep2PinnedStaysOnItsNode(t *testing.T) {
	alive := func(nodes ...string) []report.Report {
		var out []report.Report
		for _, n := range nodes {
			out = append(out, reportOf(n, secs(0)))
		}
		return out
	}
	cases := []struct {
		name        string
		edit        func(*repoDef)
		reports     func(m *render.Model) []report.Report
		wantWarning string
	}{
		{
			name:        "pinned to a dead node stays there, with a warning",
			reports:     func(*render.Model) []report.Report { return append(alive("b", "c"), reportOf("a", secs(-300))) },
			wantWarning: WarnPinnedDead,
		},
		{
			name:        "pinned to a node that never reported stays there",
			reports:     func(*render.Model) []report.Report { return alive("b", "c") },
			wantWarning: WarnPinnedDead,
		},
		{
			name: "pin wins over another node holding its volumes",
			reports: func(*render.Model) []report.Report {
				return append(alive("a", "c"), withVolumes(reportOf("b", secs(0)), "db-data"))
			},
		},
		{
			name: "pin wins over an alive node that runs it",
			reports: func(m *render.Model) []report.Report {
				return append(alive("a", "c"), reportOf("b", secs(0), seen("db", report.StateRunning, "10.200.2.5", m.Instance("db").SpecHash)))
			},
		},
		{
			name:        "pin wins over a nodeSelector that no longer matches",
			edit:        func(r *repoDef) { r.Workloads[0].Selector = map[string]string{"disk": "ssd"} },
			reports:     func(*render.Model) []report.Report { return alive("a", "b", "c") },
			wantWarning: WarnSpecNodeIgnore,
		},
		{
			name:    "pinned to a drained node stays there",
			edit:    func(r *repoDef) { r.Nodes[0].Drained = true },
			reports: func(*render.Model) []report.Report { return alive("a", "b", "c") },
		},
		{
			name: "pinned to a node that refused the commit stays there",
			reports: func(*render.Model) []report.Report {
				rs := alive("a", "b", "c")
				rs[0].Refused = &report.Refusal{Commit: commitC, Reason: "untrusted"}
				return rs
			},
		},
		{
			name:    "pinned to a full node stays there",
			edit:    func(r *repoDef) { r.Nodes[0].CPU, r.Nodes[0].Memory = "100m", "64M" },
			reports: func(*render.Model) []report.Report { return alive("a", "b", "c") },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := statefulRepo()
			repo.Pins = map[string]string{"db": "a"}
			if tc.edit != nil {
				tc.edit(&repo)
			}
			m := repo.model(t)
			p := plan(m, tc.reports(m)...)
			pl := placementOf(p, "db")
			if pl == nil || pl.Node != "a" || pl.Reason != ReasonPinned {
				t.Fatalf("db placed %+v, want pinned on a", pl)
			}
			if tc.wantWarning != "" && warningOf(p, tc.wantWarning, "db") == nil {
				t.Errorf("no %s warning for db: %v", tc.wantWarning, p.Warnings)
			}
			if !pl.Address.IsValid() || !planNode(p, "a").PodCIDR.Contains(pl.Address) {
				t.Errorf("db address %s is not in a's subnet", pl.Address)
			}
		})
	}

	t.Run("pin to a node that left the inventory makes it unschedulable", func(t *testing.T) {
		repo := statefulRepo()
		repo.Pins = map[string]string{"db": "a"}
		m := repo.model(t)
		m.Lock.Pins["db"] = "gone" // render refuses this lock; the planner must not place db anyway
		p := plan(m, alive("a", "b", "c")...)
		if pl := placementOf(p, "db"); pl != nil {
			t.Fatalf("db placed on %s", pl.Node)
		}
		if u := unschedulableOf(p, "db"); u == nil || !strings.Contains(u.Reason, "gone") {
			t.Fatalf("db unschedulable = %+v, want a reason naming node gone", u)
		}
	})
	t.Run("a pin on a stateless instance is ignored", func(t *testing.T) {
		repo := statefulRepo()
		repo.Pins = map[string]string{"web-0": "a"}
		repo.Nodes[0].Drained = true
		m := repo.model(t)
		p := plan(m, alive("a", "b", "c")...)
		if pl := placementOf(p, "web-0"); pl == nil || pl.Node == "a" || pl.Reason != ReasonNew {
			t.Fatalf("web-0 placed %+v: a pin must not hold stateless work on a drained node", pl)
		}
	})
	t.Run("a pinned replica of a stateful Service", func(t *testing.T) {
		repo := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{{Service: true, Name: "pg", Replicas: 2, Volumes: []string{"data"}}},
			Pins: map[string]string{"pg-0": "c", "pg-1": "c"}}
		m := repo.model(t)
		p := plan(m, reportOf("a", secs(0)), reportOf("b", secs(0)))
		for _, name := range []string{"pg-0", "pg-1"} {
			if pl := placementOf(p, name); pl == nil || pl.Node != "c" || pl.Reason != ReasonPinned {
				t.Errorf("%s placed %+v, want pinned on c (dead)", name, pl)
			}
		}
	})
}

func TestStep3HeldStaysWithItsVolumes(t *testing.T) {
	cases := []struct {
		name        string
		specNode    string // db's spec.node
		reports     func(m *render.Model) []report.Report
		wantNode    string // "" for unschedulable
		wantReason  string
		wantWarning string
	}{
		{
			name: "an alive node lists its volumes without running it",
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), withVolumes(reportOf("b", secs(0)), "db-data"), reportOf("c", secs(0))}
			},
			wantNode: "b", wantReason: ReasonHeld,
		},
		{
			name: "a dead node lists its volumes",
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), withVolumes(reportOf("b", secs(-3600)), "db-data"), reportOf("c", secs(0))}
			},
			wantNode: "b", wantReason: ReasonHeld, wantWarning: WarnPinnedDead,
		},
		{
			name: "a dead holder wins over an alive node that runs it",
			reports: func(m *render.Model) []report.Report {
				return []report.Report{
					reportOf("a", secs(0), seen("db", report.StateRunning, "10.200.1.5", m.Instance("db").SpecHash)),
					withVolumes(reportOf("b", secs(-3600)), "db-data"), reportOf("c", secs(0)),
				}
			},
			wantNode: "b", wantReason: ReasonHeld, wantWarning: WarnPinnedDead,
		},
		{
			name:     "a holder that no longer matches spec.node keeps it, with a warning",
			specNode: "c",
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), withVolumes(reportOf("b", secs(0)), "db-logs"), reportOf("c", secs(0))}
			},
			wantNode: "b", wantReason: ReasonHeld, wantWarning: WarnSpecNodeIgnore,
		},
		{
			name: "a holder that refused the commit keeps it",
			reports: func(*render.Model) []report.Report {
				b := withVolumes(reportOf("b", secs(0)), "db-data")
				b.Refused = &report.Refusal{Commit: commitC, Reason: "untrusted"}
				return []report.Report{reportOf("a", secs(0)), b, reportOf("c", secs(0))}
			},
			wantNode: "b", wantReason: ReasonHeld,
		},
		{
			name: "two alive nodes list its volumes: placed nowhere and flagged",
			reports: func(*render.Model) []report.Report {
				return []report.Report{withVolumes(reportOf("a", secs(0)), "db-data"), withVolumes(reportOf("b", secs(0)), "db-data"), reportOf("c", secs(0))}
			},
			wantWarning: WarnHeldTwice,
		},
		{
			name: "an alive and a dead node list its volumes: placed nowhere and flagged",
			reports: func(*render.Model) []report.Report {
				return []report.Report{withVolumes(reportOf("a", secs(0)), "db-data"), withVolumes(reportOf("b", secs(-999)), "db-data"), reportOf("c", secs(0))}
			},
			wantWarning: WarnHeldTwice,
		},
		{
			name: "its two volumes on two nodes: placed nowhere and flagged",
			reports: func(*render.Model) []report.Report {
				return []report.Report{withVolumes(reportOf("a", secs(0)), "db-data"), withVolumes(reportOf("b", secs(0)), "db-logs"), reportOf("c", secs(0))}
			},
			wantWarning: WarnHeldTwice,
		},
		{
			name: "a report dated more than an hour ahead holds nothing",
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), withVolumes(reportOf("b", t0.Add(2*time.Hour)), "db-data"), reportOf("c", secs(0))}
			},
			wantReason: ReasonNew, wantWarning: WarnUnpinned,
		},
		{
			name: "a report of a node outside the inventory holds nothing",
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0)), withVolumes(reportOf("ghost", secs(0)), "db-data")}
			},
			wantReason: ReasonNew, wantWarning: WarnUnpinned,
		},
		{
			name: "only the newest report of a node counts",
			reports: func(*render.Model) []report.Report {
				return []report.Report{withVolumes(reportOf("b", secs(-100)), "db-data"), reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0))}
			},
			wantReason: ReasonNew, wantWarning: WarnUnpinned,
		},
		{
			name: "nobody holds it: placed new, with a warning to pin it",
			reports: func(*render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0))}
			},
			wantReason: ReasonNew, wantWarning: WarnUnpinned,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := statefulRepo()
			repo.Workloads[0].Volumes = []string{"db-data", "db-logs"}
			repo.Workloads[0].Node = tc.specNode
			m := repo.model(t)
			p := plan(m, tc.reports(m)...)
			pl := placementOf(p, "db")
			switch {
			case tc.wantReason == "":
				if pl != nil {
					t.Fatalf("db placed on %s, want nowhere", pl.Node)
				}
				if u := unschedulableOf(p, "db"); u == nil || u.Reason == "" {
					t.Fatalf("db is neither placed nor unschedulable: %+v", p.Unschedulable)
				}
			case pl == nil:
				t.Fatalf("db not placed: %+v", unschedulableOf(p, "db"))
			case pl.Reason != tc.wantReason || (tc.wantNode != "" && pl.Node != tc.wantNode):
				t.Fatalf("db placed %+v, want %s on %q", pl, tc.wantReason, tc.wantNode)
			}
			if tc.wantWarning != "" && warningOf(p, tc.wantWarning, "db") == nil {
				t.Errorf("no %s warning for db: %v", tc.wantWarning, p.Warnings)
			}
		})
	}
}

// freshNode is where a new placement of inst would go when every node of
// m is alive and empty.
func freshNode(t *testing.T, m *render.Model, inst string) string {
	t.Helper()
	var rs []report.Report
	for _, n := range m.Nodes {
		rs = append(rs, reportOf(n.Name, secs(0)))
	}
	n := nodeOfInstance(plan(m, rs...), inst)
	if n == "" {
		t.Fatalf("%s cannot be placed at all", inst)
	}
	return n
}

// otherNode is a node of names that is not n.
func otherNode(names []string, n string) string {
	for _, x := range names {
		if x != n {
			return x
		}
	}
	return ""
}

func TestStep4Sticky(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	repo := repoDef{Nodes: tableNodes(nodes...), Workloads: []workloadDef{svc("web", 3), {Name: "job", Env: map[string]string{"A": "1"}}}}
	m := repo.model(t)
	aliveExcept := func(skip string, extra ...report.Report) []report.Report {
		rs := slices.Clone(extra)
		for _, n := range nodes {
			if n != skip {
				rs = append(rs, reportOf(n, secs(0)))
			}
		}
		return rs
	}

	for _, st := range report.States {
		t.Run(fmt.Sprintf("stays in state %s, even off its rendezvous node", st), func(t *testing.T) {
			home := otherNode(nodes, freshNode(t, m, "web-1"))
			r := reportOf(home, secs(0), seen("web-1", st, "", hashAfter(t, m, "web-1", editImage)))
			p := plan(m, aliveExcept(home, r)...)
			if pl := placementOf(p, "web-1"); pl == nil || pl.Node != home || pl.Reason != ReasonSticky {
				t.Fatalf("web-1 placed %+v, want sticky on %s", pl, home)
			}
		})
	}
	t.Run("a crash-looping Jail does not hop", func(t *testing.T) {
		home := otherNode(nodes, freshNode(t, m, "job"))
		for i := range 5 {
			r := reportOf(home, secs(i*10), seen("job", report.StateCrashLoop, "", hashOf(t, m, "job")))
			r.Instances[0].Restarts = i
			var rs []report.Report
			for _, n := range nodes {
				if n != home {
					rs = append(rs, reportOf(n, secs(i*10)))
				}
			}
			if got := nodeOfInstance(plan(m, append(rs, r)...), "job"); got != home {
				t.Fatalf("pass %d: job hopped from %s to %s", i, home, got)
			}
		}
	})
	t.Run("reported only by a dead node: placed anew elsewhere", func(t *testing.T) {
		home := freshNode(t, m, "web-0")
		dead := reportOf(home, secs(-600), seen("web-0", report.StateRunning, "", hashOf(t, m, "web-0")))
		p := plan(m, aliveExcept(home, dead)...)
		if pl := placementOf(p, "web-0"); pl == nil || pl.Node == home || pl.Reason != ReasonNew {
			t.Fatalf("web-0 placed %+v, want new, off dead %s", pl, home)
		}
	})
	t.Run("stays on a node that refused the commit", func(t *testing.T) {
		home := otherNode(nodes, freshNode(t, m, "web-0"))
		r := reportOf(home, secs(0), seen("web-0", report.StateRunning, "", hashOf(t, m, "web-0")))
		r.Refused = &report.Refusal{Commit: commitC, Reason: "minAgentVersion"}
		if pl := placementOf(plan(m, aliveExcept(home, r)...), "web-0"); pl == nil || pl.Node != home || pl.Reason != ReasonSticky {
			t.Fatalf("web-0 placed %+v, want sticky on %s", pl, home)
		}
	})

	t.Run("constraints", func(t *testing.T) {
		cases := []struct {
			name     string
			edit     func(*repoDef)
			stateful bool
			want     []string // where web-0 may be; "a" alone means it stays
		}{
			{name: "moves off a node that no longer matches nodeSelector", edit: func(r *repoDef) {
				r.Workloads[0].Selector = map[string]string{"zone": "x"}
				r.Nodes[1].Labels = map[string]string{"zone": "x"}
			}, want: []string{"b"}},
			{name: "moves off a node other than spec.node", edit: func(r *repoDef) { r.Workloads[0].Node = "c" }, want: []string{"c"}},
			{name: "stateless moves off a drained node", edit: func(r *repoDef) { r.Nodes[0].Drained = true }, want: []string{"b", "c", "d"}},
			{name: "stateful stays on a drained node", edit: func(r *repoDef) { r.Nodes[0].Drained = true }, stateful: true, want: []string{"a"}},
			{name: "stays where it still matches", edit: func(r *repoDef) {
				r.Workloads[0].Selector = map[string]string{"zone": "x"}
				r.Nodes[0].Labels = map[string]string{"zone": "x"}
				r.Nodes[1].Labels = map[string]string{"zone": "x"}
			}, want: []string{"a"}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				repo := repoDef{Nodes: tableNodes(nodes...), Workloads: []workloadDef{svc("web", 1)}}
				if tc.stateful {
					repo.Workloads[0].Volumes = []string{"data"}
				}
				tc.edit(&repo)
				m := repo.model(t)
				// a runs it (without listing volumes, so that step 3 does not apply).
				r := reportOf("a", secs(0), seen("web-0", report.StateRunning, "10.200.1.9", hashOf(t, m, "web-0")))
				p := plan(m, aliveExcept("a", r)...)
				pl := placementOf(p, "web-0")
				if pl == nil || !slices.Contains(tc.want, pl.Node) {
					t.Fatalf("web-0 placed %+v (unschedulable: %+v), want on one of %v", pl, unschedulableOf(p, "web-0"), tc.want)
				}
				if wantReason := map[bool]string{true: ReasonSticky, false: ReasonNew}[pl.Node == "a"]; pl.Reason != wantReason {
					t.Fatalf("web-0 placed %+v, want reason %s", pl, wantReason)
				}
			})
		}
	})

	t.Run("two alive nodes report it", func(t *testing.T) {
		cur, old := hashOf(t, m, "web-2"), hashAfter(t, m, "web-2", editEnv)
		ih := hash64("web-2")
		rv := func(n string) uint64 { return rendezvous(ih, hash64(n)) }
		hi, lo := "a", "b"
		if rv(lo) > rv(hi) {
			hi, lo = lo, hi
		}
		cases := []struct {
			name       string
			hiSeen     report.Instance
			loSeen     report.Instance
			wantWinner string
		}{
			{"the one running the current specHash wins", seen("web-2", report.StateRunning, "", old), seen("web-2", report.StateRunning, "", cur), lo},
			{"a running current spec beats a crash-looping one", seen("web-2", report.StateCrashLoop, "", cur), seen("web-2", report.StateRunning, "", cur), lo},
			{"both current: the higher rendezvous hash wins", seen("web-2", report.StateRunning, "", cur), seen("web-2", report.StateRunning, "", cur), hi},
			{"both outdated: the higher rendezvous hash wins", seen("web-2", report.StateRunning, "", old), seen("web-2", report.StateStarting, "", old), hi},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				rs := []report.Report{reportOf(hi, secs(0), tc.hiSeen), reportOf(lo, secs(1), tc.loSeen), reportOf("c", secs(2)), reportOf("d", secs(3))}
				for range 2 {
					p := plan(m, rs...)
					if pl := placementOf(p, "web-2"); pl == nil || pl.Node != tc.wantWinner || pl.Reason != ReasonSticky {
						t.Fatalf("web-2 placed %+v, want sticky on %s", pl, tc.wantWinner)
					}
					if warningOf(p, WarnDuplicate, "web-2") == nil {
						t.Errorf("no %s warning: %v", WarnDuplicate, p.Warnings)
					}
					slices.Reverse(rs)
				}
			})
		}
		t.Run("a dead second reporter is no duplicate", func(t *testing.T) {
			rs := []report.Report{reportOf(hi, secs(-400), seen("web-2", report.StateRunning, "", cur)), reportOf(lo, secs(0), seen("web-2", report.StateRunning, "", old)), reportOf("c", secs(0))}
			p := plan(m, rs...)
			if got := nodeOfInstance(p, "web-2"); got != lo {
				t.Fatalf("web-2 on %s, want %s (the only alive reporter)", got, lo)
			}
			if w := warningOf(p, WarnDuplicate, "web-2"); w != nil {
				t.Errorf("unexpected warning %v", w)
			}
		})
	})

	t.Run("capacity never evicts a sticky instance", func(t *testing.T) {
		repo := repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{
			{Service: true, Name: "big", Replicas: 3, CPU: "1", Memory: "1G"}, {Name: "late", CPU: "100m", Memory: "64M"},
		}}
		repo.Nodes[0].CPU, repo.Nodes[0].Memory = "2", "2G"
		m := repo.model(t)
		a := reportOf("a", secs(0))
		for i := range 3 {
			name := fmt.Sprintf("big-%d", i)
			a.Instances = append(a.Instances, seen(name, report.StateRunning, "", hashOf(t, m, name)))
		}
		p := plan(m, a, reportOf("b", secs(0)))
		for i := range 3 {
			if pl := placementOf(p, fmt.Sprintf("big-%d", i)); pl == nil || pl.Node != "a" || pl.Reason != ReasonSticky {
				t.Errorf("big-%d placed %+v, want sticky on a", i, pl)
			}
		}
		if warningOf(p, WarnOverCapacity, "a") == nil {
			t.Errorf("no over-capacity warning for a: %v", p.Warnings)
		}
		if got := nodeOfInstance(p, "late"); got != "b" {
			t.Errorf("late placed on %q, want b: a is full", got)
		}
		if n := planNode(p, "a"); n.Committed.CPU != 3000 || n.Committed.Memory != 3<<30 {
			t.Errorf("a committed %+v, want 3 CPU and 3G", n.Committed)
		}
	})
}

func TestStep5New(t *testing.T) {
	allAlive := func(m *render.Model, edit ...func(*report.Report)) []report.Report {
		var rs []report.Report
		for _, n := range m.Nodes {
			r := reportOf(n.Name, secs(0))
			for _, e := range edit {
				e(&r)
			}
			rs = append(rs, r)
		}
		return rs
	}
	count := func(p *Plan, service string) map[string]int {
		out := map[string]int{}
		for _, pl := range p.Placements {
			if pl.Service == service {
				out[pl.Node]++
			}
		}
		return out
	}

	t.Run("fewest replicas of the same Service first", func(t *testing.T) {
		for _, replicas := range []int{3, 6, 7, 12} {
			m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", replicas)}}.model(t)
			got := count(plan(m, allAlive(m)...), "web")
			for _, n := range []string{"a", "b", "c"} {
				if c := got[n]; c < replicas/3 || c > (replicas+2)/3 {
					t.Errorf("%d replicas: %s got %d (%v), want an even spread", replicas, n, c, got)
				}
			}
		}
	})
	t.Run("replicas already running count", func(t *testing.T) {
		m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 4)}}.model(t)
		rs := allAlive(m)
		rs[0].Instances = []report.Instance{seen("web-0", report.StateRunning, "", hashOf(t, m, "web-0")), seen("web-1", report.StateRunning, "", hashOf(t, m, "web-1"))}
		p := plan(m, rs...)
		if got := count(p, "web"); got["a"] != 2 || got["b"] != 1 || got["c"] != 1 {
			t.Fatalf("spread %v, want a:2 b:1 c:1", got)
		}
	})
	t.Run("other Services' replicas do not count; then the highest rendezvous hash wins", func(t *testing.T) {
		m := repoDef{Nodes: tableNodes("a", "b", "c", "d"), Workloads: []workloadDef{svc("api", 3), svc("web", 1)}}.model(t)
		rs := allAlive(m)
		for i := range 3 {
			rs[0].Instances = append(rs[0].Instances, seen(fmt.Sprintf("api-%d", i), report.StateRunning, "", hashOf(t, m, fmt.Sprintf("api-%d", i))))
		}
		best, bestScore := "", uint64(0)
		for _, n := range []string{"a", "b", "c", "d"} {
			if s := rendezvous(hash64("web-0"), hash64(n)); best == "" || s > bestScore {
				best, bestScore = n, s
			}
		}
		if got := nodeOfInstance(plan(m, rs...), "web-0"); got != best {
			t.Fatalf("web-0 on %s, want %s (highest rendezvous hash)", got, best)
		}
	})

	type cs struct {
		name     string
		repo     func() repoDef
		reports  func(m *render.Model) []report.Report
		inst     string
		want     []string // acceptable nodes; nil: unschedulable
		reason   string   // for unschedulable: a regexp the reason must match
		assumeAl bool
	}
	base := func(w ...workloadDef) func() repoDef {
		return func() repoDef { return repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: w} }
	}
	cases := []cs{
		{
			name: "capacity from the Node file is respected",
			repo: func() repoDef {
				r := base(workloadDef{Name: "big", CPU: "3", Memory: "1G"})()
				r.Nodes[0].CPU, r.Nodes[0].Memory = "2", "8G"
				r.Nodes[1].CPU, r.Nodes[1].Memory = "8", "512M"
				return r
			},
			reports: func(m *render.Model) []report.Report { return allAlive(m) },
			inst:    "big", want: []string{"c"},
		},
		{
			name: "capacity from the report is respected",
			repo: base(workloadDef{Name: "big", CPU: "3", Memory: "1G"}),
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[0].Capacity = report.Capacity{CPU: 2000, Memory: 8 << 30}
				rs[2].Capacity = report.Capacity{CPU: 16000, Memory: 512 << 20}
				return rs
			},
			inst: "big", want: []string{"b"},
		},
		{
			name: "the Node file's capacity wins over the report's",
			repo: func() repoDef {
				r := base(workloadDef{Name: "big", CPU: "3", Memory: "1G"})()
				r.Nodes[0].CPU, r.Nodes[0].Memory = "1", "1G"
				r.Nodes[1].CPU, r.Nodes[1].Memory = "1", "1G"
				r.Nodes[2].CPU, r.Nodes[2].Memory = "4", "4G"
				return r
			},
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[2].Capacity = report.Capacity{CPU: 1000, Memory: 1 << 30} // the file says more
				return rs
			},
			inst: "big", want: []string{"c"},
		},
		{
			name: "a partial override takes the other field from the report",
			repo: func() repoDef {
				r := base(workloadDef{Name: "big", CPU: "3", Memory: "1G"})()
				r.Nodes[0].CPU = "2"     // memory from the report
				r.Nodes[1].Memory = "1G" // cpu from the report: but 1G is too little with what runs there
				r.Nodes[2].Memory = "64G"
				return r
			},
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[1].Instances = []report.Instance{seen("small", report.StateRunning, "", hashOf(t, m, "small"))}
				rs[2].Capacity = report.Capacity{CPU: 4000, Memory: 1 << 20}
				return rs
			},
			inst: "big", want: []string{"c"},
		},
		{
			name:    "unknown capacity is unlimited",
			repo:    base(workloadDef{Name: "big", CPU: "1000", Memory: "1T"}),
			reports: func(m *render.Model) []report.Report { return nil },
			inst:    "big", want: []string{"a", "b", "c"}, assumeAl: true,
		},
		{
			name: "not enough capacity anywhere",
			repo: base(workloadDef{Name: "big", CPU: "65", Memory: "1G"}),
			reports: func(m *render.Model) []report.Report {
				return allAlive(m)
			},
			inst: "big", reason: `^not enough capacity: it needs 65 CPU and 1G memory`,
		},
		{
			name: "a node that refused the commit gets nothing new",
			repo: base(workloadDef{Name: "one", Node: "b"}, workloadDef{Name: "two"}),
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[1].Refused = &report.Refusal{Commit: commitC, Reason: "untrusted"}
				return rs
			},
			inst: "one", reason: `^every alive node that matches is unschedulable or refused this commit$`,
		},
		{
			name: "a refusal of another commit does not count",
			repo: base(workloadDef{Name: "one", Node: "b"}),
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[1].Refused = &report.Refusal{Commit: "0123", Reason: "untrusted"}
				return rs
			},
			inst: "one", want: []string{"b"},
		},
		{
			name: "a drained node gets nothing new",
			repo: func() repoDef {
				r := base(workloadDef{Name: "one", Node: "b"})()
				r.Nodes[1].Drained = true
				return r
			},
			reports: func(m *render.Model) []report.Report { return allAlive(m) },
			inst:    "one", reason: `^every alive node that matches is unschedulable or refused this commit$`,
		},
		{
			name: "drained and refusing nodes are skipped",
			repo: func() repoDef {
				r := base(svc("web", 6))()
				r.Nodes[0].Drained = true
				return r
			},
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[1].Refused = &report.Refusal{Commit: commitC}
				return rs
			},
			inst: "web-5", want: []string{"c"},
		},
		{
			name: "a dead node gets nothing new",
			repo: base(workloadDef{Name: "one", Node: "b"}),
			reports: func(m *render.Model) []report.Report {
				rs := allAlive(m)
				rs[1].Time = secs(-100)
				return rs
			},
			inst: "one", reason: `^no alive node matches node b$`,
		},
		{
			name: "nodeSelector is honoured",
			repo: func() repoDef {
				r := base(workloadDef{Service: true, Name: "web", Replicas: 5, Selector: map[string]string{"disk": "ssd"}})()
				r.Nodes[2].Labels = map[string]string{"disk": "ssd"}
				return r
			},
			reports: func(m *render.Model) []report.Report { return allAlive(m) },
			inst:    "web-4", want: []string{"c"},
		},
		{
			name: "nodeSelector that no alive node matches",
			repo: func() repoDef {
				r := base(workloadDef{Name: "one", Selector: map[string]string{"disk": "ssd", "zone": "x"}})()
				r.Nodes[2].Labels = map[string]string{"disk": "ssd"}
				return r
			},
			reports: func(m *render.Model) []report.Report { return allAlive(m) },
			inst:    "one", reason: `^no alive node matches disk=ssd, zone=x$`,
		},
		{
			name:    "spec.node is honoured",
			repo:    base(svc("web", 1), workloadDef{Service: true, Name: "pinned", Replicas: 4, Node: "a"}),
			reports: func(m *render.Model) []report.Report { return allAlive(m) },
			inst:    "pinned-3", want: []string{"a"},
		},
		{
			name:    "no node is alive",
			repo:    base(svc("web", 1)),
			reports: func(m *render.Model) []report.Report { return nil },
			inst:    "web-0", reason: `^no node is alive$`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := tc.repo()
			repo.Workloads = append(repo.Workloads, workloadDef{Name: "small", CPU: "100m", Memory: "64M"})
			m := repo.model(t)
			p := Compute(Input{Model: m, Commit: commitC, Reports: tc.reports(m), Now: t0, AssumeAlive: tc.assumeAl})
			pl := placementOf(p, tc.inst)
			if tc.want == nil {
				if pl != nil {
					t.Fatalf("%s placed on %s, want unschedulable", tc.inst, pl.Node)
				}
				u := unschedulableOf(p, tc.inst)
				if u == nil || !regexp.MustCompile(tc.reason).MatchString(u.Reason) {
					t.Fatalf("%s unschedulable %+v, want a reason matching %s", tc.inst, u, tc.reason)
				}
				if warningOf(p, WarnUnschedulable, tc.inst) == nil {
					t.Errorf("no %s warning for %s", WarnUnschedulable, tc.inst)
				}
				return
			}
			if pl == nil || pl.Reason != ReasonNew || !slices.Contains(tc.want, pl.Node) {
				t.Fatalf("%s placed %+v (unschedulable: %+v), want new on one of %v", tc.inst, pl, unschedulableOf(p, tc.inst), tc.want)
			}
		})
	}

	t.Run("new placements fill a node exactly to capacity and no further", func(t *testing.T) {
		repo := repoDef{Nodes: tableNodes("a"), Workloads: []workloadDef{{Service: true, Name: "w", Replicas: 5, CPU: "500m", Memory: "256M"}}}
		repo.Nodes[0].CPU, repo.Nodes[0].Memory = "2", "4G"
		m := repo.model(t)
		p := plan(m, reportOf("a", secs(0)))
		if len(p.Placements) != 4 || len(p.Unschedulable) != 1 {
			t.Fatalf("placed %d, unschedulable %d; want 4 and 1", len(p.Placements), len(p.Unschedulable))
		}
		if n := planNode(p, "a"); n.Committed.CPU != n.Capacity.CPU {
			t.Errorf("committed %s of %s", n.Committed.CPU, n.Capacity.CPU)
		}
	})
	t.Run("at most 253 instances on a node", func(t *testing.T) {
		m := repoDef{Nodes: tableNodes("a"), Workloads: []workloadDef{{Service: true, Name: "w", Replicas: 254, CPU: "10m", Memory: "1M"}}}.model(t)
		p := Compute(Input{Model: m, Commit: commitC, Now: t0, AssumeAlive: true})
		if len(p.Placements) != 253 || len(p.Unschedulable) != 1 {
			t.Fatalf("placed %d, unschedulable %d; want 253 and 1", len(p.Placements), len(p.Unschedulable))
		}
	})
}

// slot is where a new instance's address probe starts: FNV-1a of its name
// within .2–.254.
func slot(name string) int {
	h := fnv.New64a()
	h.Write([]byte(name))
	return 2 + int(h.Sum64()%253)
}

// namesWithSlot returns n instance names "<prefix><k>" whose probe starts at
// the same host, for tests of probing past addresses given out.
func namesWithSlot(prefix string, n int) []string {
	by := map[int][]string{}
	for k := 0; ; k++ {
		name := fmt.Sprintf("%s%d", prefix, k)
		s := slot(name)
		by[s] = append(by[s], name)
		if len(by[s]) == n {
			return by[s]
		}
	}
}

func TestStep6Addresses(t *testing.T) {
	subnet := "10.200.1."
	at := func(h int) string { return fmt.Sprintf("%s%d", subnet, h) }
	next := func(h int) int { return 2 + (h-2+1)%253 }
	cases := []struct {
		name    string
		work    []workloadDef
		reports func(m *render.Model) []report.Report
		want    map[string]string
	}{
		{
			name: "a new instance starts at FNV-1a of its name",
			work: []workloadDef{{Name: "j1"}, {Name: "j2"}},
			want: map[string]string{"j1": at(slot("j1")), "j2": at(slot("j2"))},
		},
		{
			name: "a sticky instance keeps its reported address",
			work: []workloadDef{{Name: "j1"}},
			reports: func(m *render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0), seen("j1", report.StateRunning, at(200), "x"))}
			},
			want: map[string]string{"j1": at(200)},
		},
		{
			name: "a new instance probes past an explicit address",
			work: []workloadDef{{Name: "j1"}, {Name: "fixed", Address: at(slot("j1"))}},
			want: map[string]string{"j1": at(next(slot("j1"))), "fixed": at(slot("j1"))},
		},
		{
			name: "a new instance probes past a reported address, even of a deleted instance",
			work: []workloadDef{{Name: "j1"}},
			reports: func(m *render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0), seen("gone", report.StateStopped, at(slot("j1")), "x"))}
			},
			want: map[string]string{"j1": at(next(slot("j1")))},
		},
		{
			name: "a new instance probes past addresses already given out",
			work: []workloadDef{{Name: namesWithSlot("p", 3)[0]}, {Name: namesWithSlot("p", 3)[1]}, {Name: namesWithSlot("p", 3)[2]}},
			want: func() map[string]string {
				ns := namesWithSlot("p", 3)
				slices.Sort(ns) // given out in name order
				s := slot(ns[0])
				return map[string]string{ns[0]: at(s), ns[1]: at(next(s)), ns[2]: at(next(next(s)))}
			}(),
		},
		{
			name: "probing wraps from .254 to .2, never .1",
			work: func() []workloadDef {
				name := ""
				for k := 0; name == ""; k++ {
					if n := fmt.Sprintf("w%d", k); slot(n) == 254 {
						name = n
					}
				}
				return []workloadDef{{Name: name}, {Name: "fixed", Address: at(254)}}
			}(),
			want: map[string]string{"fixed": at(254)},
		},
		{
			name: "an address reported outside the node's subnet is replaced",
			work: []workloadDef{{Name: "j1"}},
			reports: func(m *render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0), seen("j1", report.StateRunning, "10.200.9.9", "x"))}
			},
			want: map[string]string{"j1": at(slot("j1"))},
		},
		{
			name: "two instances reported at one address: the first by name keeps it",
			work: []workloadDef{{Name: "j1"}, {Name: "j2"}},
			reports: func(m *render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0), seen("j2", report.StateRunning, at(50), "x"), seen("j1", report.StateRunning, at(50), "x"))}
			},
			want: map[string]string{"j1": at(50)},
		},
		{
			name: "an explicit address wins over an address reported for another instance",
			work: []workloadDef{{Name: "j1"}, {Name: "z-fixed", Address: at(50)}},
			reports: func(m *render.Model) []report.Report {
				return []report.Report{reportOf("a", secs(0), seen("j1", report.StateRunning, at(50), "x"))}
			},
			want: map[string]string{"z-fixed": at(50)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := repoDef{Nodes: tableNodes("a"), Workloads: tc.work}
			m := repo.model(t)
			rs := []report.Report{reportOf("a", secs(0))}
			if tc.reports != nil {
				rs = tc.reports(m)
			}
			p := plan(m, rs...)
			for inst, want := range tc.want {
				if pl := placementOf(p, inst); pl == nil || pl.Address.String() != want {
					t.Errorf("%s placed %+v, want address %s", inst, pl, want)
				}
			}
			checkAddresses(t, p, m)
		})
	}
	t.Run("a full node hands out .2 to .254, never .0, .1 or .255", func(t *testing.T) {
		m := repoDef{Nodes: tableNodes("a"), Workloads: []workloadDef{{Service: true, Name: "w", Replicas: 253, CPU: "10m", Memory: "1M"}}}.model(t)
		p := plan(m, reportOf("a", secs(0)))
		if len(p.Placements) != 253 {
			t.Fatalf("placed %d, want 253", len(p.Placements))
		}
		checkAddresses(t, p, m)
	})
	t.Run("a pinned instance on a dead node keeps the address it reported", func(t *testing.T) {
		repo := repoDef{Nodes: tableNodes("a", "b"), Workloads: []workloadDef{{Name: "db", Volumes: []string{"d"}}}, Pins: map[string]string{"db": "a"}}
		m := repo.model(t)
		p := plan(m, reportOf("b", secs(0)), reportOf("a", secs(-900), seen("db", report.StateRunning, at(77), "x")))
		if pl := placementOf(p, "db"); pl == nil || pl.Address.String() != at(77) {
			t.Fatalf("db placed %+v, want %s", pl, at(77))
		}
	})
}

// checkAddresses checks that the addresses on each node are distinct, inside
// its subnet and never its network, bridge or broadcast address. The one
// exception is a stateful Jail whose explicit address is in another node's
// subnet but whose volumes hold it here: the plan must say so.
func checkAddresses(t fataler, p *Plan, m *render.Model) {
	t.Helper()
	taken := map[string]string{}
	for _, pl := range p.Placements {
		n := planNode(p, pl.Node)
		if !n.PodCIDR.IsValid() {
			continue
		}
		if inst := m.Instance(pl.Instance); inst.Spec.Network.Address.IsValid() && !n.PodCIDR.Contains(pl.Address) {
			if pl.Reason != ReasonHeld || warningOf(p, WarnSpecNodeIgnore, pl.Instance) == nil {
				t.Fatalf("%s has its explicit address %s on %s (%s) with no warning", pl.Instance, pl.Address, pl.Node, pl.Reason)
			}
			continue
		}
		if !n.PodCIDR.Contains(pl.Address) {
			t.Fatalf("%s has address %s outside %s's subnet %s", pl.Instance, pl.Address, n.Name, n.PodCIDR)
		}
		if h := hostOf(pl.Address); h < 2 || h > 254 {
			if inst := m.Instance(pl.Instance); inst == nil || inst.Spec.Network.Address.Addr != pl.Address {
				t.Fatalf("%s was given %s, which is not in .2-.254", pl.Instance, pl.Address)
			}
		}
		if other, dup := taken[pl.Address.String()]; dup {
			t.Fatalf("%s and %s share address %s on %s", other, pl.Instance, pl.Address, pl.Node)
		}
		taken[pl.Address.String()] = pl.Instance
	}
}

func TestStep7Endpoints(t *testing.T) {
	repo := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 6), svc("idle", 0)}}
	m := repo.model(t)
	h := func(n string) string { return hashOf(t, m, n) }
	a := reportOf("a", secs(0),
		seen("web-0", report.StateRunning, "10.200.1.2", h("web-0")),
		seen("web-1", report.StateStarting, "10.200.1.3", h("web-1")),
		seen("web-2", report.StateCrashLoop, "10.200.1.4", h("web-2")),
		seen("web-3", report.StateRunning, "10.200.1.5", hashAfter(t, m, "web-3", editImage)), // outdated but serving
		seen("web-9", report.StateRunning, "10.200.1.6", "x"))                                 // scaled away
	b := reportOf("b", secs(0),
		seen("web-0", report.StateRunning, "10.200.2.2", "x"), // a duplicate, drained: a's copy is ready
		seen("web-4", report.StateFailed, "10.200.2.3", h("web-4")),
		seen("web-5", report.StateStopped, "10.200.2.4", h("web-5")))
	c := reportOf("c", secs(-100), seen("web-1", report.StateRunning, "10.200.3.2", h("web-1"))) // dead
	p := plan(m, a, b, c)
	got := planService(p, "web")
	want := []Endpoint{
		{Instance: "web-0", Node: "a", Address: mustAddr("10.200.1.2")},
		{Instance: "web-3", Node: "a", Address: mustAddr("10.200.1.5")},
	}
	if got == nil || !slices.Equal(got.Endpoints, want) {
		t.Fatalf("endpoints %+v, want %+v", got, want)
	}
	if idle := planService(p, "idle"); idle == nil || idle.Endpoints == nil || len(idle.Endpoints) != 0 {
		t.Errorf("a Service without replicas: %+v, want an empty endpoint list", idle)
	}
	if s := planService(p, "web"); s.VIP != m.Service("web").VIP.Addr || s.Port != 8080 {
		t.Errorf("web proxy %s:%d, want the model's %s:8080", s.VIP, s.Port, m.Service("web").VIP)
	}
}

func TestStep8RolloutPacing(t *testing.T) {
	type rep struct {
		state report.State
		edit  func(*render.JailSpec) // nil: at the current spec; omit for not reported
	}
	r := func(state report.State, edit func(*render.JailSpec)) *rep { return &rep{state, edit} }
	cur := func(*render.JailSpec) {}
	cases := []struct {
		name         string
		replicas     int
		seen         map[int]*rep
		wantOutdated map[int]render.ChangeClass
		wantReleased []int
		wantWaiting  bool
	}{
		{
			name: "an image change releases one running replica, the lowest index first", replicas: 3,
			seen:         map[int]*rep{0: r(report.StateRunning, editImage), 1: r(report.StateRunning, editImage), 2: r(report.StateRunning, editImage)},
			wantOutdated: map[int]render.ChangeClass{0: render.ChangeReplace, 1: render.ChangeReplace, 2: render.ChangeReplace},
			wantReleased: []int{0},
		},
		{
			name: "an env change is a restart, paced the same way", replicas: 3,
			seen:         map[int]*rep{0: r(report.StateRunning, cur), 1: r(report.StateRunning, editEnv), 2: r(report.StateRunning, editCommand)},
			wantOutdated: map[int]render.ChangeClass{1: render.ChangeRestart, 2: render.ChangeRestart},
			wantReleased: []int{1},
		},
		{
			name: "the next once the previous one runs at the new hash", replicas: 3,
			seen:         map[int]*rep{0: r(report.StateRunning, cur), 1: r(report.StateRunning, editImage), 2: r(report.StateRunning, editImage)},
			wantOutdated: map[int]render.ChangeClass{1: render.ChangeReplace, 2: render.ChangeReplace},
			wantReleased: []int{1},
		},
		{
			name: "nothing more while the updated replica is starting", replicas: 3,
			seen:         map[int]*rep{0: r(report.StateStarting, cur), 1: r(report.StateRunning, editImage), 2: r(report.StateRunning, editImage)},
			wantOutdated: map[int]render.ChangeClass{1: render.ChangeReplace, 2: render.ChangeReplace},
			wantWaiting:  true,
		},
		{
			name: "outdated replicas that are not running are released at once", replicas: 4,
			seen: map[int]*rep{0: r(report.StateRunning, editImage), 1: r(report.StateCrashLoop, editImage), 2: r(report.StateFailed, editEnv),
				3: r(report.StateStopped, editImage)},
			wantOutdated: map[int]render.ChangeClass{0: render.ChangeReplace, 1: render.ChangeReplace, 2: render.ChangeRestart, 3: render.ChangeReplace},
			wantReleased: []int{1, 2, 3},
			wantWaiting:  true,
		},
		{
			name: "lowest index, not lowest name", replicas: 11,
			seen: func() map[int]*rep {
				s := map[int]*rep{0: r(report.StateRunning, cur), 1: r(report.StateRunning, cur)}
				for i := 2; i < 11; i++ {
					s[i] = r(report.StateRunning, editImage)
				}
				return s
			}(),
			wantOutdated: func() map[int]render.ChangeClass {
				o := map[int]render.ChangeClass{}
				for i := 2; i < 11; i++ {
					o[i] = render.ChangeReplace
				}
				return o
			}(),
			wantReleased: []int{2},
		},
		{
			name: "a live-only change (resources) is not outdated", replicas: 2,
			seen: map[int]*rep{0: r(report.StateRunning, editCPU), 1: r(report.StateRunning, editCPU)},
		},
		{
			name: "a hash that is not a specHash (an older agent's) is a replace", replicas: 2,
			seen:         map[int]*rep{0: r(report.StateRunning, nil), 1: r(report.StateRunning, cur)},
			wantOutdated: map[int]render.ChangeClass{0: render.ChangeReplace},
			wantReleased: []int{0},
		},
		{
			name: "a replica not running yet holds the rollout", replicas: 3,
			seen:         map[int]*rep{0: r(report.StateRunning, editImage), 1: r(report.StateRunning, editImage)},
			wantOutdated: map[int]render.ChangeClass{0: render.ChangeReplace, 1: render.ChangeReplace},
			wantWaiting:  true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := repoDef{Nodes: tableNodes("a", "b", "c"),
				Workloads: []workloadDef{{Service: true, Name: "web", Replicas: tc.replicas, Env: map[string]string{"X": "1"}}}}
			m := repo.model(t)
			rs := []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0))}
			for i, s := range tc.seen {
				name := fmt.Sprintf("web-%d", i)
				hash := "0123abcd"
				if s.edit != nil {
					hash = hashAfter(t, m, name, s.edit)
				}
				rs[i%3].Instances = append(rs[i%3].Instances, seen(name, s.state, "", hash))
			}
			p := plan(m, rs...)
			var released []int
			for i := range tc.replicas {
				name := fmt.Sprintf("web-%d", i)
				pl := placementOf(p, name)
				if pl == nil {
					t.Fatalf("%s not placed", name)
				}
				if pl.Outdated != tc.wantOutdated[i] {
					t.Errorf("%s outdated %q, want %q", name, pl.Outdated, tc.wantOutdated[i])
				}
				if pl.Released {
					released = append(released, i)
				}
			}
			if !slices.Equal(released, tc.wantReleased) {
				t.Errorf("released %v, want %v", released, tc.wantReleased)
			}
			if waiting := warningOf(p, WarnRolloutWaiting, "web") != nil; waiting != tc.wantWaiting {
				t.Errorf("waiting %v, want %v: %v", waiting, tc.wantWaiting, p.Warnings)
			}
		})
	}
	t.Run("an outdated Jail is released at once", func(t *testing.T) {
		m := repoDef{Nodes: tableNodes("a"), Workloads: []workloadDef{{Name: "j"}}}.model(t)
		p := plan(m, reportOf("a", secs(0), seen("j", report.StateRunning, "", hashAfter(t, m, "j", editImage))))
		if pl := placementOf(p, "j"); pl == nil || pl.Outdated != render.ChangeReplace || !pl.Released {
			t.Fatalf("j placed %+v, want outdated (replace) and released", pl)
		}
	})
	t.Run("Services are paced independently", func(t *testing.T) {
		m := repoDef{Nodes: tableNodes("a"), Workloads: []workloadDef{svc("x", 2), svc("y", 2)}}.model(t)
		var insts []report.Instance
		for _, n := range []string{"x-0", "x-1", "y-0", "y-1"} {
			insts = append(insts, seen(n, report.StateRunning, "", hashAfter(t, m, n, editImage)))
		}
		p := plan(m, reportOf("a", secs(0), insts...))
		var released []string
		for _, pl := range p.Placements {
			if pl.Released {
				released = append(released, pl.Instance)
			}
		}
		if !slices.Equal(released, []string{"x-0", "y-0"}) {
			t.Fatalf("released %v, want [x-0 y-0]", released)
		}
	})
}

func TestStep9IngressOwner(t *testing.T) {
	nodes := tableNodes("a", "b", "c", "d")
	cert := func(r report.Report, host string) report.Report {
		r.Certificates = append(r.Certificates, report.Certificate{Host: host, Expires: secs(86400 * 80)})
		return r
	}
	best := func(cands ...string) string {
		b := ""
		for _, n := range cands {
			if b == "" || rendezvous(hash64("site"), hash64(n)) > rendezvous(hash64("site"), hash64(b)) {
				b = n
			}
		}
		return b
	}
	others := func(names []string, n string) []string {
		return slices.DeleteFunc(slices.Clone(names), func(x string) bool { return x == n })
	}
	cases := []struct {
		name     string
		labelled []string
		keyed    []string // nodes with a reportKey age can encrypt to; nil: none
		reports  []report.Report
		want     string
		reason   string
	}{
		{
			name: "a labelled alive node is preferred", labelled: []string{"c"},
			reports: []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0)), reportOf("d", secs(0))},
			want:    "c", reason: "highest rendezvous hash",
		},
		{
			name: "among labelled nodes, the highest rendezvous hash", labelled: []string{"a", "b", "c", "d"},
			reports: []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0)), reportOf("d", secs(0))},
			want:    best("a", "b", "c", "d"), reason: "highest rendezvous hash",
		},
		{
			name: "sticky to the labelled node that holds the certificate", labelled: []string{"a", "b", "c", "d"},
			reports: []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), cert(reportOf("c", secs(0)), "www.example.com"), reportOf("d", secs(0))},
			want:    "c", reason: "holds the certificate",
		},
		{
			name: "a certificate on an unlabelled node does not beat the label", labelled: []string{"b"},
			reports: []report.Report{cert(reportOf("a", secs(0)), "www.example.com"), reportOf("b", secs(0)), reportOf("c", secs(0))},
			want:    "b", reason: "highest rendezvous hash",
		},
		{
			name: "a dead certificate holder is passed over", labelled: []string{"a", "b"},
			reports: []report.Report{cert(reportOf("a", secs(-300)), "www.example.com"), reportOf("b", secs(0)), reportOf("c", secs(0))},
			want:    "b", reason: "highest rendezvous hash",
		},
		{
			name: "a certificate for another host does not count", labelled: []string{"a", "b", "c", "d"},
			reports: []report.Report{cert(reportOf(otherNode([]string{"a", "b", "c", "d"}, best("a", "b", "c", "d")), secs(0)), "other.example.com"),
				reportOf("a", secs(-1)), reportOf("b", secs(-1)), reportOf("c", secs(-1)), reportOf("d", secs(-1))},
			want: best("a", "b", "c", "d"), reason: "highest rendezvous hash",
		},
		{
			name: "no labelled node alive: any alive node", labelled: []string{"a"},
			reports: []report.Report{reportOf("a", secs(-300)), reportOf("b", secs(0)), reportOf("c", secs(0))},
			want:    best("b", "c"), reason: "highest rendezvous hash; no alive node is labelled keel.dev/ingress=true",
		},
		{
			name: "no label at all: sticky to the certificate holder", labelled: nil,
			reports: []report.Report{reportOf("a", secs(0)), cert(reportOf("d", secs(0)), "www.example.com"), reportOf("c", secs(0))},
			want:    "d", reason: "holds the certificate; no alive node is labelled keel.dev/ingress=true",
		},
		{
			name: "a node that can receive shared certificates beats one that cannot", labelled: []string{"a", "b", "c", "d"},
			keyed:   others([]string{"a", "b", "c", "d"}, best("a", "b", "c", "d")),
			reports: []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0)), reportOf("d", secs(0))},
			want:    best(others([]string{"a", "b", "c", "d"}, best("a", "b", "c", "d"))...), reason: "highest rendezvous hash",
		},
		{
			name: "a certificate held by a node that cannot share does not make it the owner", labelled: []string{"a", "b", "c", "d"},
			keyed:   []string{"a", "b"},
			reports: []report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), cert(reportOf("c", secs(0)), "www.example.com"), reportOf("d", secs(0))},
			want:    best("a", "b"), reason: "highest rendezvous hash",
		},
		{
			name: "sticky to the holder among the nodes that can share", labelled: []string{"a", "b", "c", "d"},
			keyed:   []string{"a", "b"},
			reports: []report.Report{reportOf(best("a", "b"), secs(0)), cert(reportOf(otherNode([]string{"a", "b"}, best("a", "b")), secs(0)), "www.example.com"), reportOf("c", secs(0)), reportOf("d", secs(0))},
			want:    otherNode([]string{"a", "b"}, best("a", "b")), reason: "holds the certificate",
		},
		{
			name: "nobody alive: no owner", labelled: []string{"a"},
			want: "", reason: "no alive node",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := slices.Clone(nodes)
			for i := range ns {
				if slices.Contains(tc.labelled, ns[i].Name) {
					ns[i].Labels = map[string]string{IngressLabel: "true"}
				} else {
					ns[i].Labels = map[string]string{IngressLabel: "false"}
				}
			}
			m := repoDef{Nodes: ns, Workloads: []workloadDef{svc("web", 1)}, Ingresses: []ingressDef{{Name: "site", Host: "www.example.com", Service: "web"}}}.model(t)
			for i := range m.Nodes {
				if slices.Contains(tc.keyed, m.Nodes[i].Name) {
					m.Nodes[i].ReportKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
				}
			}
			p := plan(m, tc.reports...)
			in := planIngress(p, "site")
			if in == nil || in.Owner != tc.want || in.Reason != tc.reason {
				t.Fatalf("ingress %+v, want owner %q (%s)", in, tc.want, tc.reason)
			}
			if in.Host != "www.example.com" || in.Path != "/" || in.Service != "web" {
				t.Errorf("ingress %+v does not carry the model's host, path and backend", in)
			}
			if nobody := warningOf(p, WarnIngressNoNode, "site") != nil; nobody != (tc.want == "") {
				t.Errorf("%s warning %v, want %v", WarnIngressNoNode, nobody, tc.want == "")
			}
		})
	}
}

func TestStep10PlanID(t *testing.T) {
	repo := stepsRepo()
	m := repo.model(t)
	reports := stepsReports(t, m)
	base := plan(m, reports...)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(base.PlanID) {
		t.Fatalf("plan ID %q is not 32 hex digits", base.PlanID)
	}
	shift := func(d time.Duration) []report.Report {
		rs := slices.Clone(reports)
		for i := range rs {
			rs[i].Time = rs[i].Time.Add(d)
		}
		return rs
	}
	same := []struct {
		name string
		in   Input
	}{
		{"reports in reverse order", Input{Model: m, Commit: commitC, Reports: func() []report.Report {
			rs := slices.Clone(reports)
			slices.Reverse(rs)
			return rs
		}(), Now: t0}},
		{"every report a few seconds later (same alive set and placements)", Input{Model: m, Commit: commitC, Reports: shift(7 * time.Second), Now: t0}},
		{"a restart counter and an error message changed", Input{Model: m, Commit: commitC, Reports: func() []report.Report {
			rs := slices.Clone(reports)
			rs[1].Instances = slices.Clone(rs[1].Instances)
			rs[1].Instances[1].Restarts, rs[1].Instances[1].Error = 12, "exit status 1"
			return rs
		}(), Now: t0}},
	}
	for _, tc := range same {
		t.Run("same ID: "+tc.name, func(t *testing.T) {
			if got := Compute(tc.in); got.PlanID != base.PlanID || got.PlacementID != base.PlacementID {
				t.Fatalf("plan ID changed: %s/%s, want %s/%s", got.PlanID, got.PlacementID, base.PlanID, base.PlacementID)
			}
		})
	}
	// moves says the placement ID changes too (an agent then saves the
	// reports before it acts on the plan).
	changed := []struct {
		name  string
		in    Input
		moves bool
	}{
		{"another commit", Input{Model: m, Commit: "beef", Reports: reports, Now: t0}, true},
		{"a node dies and its work moves", Input{Model: m, Commit: commitC, Reports: func() []report.Report {
			rs := slices.Clone(reports)
			rs[0].Time = secs(-100) // a: web-0 and api-0 move, the ingress too
			return rs
		}(), Now: t0}, true},
		{"a sticky instance reports another address", Input{Model: m, Commit: commitC, Reports: func() []report.Report {
			rs := slices.Clone(reports)
			rs[0].Instances = slices.Clone(rs[0].Instances)
			rs[0].Instances[1].Address = mustAddr("10.200.1.99") // api-0, which only a runs
			return rs
		}(), Now: t0}, true},
		{"the last replica of a Service reports running: its rollout proceeds", Input{Model: m, Commit: commitC, Reports: func() []report.Report {
			rs := slices.Clone(reports)
			// On the node and at the address the plan gives it: nothing
			// moves, the rollout's next replica is released.
			pl := placementOf(base, "api-2")
			i := slices.IndexFunc(rs, func(r report.Report) bool { return r.Node == pl.Node })
			rs[i].Instances = append(slices.Clone(rs[i].Instances), seen("api-2", report.StateRunning, pl.Address.String(), hashOf(t, m, "api-2")))
			return rs
		}(), Now: t0}, false},
	}
	for _, tc := range changed {
		t.Run("new ID: "+tc.name, func(t *testing.T) {
			got := Compute(tc.in)
			if got.PlanID == base.PlanID {
				t.Fatalf("plan ID unchanged")
			}
			if moved := got.PlacementID != base.PlacementID; moved != tc.moves {
				t.Fatalf("placement ID changed: %v, want %v", moved, tc.moves)
			}
		})
	}
	t.Run("new ID: the certificate, and so the Ingress, moves to another labelled node", func(t *testing.T) {
		repo := stepsRepo()
		repo.Nodes[2].Labels[IngressLabel] = "true"
		m := repo.model(t)
		rs := stepsReports(t, m)
		with := plan(m, rs...)
		rs[0].Certificates = nil
		rs[2].Certificates = []report.Certificate{{Host: "www.example.com", Expires: secs(86400 * 60)}}
		without := plan(m, rs...)
		if planIngress(with, "site").Owner != "a" || planIngress(without, "site").Owner != "c" {
			t.Fatalf("owners %q and %q, want a then c", planIngress(with, "site").Owner, planIngress(without, "site").Owner)
		}
		if with.PlanID == without.PlanID || with.PlacementID == without.PlacementID {
			t.Fatalf("plan or placement ID unchanged when the ingress owner changed")
		}
	})
	t.Run("a failed or expired certificate holds nothing", func(t *testing.T) {
		repo := stepsRepo()
		repo.Nodes[2].Labels[IngressLabel] = "true"
		m := repo.model(t)
		rs := stepsReports(t, m)
		rs[0].Certificates = nil
		rendezvous := plan(m, rs...)
		for _, c := range []report.Certificate{
			{Host: "www.example.com", Error: "acme: rate limited"},
			{Host: "www.example.com", Expires: secs(-1)},
		} {
			for i := range rs {
				rs[i].Certificates = nil
			}
			// Report it on the node rendezvous hashing does not pick.
			other := 2
			if planIngress(rendezvous, "site").Owner == "c" {
				other = 0
			}
			rs[other].Certificates = []report.Certificate{c}
			got := plan(m, rs...)
			if o := planIngress(got, "site"); o.Owner != planIngress(rendezvous, "site").Owner || o.Reason == "holds the certificate" {
				t.Errorf("%+v: owner %s (%s), want %s by rendezvous", c, o.Owner, o.Reason, planIngress(rendezvous, "site").Owner)
			}
		}
	})
}

func TestLiveness(t *testing.T) {
	repo := repoDef{TTL: "60s", Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 3)}}
	m := repo.model(t)
	alive := func(p *Plan) string { return strings.Join(aliveNames(p), ",") }

	cases := []struct {
		name      string
		now       time.Time
		reports   []report.Report
		wantAlive string
		wantTime  time.Time
		warnings  map[string][]string // code → subjects
	}{
		{
			name:      "alive up to livenessTTL behind the newest report, dead past it",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", secs(-60)), reportOf("c", secs(-61))},
			wantAlive: "a,b", wantTime: secs(0),
			warnings: map[string][]string{WarnNodeDead: {"c"}},
		},
		{
			name:      "slow clocks everywhere: judged from the newest report, not the reader's clock",
			now:       secs(3000),
			reports:   []report.Report{reportOf("a", secs(-40)), reportOf("b", secs(0)), reportOf("c", secs(-20))},
			wantAlive: "a,b,c", wantTime: secs(0),
		},
		{
			name:      "a reader with a clock up to MaxClockLead slow agrees",
			now:       secs(-20),
			reports:   []report.Report{reportOf("a", secs(-40)), reportOf("b", secs(0)), reportOf("c", secs(-20))},
			wantAlive: "a,b,c", wantTime: secs(0),
		},
		{
			name:      "the cluster time runs at most MaxClockLead ahead of the reader",
			now:       secs(-3000),
			reports:   []report.Report{reportOf("a", secs(-40)), reportOf("b", secs(0)), reportOf("c", secs(-20))},
			wantAlive: "a,b,c", wantTime: secs(-2980),
		},
		{
			name:      "a report more than an hour ahead is ignored",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", t0.Add(time.Hour+time.Second)), reportOf("c", secs(-10))},
			wantAlive: "a,c", wantTime: secs(0),
			warnings: map[string][]string{WarnReportIgnored: {"b"}, WarnNodeDead: {"b"}},
		},
		{
			name:      "a report an hour ahead counts but moves the cluster time by MaxClockLead only",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", t0.Add(time.Hour)), reportOf("c", secs(-10))},
			wantAlive: "a,b,c", wantTime: secs(20),
		},
		{
			name:      "a report far ahead makes no node dead that a TTL minus the lead would not",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(-39)), reportOf("b", t0.Add(50*time.Minute)), reportOf("c", secs(-41))},
			wantAlive: "a,b", wantTime: secs(20),
			warnings: map[string][]string{WarnNodeDead: {"c"}},
		},
		{
			name:      "an ignored future report does not hide an older good one",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("b", t0.Add(5*time.Hour)), reportOf("b", secs(-5)), reportOf("c", secs(-10))},
			wantAlive: "a,b,c", wantTime: secs(0),
			warnings: map[string][]string{WarnReportIgnored: {"b"}},
		},
		{
			name:      "reports of nodes not in the inventory are ignored, with a warning",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("ghost", secs(500)), reportOf("b", secs(-1)), reportOf("c", secs(-2))},
			wantAlive: "a,b,c", wantTime: secs(0),
			warnings: map[string][]string{WarnReportIgnored: {"ghost"}},
		},
		{
			name:      "a node that never reported is dead",
			now:       t0,
			reports:   []report.Report{reportOf("a", secs(0)), reportOf("c", secs(0))},
			wantAlive: "a,c", wantTime: secs(0),
			warnings: map[string][]string{WarnNodeDead: {"b"}},
		},
		{
			name:      "no report at all: nobody is alive",
			now:       t0,
			wantAlive: "",
			warnings:  map[string][]string{WarnNodeDead: {"a", "b", "c"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Compute(Input{Model: m, Commit: commitC, Reports: tc.reports, Now: tc.now})
			if got := alive(p); got != tc.wantAlive {
				t.Errorf("alive %q, want %q", got, tc.wantAlive)
			}
			if !p.ClusterTime.Equal(tc.wantTime) {
				t.Errorf("cluster time %s, want %s", p.ClusterTime, tc.wantTime)
			}
			if p.AssumedAlive {
				t.Errorf("assumed alive without AssumeAlive")
			}
			for code, subjects := range tc.warnings {
				for _, s := range subjects {
					if warningOf(p, code, s) == nil {
						t.Errorf("no %s warning for %s: %v", code, s, p.Warnings)
					}
				}
			}
			for _, n := range p.Nodes {
				var routes []string
				for _, r := range p.RoutesFor(n.Name) {
					routes = append(routes, r.Node)
					if o := planNode(p, r.Node); !o.Alive || r.Dest != o.PodCIDR || r.Via != o.Address {
						t.Errorf("%s: route %+v does not match node %+v", n.Name, r, o)
					}
				}
				var want []string
				for _, o := range aliveNames(p) {
					if o != n.Name {
						want = append(want, o)
					}
				}
				if !slices.Equal(routes, want) {
					t.Errorf("%s routes to %v, want the other alive nodes %v", n.Name, routes, want)
				}
			}
		})
	}

	t.Run("refused commit", func(t *testing.T) {
		refuse := func(commit string) report.Report {
			r := reportOf("a", secs(0))
			r.Refused = &report.Refusal{Commit: commit, Reason: "not signed"}
			return r
		}
		for _, tc := range []struct {
			name   string
			commit string
			report report.Report
			want   bool
		}{
			{"the planned commit", commitC, refuse(commitC), true},
			{"another commit", commitC, refuse("deadbeef"), false},
			{"no refusal", commitC, reportOf("a", secs(0)), false},
			{"a working tree (no commit)", "", refuse(""), false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := Compute(Input{Model: m, Commit: tc.commit, Reports: []report.Report{tc.report}, Now: t0})
				if got := planNode(p, "a").RefusedCommit; got != tc.want {
					t.Errorf("refused %v, want %v", got, tc.want)
				}
				if got := warningOf(p, WarnRefused, "a") != nil; got != tc.want {
					t.Errorf("refused warning %v, want %v", got, tc.want)
				}
			})
		}
	})
}

func TestAssumeAlive(t *testing.T) {
	repo := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{{Service: true, Name: "web", Replicas: 4, CPU: "1", Memory: "1G"}}}
	repo.Nodes[0].CPU, repo.Nodes[0].Memory = "1", "1G"
	repo.Nodes[2].Drained = true
	m := repo.model(t)

	t.Run("no report: every node alive with its declared capacity", func(t *testing.T) {
		p := Compute(Input{Model: m, Commit: commitC, Now: t0, AssumeAlive: true})
		if !p.AssumedAlive || strings.Join(aliveNames(p), ",") != "a,b,c" {
			t.Fatalf("assumed %v, alive %v", p.AssumedAlive, aliveNames(p))
		}
		if warningOf(p, WarnNoReports, "") == nil {
			t.Errorf("no %s warning", WarnNoReports)
		}
		if a := planNode(p, "a"); a.Unlimited || a.Capacity.CPU != 1000 {
			t.Errorf("a capacity %+v, want the declared 1 CPU", a)
		}
		if b := planNode(p, "b"); !b.Unlimited {
			t.Errorf("b has no declared capacity and no report: want unlimited, got %+v", b)
		}
		if !p.ClusterTime.IsZero() {
			t.Errorf("cluster time %s without reports", p.ClusterTime)
		}
		per := map[string]int{}
		for _, pl := range p.Placements {
			per[pl.Node]++
		}
		if per["a"] != 1 || per["b"] != 3 || per["c"] != 0 {
			t.Errorf("placements per node %v, want a:1 (full) b:3 c:0 (drained)", per)
		}
	})
	t.Run("only ignored reports: still assumed", func(t *testing.T) {
		p := Compute(Input{Model: m, Commit: commitC, Now: t0, AssumeAlive: true,
			Reports: []report.Report{reportOf("ghost", secs(0)), reportOf("a", t0.Add(48*time.Hour))}})
		if !p.AssumedAlive || len(aliveNames(p)) != 3 {
			t.Fatalf("assumed %v, alive %v", p.AssumedAlive, aliveNames(p))
		}
	})
	t.Run("once a node reports, liveness is real", func(t *testing.T) {
		p := Compute(Input{Model: m, Commit: commitC, Now: t0, AssumeAlive: true, Reports: []report.Report{reportOf("b", secs(0))}})
		if p.AssumedAlive || strings.Join(aliveNames(p), ",") != "b" {
			t.Fatalf("assumed %v, alive %v", p.AssumedAlive, aliveNames(p))
		}
		if warningOf(p, WarnNoReports, "") != nil {
			t.Errorf("unexpected %s warning", WarnNoReports)
		}
	})
	t.Run("without AssumeAlive nobody is alive", func(t *testing.T) {
		p := Compute(Input{Model: m, Commit: commitC, Now: t0})
		if p.AssumedAlive || len(aliveNames(p)) != 0 || len(p.Placements) != 0 || len(p.Unschedulable) != 4 {
			t.Fatalf("assumed %v, alive %v, %d placed", p.AssumedAlive, aliveNames(p), len(p.Placements))
		}
	})
	t.Run("an empty inventory", func(t *testing.T) {
		m := repoDef{Workloads: []workloadDef{svc("web", 1)}}.model(t)
		p := Compute(Input{Model: m, Commit: commitC, Now: t0, AssumeAlive: true})
		if warningOf(p, WarnNoReports, "") != nil || len(p.Placements) != 0 || unschedulableOf(p, "web-0") == nil {
			t.Fatalf("plan %+v", p)
		}
	})
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
