package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/acme"
	"github.com/keel-dev/keel/providers/providertest"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// failingCA never issues: the tests below never let it be asked.
type failingCA struct{}

func (failingCA) Obtain(context.Context, string, string, acme.Solver) (*providers.Bundle, error) {
	return nil, errors.New("the test CA issues nothing")
}

func testIngressState(t *testing.T) *ingressState {
	t.Helper()
	m, err := acme.NewManager(acme.ManagerOptions{Issuer: failingCA{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	st := &ingressState{node: "n1", log: slog.New(slog.DiscardHandler), certs: newCertStore(), acme: m,
		pub: newCertPublisher(Options{Node: "n1", Now: time.Now, Logger: slog.New(slog.DiscardHandler)}, slog.New(slog.DiscardHandler))}
	t.Cleanup(st.pub.close)
	return st
}

// Issue 10: the report lists each host a node serves with tls: with its
// certificate when it has one, else with why handshakes fail, so that a
// host without a certificate is visible in status.
func TestIngressReportListsHostsWithoutCertificate(t *testing.T) {
	st := testIngressState(t)
	exp := time.Now().Add(60 * 24 * time.Hour).UTC().Truncate(time.Second)
	b := providertest.SelfSigned(t, "a.example.com", exp.Add(-90*24*time.Hour), exp)
	if err := st.certs.Put(b); err != nil {
		t.Fatal(err)
	}
	st.tlsServed = []string{"a.example.com", "b.example.com"}
	got := st.report()
	want := []report.Certificate{
		{Host: "a.example.com", Expires: exp, Serial: b.Serial},
		{Host: "b.example.com", Error: noCertificate},
	}
	if len(got) != 2 || got[0].Host != want[0].Host || !got[0].Expires.Equal(exp) || got[0].Serial != b.Serial || got[0].Error != "" || got[1] != want[1] {
		t.Fatalf("report %+v, want %+v", got, want)
	}
	r := report.Report{Node: "n1", Time: time.Now(), Certificates: got}
	if _, err := report.Parse(r.Marshal(), "n1"); err != nil {
		t.Fatalf("the report does not read back: %v", err)
	}
}

// Issue 10: routes go to the backend Service's endpoints at the backend
// port; an Ingress without tls is served over plain HTTP.
func TestIngressRoutes(t *testing.T) {
	m := &render.Model{
		Services: []render.Service{{Name: "web", Port: 8080}},
		Ingresses: []render.Ingress{
			{Name: "www", Host: "www.example.com", Path: "/", Backend: render.Backend{Service: "web", Port: 9090}, TLS: &render.TLS{Email: "a@example.com"}},
			{Name: "plain", Host: "plain.example.com", Path: "/api", Backend: render.Backend{Service: "web"}},
		},
	}
	a1, a2 := netip.MustParseAddr("10.200.1.5"), netip.MustParseAddr("10.200.2.5")
	plan := &planner.Plan{Services: []planner.Service{{Name: "web", Port: 8080, Endpoints: []planner.Endpoint{{Address: a1}, {Address: a2}}}}}
	got := ingressRoutes(m, plan)
	if len(got) != 2 {
		t.Fatalf("routes %+v", got)
	}
	if got[0].Host != "www.example.com" || got[0].Insecure || !slices.Equal(got[0].Endpoints, []netip.AddrPort{netip.AddrPortFrom(a1, 9090), netip.AddrPortFrom(a2, 9090)}) {
		t.Errorf("tls route %+v", got[0])
	}
	if got[1].Path != "/api" || !got[1].Insecure || got[1].Endpoints[0].Port() != 8080 {
		t.Errorf("plain route %+v", got[1])
	}
}
