// Package statustest builds the fixture clusters that the tests of keel
// status and keel dashboard read: one small cluster (three nodes, a web
// Service, a stateful db, an HTTPS Ingress) in the states an operator
// meets, each a status.Snapshot as status.Read would return it.
package statustest

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
)

// Now is the time every fixture is read at.
var Now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// The commits of the fixtures' branch, newest first.
var (
	Tip  = status.Commit{Hash: "3f2a9c1e04b7d5a8e6f1c2b3a4d5e6f708192a3b", Subject: "web: LOG_LEVEL=debug", Author: "Alice", Time: Now.Add(-5 * time.Minute)}
	Prev = status.Commit{Hash: "9b1d44e0a2c3f5d6e7a8b9c0d1e2f3a4b5c6d7e8", Subject: "db: 2G of memory", Author: "Bob", Time: Now.Add(-3 * time.Hour)}
	Old  = status.Commit{Hash: "1e77c0d2b5a9e8f7d6c5b4a3f2e1d0c9b8a7f6e5", Subject: "first cluster", Author: "Alice", Time: Now.Add(-48 * time.Hour)}
)

// Specs are the cluster repository at Tip.
var Specs = fstest.MapFS{
	"cluster.yaml": file(`apiVersion: keel/v1
kind: Cluster
metadata: {name: fixture}
spec:
  livenessTTL: 30s
  reportInterval: 10s
`),
	"nodes/n1.yaml": file(node("n1", "192.0.2.11")),
	"nodes/n2.yaml": file(node("n2", "192.0.2.12")),
	"nodes/n3.yaml": file(node("n3", "192.0.2.13")),
	"apps/web.yaml": file(`apiVersion: keel/v1
kind: Service
metadata: {name: web}
spec:
  replicas: 3
  port: 8080
  template:
    image: base/14.2-web
    command: ["/usr/local/bin/web"]
    env: {LOG_LEVEL: debug}
    resources: {cpu: 500m, memory: 256M}
`),
	"apps/db.yaml": file(`apiVersion: keel/v1
kind: Service
metadata: {name: db}
spec:
  replicas: 1
  port: 5432
  template:
    image: base/14.2-postgres
    command: ["/usr/local/bin/postgres"]
    resources: {cpu: "1", memory: 2G}
    volumes:
      - {name: data, mountPath: /var/db/postgres}
`),
	"ingress/web.yaml": file(`apiVersion: keel/v1
kind: Ingress
metadata: {name: web}
spec:
  host: www.example.test
  tls: {email: ops@example.test}
  backend: {service: web, port: 8080}
`),
}

// bigJob is added by the unschedulable fixture: no node has 64 CPUs.
const bigJob = `apiVersion: keel/v1
kind: Jail
metadata: {name: batch}
spec:
  image: base/14.2
  command: ["/usr/local/bin/batch"]
  resources: {cpu: "64", memory: 1G}
`

func node(name, addr string) string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Node
metadata: {name: %s}
spec:
  address: %s
  capacity: {cpu: "4", memory: 8G}
`, name, addr)
}

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// Names lists the fixtures.
func Names() []string {
	return []string{"converged", "dead-node", "old-commit", "refused", "unschedulable", "crashloop", "expiring-cert"}
}

// Snapshot returns the fixture name, and the time to read it at.
func Snapshot(tb testing.TB, name string) (*status.Snapshot, time.Time) {
	tb.Helper()
	specs := Specs
	if name == "unschedulable" {
		specs = maps.Clone(Specs)
		specs["jails/batch.yaml"] = file(bigJob)
	}
	m, err := render.Render(specs)
	if err != nil {
		tb.Fatalf("fixture %s: %v", name, err)
	}
	snap := &status.Snapshot{Branch: "main", Tip: Tip, Tree: &status.Side{Commit: Tip.Hash, Model: m}, History: []status.Commit{Tip, Prev, Old}}
	snap.Reports = Converged(m, Tip.Hash, Now)
	at := func(n string) *report.Report {
		i := slices.IndexFunc(snap.Reports, func(r report.Report) bool { return r.Node == n })
		return &snap.Reports[i]
	}
	switch name {
	case "converged", "unschedulable":
	case "dead-node":
		// n3 stopped reporting 2 minutes ago (livenessTTL 30s).
		r := at("n3")
		r.Time, r.Clock = Now.Add(-2*time.Minute), Now.Add(-2*time.Minute)
	case "old-commit":
		at("n2").Commit = Prev.Hash
	case "refused":
		r := at("n2")
		r.Commit = Prev.Hash
		r.Refused = &report.Refusal{Commit: Tip.Hash, Reason: "minAgentVersion is 9.9.9 and this agent is 0.1.0: upgrade keel on this node"}
	case "crashloop":
		for i := range snap.Reports {
			for j := range snap.Reports[i].Instances {
				ri := &snap.Reports[i].Instances[j]
				if ri.Name == "web-1" {
					ri.State, ri.Restarts, ri.Error = report.StateCrashLoop, 7, "exited with status 1: listen tcp :8080: address already in use"
				}
			}
		}
	case "expiring-cert":
		for i := range snap.Reports {
			for j := range snap.Reports[i].Certificates {
				snap.Reports[i].Certificates[j].Expires = Now.Add(5*24*time.Hour + 3*time.Hour)
			}
		}
	default:
		tb.Fatalf("no fixture %q", name)
	}
	// The planner's reports follow: plan IDs as the nodes would have them.
	Agree(m, snap.Reports, Tip.Hash, Now)
	return snap, Now
}

// Converged returns the reports of m's nodes, written 4 s before now,
// when every instance runs where the plan puts it, at commit, each node
// serving every Ingress host with a certificate valid for 60 days.
func Converged(m *render.Model, commit string, now time.Time) []report.Report {
	var reports []report.Report
	for _, n := range m.Nodes {
		reports = append(reports, report.Report{APIVersion: "keel/v1", Kind: report.Kind, Node: n.Name, Time: now.Add(-4 * time.Second),
			Clock: now.Add(-4 * time.Second), Since: now.Add(-time.Hour), AgentVersion: "0.1.0", Commit: commit,
			Capacity: report.Capacity{CPU: 4000, Memory: 8 << 30}, Instances: []report.Instance{}, Volumes: []report.Volume{}, Certificates: []report.Certificate{}})
	}
	// Twice: the second plan sees the instances the first placed running.
	for range 2 {
		plan := planner.Compute(planner.Input{Model: m, Commit: commit, Reports: reports, Now: now})
		for i := range reports {
			r := &reports[i]
			r.Instances, r.Volumes, r.Certificates = []report.Instance{}, []report.Volume{}, []report.Certificate{}
			for _, pl := range plan.Placements {
				if pl.Node != r.Node {
					continue
				}
				inst := m.Instance(pl.Instance)
				r.Instances = append(r.Instances, report.Instance{Name: pl.Instance, State: report.StateRunning, Address: pl.Address, SpecHash: inst.SpecHash, Generation: pl.Generation})
				for _, v := range inst.Spec.Volumes {
					r.Volumes = append(r.Volumes, report.Volume{Name: v.Name})
				}
			}
			for _, in := range plan.Ingresses {
				r.Certificates = append(r.Certificates, report.Certificate{Host: in.Host, Expires: now.Add(60 * 24 * time.Hour), Serial: "5eed", Issuer: "Fixture CA"})
			}
		}
	}
	Agree(m, reports, commit, now)
	return reports
}

// Agree sets every report's plan ID to the plan the reports give.
func Agree(m *render.Model, reports []report.Report, commit string, now time.Time) {
	plan := planner.Compute(planner.Input{Model: m, Commit: commit, Reports: reports, Now: now})
	for i := range reports {
		reports[i].PlanID = plan.PlanID
	}
}
