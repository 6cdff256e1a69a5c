package planner

import (
	"slices"
	"testing"
	"time"

	"github.com/keel-dev/keel/report"
)

// Issue 8 item 3: a stateful instance whose pin moved while the old node's
// agent is down (its last report says the instance runs) is placed on the
// new node, but that node must wait for the old one: the placement names it
// in WaitsFor, however old its report, and so for any report that lists
// the instance not stopped (a node outside the inventory, a report dated
// far ahead).
func TestBreakBeforeMakeWaitsForEveryReport(t *testing.T) {
	repo := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{
		{Name: "db", Volumes: []string{"db-data"}}, svc("web", 2),
	}, Pins: map[string]string{"db": "b"}}
	m := repo.model(t)
	dbOn := func(node string, at time.Time, st report.State) report.Report {
		return withVolumes(reportOf(node, at, seen("db", st, "", hashOf(t, m, "db"))), "db-data")
	}
	cases := []struct {
		name    string
		reports []report.Report
		want    []string
	}{
		{"old node dead for a day, last report running",
			[]report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), dbOn("c", secs(-86400), report.StateRunning)}, []string{"c"}},
		{"old node alive and running it",
			[]report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), dbOn("c", secs(-1), report.StateRunning)}, []string{"c"}},
		{"crashloop and failed count as not stopped",
			[]report.Report{dbOn("a", secs(0), report.StateFailed), reportOf("b", secs(0)), dbOn("c", secs(-100), report.StateCrashLoop)}, []string{"a", "c"}},
		{"a node outside the inventory",
			[]report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), dbOn("gone", secs(-5000), report.StateStarting)}, []string{"gone"}},
		{"a report dated far ahead",
			[]report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), dbOn("c", secs(7200), report.StateRunning)}, []string{"c"}},
		{"stopped on the old node: nothing to wait for",
			[]report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), dbOn("c", secs(-86400), report.StateStopped)}, nil},
		{"a newer report of the old node without it clears the wait",
			[]report.Report{reportOf("a", secs(0)), reportOf("b", secs(0)), dbOn("c", secs(-86400), report.StateRunning), reportOf("c", secs(-2))}, nil},
		{"the new node's own report does not count",
			[]report.Report{reportOf("a", secs(0)), dbOn("b", secs(0), report.StateCrashLoop), reportOf("c", secs(0))}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, order := range [][]report.Report{tc.reports, reversed(tc.reports)} {
				p := Compute(Input{Model: m, Commit: commitC, Reports: order, Now: t0})
				pl := placementOf(p, "db")
				if pl == nil || pl.Node != "b" || pl.Reason != ReasonPinned {
					t.Fatalf("db placed %+v, want pinned to b", pl)
				}
				if !slices.Equal(pl.WaitsFor, tc.want) {
					t.Fatalf("db waits for %v, want %v", pl.WaitsFor, tc.want)
				}
				for _, name := range []string{"web-0", "web-1"} {
					if w := placementOf(p, name); w != nil && len(w.WaitsFor) > 0 {
						t.Fatalf("stateless %s waits for %v", name, w.WaitsFor)
					}
				}
			}
		})
	}
}

func reversed[T any](s []T) []T {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// Issue 8 item 4: one report moves the cluster clock by MaxClockLead at
// most, and only if the planner accepts it.
func TestPeerClock(t *testing.T) {
	m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 3)}}.model(t)
	lead := MaxClockLead(m) // 10 s for the default TTL of 30 s
	if lead != 10*time.Second {
		t.Fatalf("MaxClockLead %s, want a third of the TTL", lead)
	}
	withClock := func(r report.Report, c time.Time) report.Report { r.Clock = c; return r }
	cases := []struct {
		name    string
		reports []report.Report
		want    time.Time
	}{
		{"no report: the local clock", nil, t0},
		{"a peer behind: the local clock", []report.Report{reportOf("a", secs(-5))}, t0},
		{"a peer ahead within the lead is followed", []report.Report{reportOf("a", secs(7))}, secs(7)},
		{"exactly the lead", []report.Report{reportOf("a", secs(10))}, secs(10)},
		{"a ghost 58 minutes ahead is not", []report.Report{reportOf("a", secs(3)), reportOf("ghost", secs(58*60))}, secs(3)},
		{"a ghost a second ahead is not either", []report.Report{reportOf("ghost", secs(1))}, t0},
		{"an inventory node 58 minutes ahead is not", []report.Report{reportOf("b", secs(58*60)), reportOf("c", secs(2))}, secs(2)},
		{"just past the lead is not", []report.Report{reportOf("b", secs(10).Add(time.Millisecond))}, t0},
		{"the sender's clock counts, not its report time",
			[]report.Report{withClock(reportOf("b", secs(9)), secs(1))}, secs(1)},
		{"a lying sender clock is refused like a lying time",
			[]report.Report{withClock(reportOf("b", secs(0)), secs(3600))}, t0},
		{"equal times", []report.Report{reportOf("a", secs(4)), reportOf("b", secs(4)), reportOf("c", secs(4))}, secs(4)},
		{"far past", []report.Report{reportOf("a", time.Unix(0, 0).UTC())}, t0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := PeerClock(m, tc.reports, t0); !got.Equal(tc.want) {
				t.Fatalf("PeerClock %s, want %s", got, tc.want)
			}
		})
	}
	t.Run("drops back as soon as the leading report goes", func(t *testing.T) {
		rs := []report.Report{reportOf("a", secs(1)), reportOf("b", secs(9))}
		if got := PeerClock(m, rs, t0); !got.Equal(secs(9)) {
			t.Fatalf("PeerClock %s", got)
		}
		if got := PeerClock(m, rs[:1], t0); !got.Equal(secs(1)) {
			t.Fatalf("PeerClock %s after b's report went, want a's", got)
		}
	})
	t.Run("Accepts says why", func(t *testing.T) {
		g := reportOf("ghost", t0)
		if err := Accepts(m, &g, t0); err == nil {
			t.Fatal("a ghost's report accepted")
		}
		a := reportOf("a", secs(11))
		if err := Accepts(m, &a, t0); err == nil {
			t.Fatal("a report past the lead accepted")
		}
		a.Time = secs(-1000)
		if err := Accepts(m, &a, t0); err != nil {
			t.Fatalf("an old report of an inventory node refused: %v", err)
		}
	})
}

// Issue 8 item 4, as the planner sees it: an inventory node's report dated
// 58 minutes ahead neither makes the others dead nor moves their work.
func TestLyingClockMovesNothing(t *testing.T) {
	m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 3)}}.model(t)
	base := plan(m, reportOf("a", secs(0)), reportOf("b", secs(0)), reportOf("c", secs(0)))
	var reports []report.Report
	for _, pl := range base.Placements {
		i := seen(pl.Instance, report.StateRunning, pl.Address.String(), hashOf(t, m, pl.Instance))
		reports = append(reports, reportOf(pl.Node, secs(-2), i))
	}
	honest := Compute(Input{Model: m, Commit: commitC, Reports: reports, Now: t0})
	for _, liar := range []report.Report{reportOf("ghost", secs(58*60)), reportOf("c", secs(58*60))} {
		rs := append(slices.Clone(reports), liar)
		if liar.Node == "c" {
			// c's lying report is its newest, and it keeps its instances.
			for _, r := range reports {
				if r.Node == "c" {
					liar.Instances = r.Instances
				}
			}
			rs = append(slices.Clone(reports), liar)
		}
		p := Compute(Input{Model: m, Commit: commitC, Reports: rs, Now: t0})
		if got := aliveNames(p); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("%s's report dated +58 min: alive %v", liar.Node, got)
		}
		if p.ClusterTime.After(t0.Add(MaxClockLead(m))) {
			t.Fatalf("cluster time %s, more than MaxClockLead ahead of %s", p.ClusterTime, t0)
		}
		for _, pl := range honest.Placements {
			if got := placementOf(p, pl.Instance); got == nil || got.Node != pl.Node {
				t.Fatalf("%s moved from %s to %+v", pl.Instance, pl.Node, got)
			}
		}
	}
}

// Issue 8 item 8: an instance moves once per death and never back. Its
// node b is judged dead, the copy started on another node gets the next
// generation; when b returns still running its old copy, the newer copy
// keeps the instance, whichever rendezvous hash is higher.
func TestNeverMovesBack(t *testing.T) {
	m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 1)}}.model(t)
	h := hashOf(t, m, "web-0")
	for _, first := range []string{"a", "b", "c"} {
		t.Run("first on "+first, func(t *testing.T) {
			at := func(n string) report.Report { return reportOf(n, secs(0)) }
			running := func(n string, gen int, when time.Time) report.Report {
				i := seen("web-0", report.StateRunning, "", h)
				i.Generation = gen
				return reportOf(n, when, i)
			}
			var rs []report.Report
			for _, n := range []string{"a", "b", "c"} {
				if n == first {
					rs = append(rs, running(n, 1, secs(0)))
				} else {
					rs = append(rs, at(n))
				}
			}
			p := plan(m, rs...)
			if pl := placementOf(p, "web-0"); pl.Node != first || pl.Generation != 1 {
				t.Fatalf("placed %+v, want sticky on %s, generation 1", pl, first)
			}
			// first dies: the instance goes elsewhere, one generation on.
			for i := range rs {
				if rs[i].Node == first {
					rs[i].Time = secs(-31)
				}
			}
			p = plan(m, rs...)
			moved := placementOf(p, "web-0")
			if moved.Node == first || moved.Generation != 2 || moved.Reason != ReasonNew {
				t.Fatalf("after %s died: %+v", first, moved)
			}
			// The new copy runs; first comes back, still running its old one.
			var back []report.Report
			for _, n := range []string{"a", "b", "c"} {
				switch n {
				case first:
					back = append(back, running(n, 1, secs(1)))
				case moved.Node:
					back = append(back, running(n, 2, secs(1)))
				default:
					back = append(back, reportOf(n, secs(1)))
				}
			}
			for _, rs := range [][]report.Report{back, reversed(back)} {
				p = plan(m, rs...)
				if pl := placementOf(p, "web-0"); pl.Node != moved.Node || pl.Generation != 2 {
					t.Fatalf("after %s came back: %+v, want it to stay on %s", first, pl, moved.Node)
				}
			}
		})
	}
}

// TestUnreportedCopyDoesNotWinBack: a node dies right after starting an
// instance, before any of its reports says so; another node starts it as
// new, at the same generation. When the first node comes back (settling,
// its run of reports broken) reporting its copy, the settled node's copy
// keeps the instance, whatever the rendezvous hash says: nothing moves
// back. (Seen under a CPU hog: the returning node won the tie on the hash.)
func TestUnreportedCopyDoesNotWinBack(t *testing.T) {
	m := repoDef{Nodes: tableNodes("a", "b", "c"), Workloads: []workloadDef{svc("web", 1)}}.model(t)
	h := hashOf(t, m, "web-0")
	settled := func(r report.Report) report.Report { r.Since = r.Time.Add(-10 * time.Minute); return r }
	for _, first := range []string{"a", "b", "c"} {
		t.Run("first on "+first, func(t *testing.T) {
			// first's last report (now old: dead) does not list web-0.
			var rs []report.Report
			for _, n := range []string{"a", "b", "c"} {
				when := secs(0)
				if n == first {
					when = secs(-31)
				}
				rs = append(rs, settled(reportOf(n, when)))
			}
			p := plan(m, rs...)
			taken := placementOf(p, "web-0")
			if taken.Node == first || taken.Generation != 1 {
				t.Fatalf("with %s dead and silent: %+v, want another node, generation 1", first, taken)
			}
			var back []report.Report
			for _, n := range []string{"a", "b", "c"} {
				i := seen("web-0", report.StateRunning, "", h)
				i.Generation = 1
				switch n {
				case first:
					r := reportOf(n, secs(1), i)
					r.Since = secs(1) // its run starts again: settling
					back = append(back, r)
				case taken.Node:
					back = append(back, settled(reportOf(n, secs(1), i)))
				default:
					back = append(back, settled(reportOf(n, secs(1))))
				}
			}
			for _, rs := range [][]report.Report{back, reversed(back)} {
				p = plan(m, rs...)
				if pl := placementOf(p, "web-0"); pl.Node != taken.Node {
					t.Fatalf("after %s came back with its unreported copy: %+v, want it to stay on %s", first, pl, taken.Node)
				}
			}
		})
	}
}
