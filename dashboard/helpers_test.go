package dashboard

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
)

// hostile is what a report or a commit may carry to attack a viewer.
const (
	hostileScript = `<script>alert(1)</script>`
	hostileImg    = `<img src=x onerror=alert(1)>`
)

var (
	testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tipHash = "0123456789abcdef0123456789abcdef01234567"
	oldHash = "89abcdef0123456789abcdef0123456789abcdef"
)

// handStatus is a status built by hand, with HTML in every field a report
// or a commit fills: a commit subject, an instance's error, a problem, a
// refusal, a certificate error, a warning.
func handStatus() *status.Status {
	age := func(d time.Duration) (*time.Time, *int64) {
		t := testNow.Add(-d)
		s := int64(d / time.Second)
		return &t, &s
	}
	capacity := status.Resources{CPUMillicores: 4000, MemoryBytes: 8 << 30}
	n1t, n1a := age(3 * time.Second)
	n3t, n3a := age(95 * time.Second)
	n1 := &report.Report{APIVersion: render.APIVersion, Kind: report.Kind, Node: "n1", Time: *n1t, Commit: tipHash, PlanID: "p1",
		AgentVersion: "0.1.0",
		Instances: []report.Instance{
			{Name: "web-0", State: report.StateRunning, Address: netip.MustParseAddr("10.0.0.2"), SpecHash: "aaaaaaaaaaaaaaaa"},
			{Name: "api-0", State: report.StateCrashLoop, Address: netip.MustParseAddr("10.0.0.3"), SpecHash: "bbbbbbbbbbbbbbbb", Restarts: 7, Error: "exited 1: " + hostileScript},
		},
		Volumes:      []report.Volume{{Name: "data"}},
		Certificates: []report.Certificate{{Host: "www.example.com", Expires: testNow.Add(60 * 24 * time.Hour), Issuer: "Pebble", Error: "renewal: " + hostileImg}},
		Problems:     []report.Problem{{Check: report.CheckPF, Problem: "pf is off " + hostileScript, Fix: "service pf start"}},
	}
	return &status.Status{
		SchemaVersion: status.SchemaVersion, Time: testNow, Cluster: "demo", Branch: "main",
		Tip:   status.Commit{Hash: tipHash, Subject: "scale web " + hostileImg, Author: "Ann " + hostileScript, Time: testNow.Add(-2 * time.Minute)},
		Valid: true, Errors: []string{},
		Headline: "not converged at " + tipHash[:12] + ": node n3 is dead: its last report is 1m35s old (liveness TTL 30s) (and 1 more)",
		Missing: []string{"node n3 is dead: its last report is 1m35s old (liveness TTL 30s)",
			"instance api-0 on n1: crash-looping (7 restarts): exited 1: " + hostileScript},
		PlanID: "p1",
		Counts: status.Counts{Nodes: 3, NodesAlive: 2, NodesAtTip: 2, Instances: 4, Running: 3, Services: 1, ServicesReady: 1},
		Nodes: []status.Node{
			{Name: "n1", State: status.NodeAlive, ReportTime: n1t, ReportAge: n1a, AgentVersion: "0.1.0", Commit: tipHash, AtTip: true, PlanID: "p1", PlanAgrees: true,
				Assigned: 2, Running: 1, Committed: status.Resources{CPUMillicores: 200, MemoryBytes: 128 << 20}, Capacity: &capacity,
				Problems: n1.Problems, Errors: []string{"api-0: exited 1: " + hostileScript}, Report: n1},
			{Name: "n2", State: status.NodeAlive, ReportTime: n1t, ReportAge: n1a, Commit: tipHash, AtTip: true, PlanID: "p1", PlanAgrees: true,
				Assigned: 1, Running: 1, Problems: []report.Problem{}, Errors: []string{},
				Refused: &report.Refusal{Commit: oldHash, Reason: "unsigned " + hostileImg}},
			{Name: "n3", State: status.NodeDead, ReportTime: n3t, ReportAge: n3a, Commit: oldHash, PlanID: "p0",
				Assigned: 1, Running: 1, Problems: []report.Problem{}, Errors: []string{}},
		},
		Services: []status.Service{{Name: "web", VIP: "10.1.0.1", Port: 8080, Replicas: 2, Ready: 2, Updated: 2, Endpoints: []string{"10.0.0.2:8080", "10.0.0.4:8080"}}},
		Attention: []status.Instance{{Name: "api-0", Service: "api", Node: "n1", Action: "failing", State: report.StateCrashLoop, Restarts: 7,
			Error: "exited 1: " + hostileScript, Reason: "crash-looping"}},
		Ingresses: []status.Ingress{{Host: "www.example.com", Paths: []string{"/"}, Services: []string{"web"}, TLS: true, Owner: "n1",
			Serving: []string{"n1"}, Error: "renewal: " + hostileImg}},
		Volumes: []status.Volume{{Name: "data", Node: "n1", User: "db-0"}},
		History: []status.History{
			{Commit: status.Commit{Hash: tipHash, Subject: "scale web " + hostileImg, Author: "Ann", Time: testNow.Add(-2 * time.Minute)}, Applied: 2, Nodes: 3, Refused: []string{}},
			{Commit: status.Commit{Hash: oldHash, Subject: "first", Author: "Bob", Time: testNow.Add(-time.Hour)}, Applied: 3, Nodes: 3, Refused: []string{"n2"}},
		},
		Warnings: []planner.Warning{{Code: "certificate-expiring", Subject: "www.example.com", Message: "expires soon " + hostileScript}},
	}
}

// fixed is a Source that always returns st.
func fixed(st *status.Status) Source {
	return func(context.Context) (*status.Status, error) { return st, nil }
}

// newTest starts a Dashboard over opts, waits for its first read, and
// closes it at the end of the test.
func newTest(t *testing.T, opts Options) *Dashboard {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	if opts.Now == nil {
		opts.Now = func() time.Time { return testNow }
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	select {
	case <-d.Loaded():
	case <-time.After(30 * time.Second):
		t.Fatal("the first read did not end")
	}
	return d
}

// get serves one request and returns the response and its body.
func get(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	res := rec.Result()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}
