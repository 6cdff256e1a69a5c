package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

func newSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDrainAcksOverTheRing: a node asked by a drain answers with its
// newest report, signed, and again at each change of its content while
// the ask holds; the asker keeps each node's newest report that passes the
// checks of a report read from git, and is woken for the nodes it waits for.
func TestDrainAcksOverTheRing(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := []string{"127.0.1.1", "127.0.1.2"}
	port := freeRingPort(t, addrs...)
	s1, s2 := newSigner(t), newSigner(t)
	files := fstest.MapFS{"cluster.yaml": &fstest.MapFile{Data: fmt.Appendf(nil,
		"apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {gossip: {port: %d}}\n", port)}}
	for i, s := range []ssh.Signer{s1, s2} {
		files[fmt.Sprintf("nodes/n%d.yaml", i+1)] = &fstest.MapFile{Data: fmt.Appendf(nil,
			"apiVersion: keel/v1\nkind: Node\nmetadata: {name: n%d}\nspec: {address: %s, reportKey: %q}\n",
			i+1, addrs[i], strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))))}
	}
	m, err := render.Render(files)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sync.ReportKeysOf(m)
	if err != nil {
		t.Fatal(err)
	}
	fast := gossip.Timing{ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond, SuspicionMult: 2,
		GossipInterval: 50 * time.Millisecond, PushPullInterval: time.Second}
	log := slog.New(slog.DiscardHandler)
	type node struct {
		k       *ringKeeper
		d       *drainAcks
		metrics *Metrics
	}
	start := func(name string, signer ssh.Signer) node {
		metrics := NewMetrics(prometheus.NewRegistry())
		k := newRingKeeper(Options{Node: name, Now: time.Now, GossipKeyFile: keyFile, GossipTiming: fast}, log, metrics)
		k.apply(m, false)
		d := newDrainAcks(signer, k, log, metrics)
		d.setKeys(keys, m)
		t.Cleanup(func() { d.close(); k.close() })
		return node{k, d, metrics}
	}
	n1, n2 := start("n1", s1), start("n2", s2)
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, _ := n1.k.view(0)
		if g != nil && g.Members["n2"].Alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n2 never alive in n1's ring: %+v", g)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	listing := reportAt("n2", t0)
	listing.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{"10.200.0.5:8080"}}}
	n2.d.offer(listing, report.ContentDigest(listing))

	waitAck := func(what string, ok func(report.Report) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			select {
			case <-n1.d.arrived:
			case <-time.After(20 * time.Millisecond):
			}
			if acks := n1.d.acks(); len(acks) == 1 && ok(acks[0]) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never came; acks %+v", what, n1.d.acks())
			}
		}
	}
	n1.d.ask([]string{"n2"})
	waitAck("n2's answer", func(r report.Report) bool { return r.Node == "n2" && len(r.Services) == 1 && r.Time.Equal(t0) })
	// Its proxies drop the address: pushed to n1 without another ask.
	dropped := reportAt("n2", t0.Add(time.Second))
	dropped.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{}}}
	n2.d.offer(dropped, report.ContentDigest(dropped))
	waitAck("n2's change", func(r report.Report) bool { return len(r.Services) == 1 && len(r.Services[0].Endpoints) == 0 })
	// The counters move once the sends return, maybe after the receiver
	// has the message.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		asked := testutil.ToFloat64(n1.metrics.DrainAcks.WithLabelValues("asked"))
		answered := testutil.ToFloat64(n2.metrics.DrainAcks.WithLabelValues("answered"))
		if asked == 1 && answered == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1 asked %v times, n2 answered %v times: want 1 and 2", asked, answered)
		}
	}
	// Asked again within askEvery: not asked (the ask's time stays).
	n1.d.mu.Lock()
	askedAt := n1.d.asked["n2"]
	n1.d.mu.Unlock()
	n1.d.ask([]string{"n2"})
	n1.d.mu.Lock()
	again := n1.d.asked["n2"]
	n1.d.mu.Unlock()
	if !again.Equal(askedAt) {
		t.Errorf("asked again within %v", askEvery)
	}
	// The same content dated later (an answer to a repeated ask) is taken
	// but wakes no pass; a change does.
	for len(n1.d.arrived) > 0 {
		<-n1.d.arrived
	}
	same := dropped
	same.Time = dropped.Time.Add(time.Second)
	n1.d.take(gossip.Message{From: "n2", Kind: ackKind, Body: encodeSigned(t, same, s2)})
	if len(n1.d.arrived) != 0 {
		t.Error("the same content dated later woke the loop")
	}
	changed := same
	changed.Time, changed.Services = same.Time.Add(time.Second), nil
	n1.d.take(gossip.Message{From: "n2", Kind: ackKind, Body: encodeSigned(t, changed, s2)})
	if len(n1.d.arrived) != 1 {
		t.Error("a change from a node waited for did not wake the loop")
	}
	dropped = changed
	// git's copy of a content the ring brought, the newest or one it
	// replaced since, is no news (the fetch leaves it out) once a plan
	// counted the ring's (its limit); another is.
	if n1.d.has("n2", report.ContentDigest(changed)) {
		t.Error("no plan counted the ring's report yet: git's copy is no news")
	}
	n1.d.setLimit(changed.Time)
	for _, r := range []report.Report{listing, same, changed} {
		if !n1.d.has("n2", report.ContentDigest(r)) {
			t.Errorf("the content of the report of %s, received over the ring, is news", r.Time)
		}
	}
	other := reportAt("n2", t0)
	other.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{"10.200.0.6:8080"}}}
	if n1.d.has("n2", report.ContentDigest(other)) || n1.d.has("n3", report.ContentDigest(changed)) {
		t.Error("a content never received over the ring is not news")
	}
	// The replaced contents are kept pastDigests deep, each for ackCover.
	n1.d.mu.Lock()
	for i := range 2 * pastDigests {
		n1.d.past["n2"] = append(n1.d.past["n2"], replaced{fmt.Sprint(i), time.Now()})
	}
	n1.d.mu.Unlock()
	bumped := changed
	bumped.Time = changed.Time.Add(time.Second)
	bumped.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{"10.200.0.7:8080"}}}
	n1.d.setLimit(bumped.Time)
	n1.d.take(gossip.Message{From: "n2", Kind: ackKind, Body: encodeSigned(t, bumped, s2)})
	n1.d.mu.Lock()
	kept := len(n1.d.past["n2"])
	n1.d.mu.Unlock()
	if kept != pastDigests || !n1.d.has("n2", report.ContentDigest(changed)) {
		t.Errorf("%d replaced contents kept, want %d with the newest replaced among them", kept, pastDigests)
	}
	n1.d.mu.Lock()
	for i := range n1.d.past["n2"] {
		n1.d.past["n2"][i].at = time.Now().Add(-ackCover - time.Second)
	}
	n1.d.mu.Unlock()
	if n1.d.has("n2", report.ContentDigest(changed)) || !n1.d.has("n2", report.ContentDigest(bumped)) {
		t.Error("a content replaced longer ago than ackCover is still no news, or the newest is news")
	}
	dropped = bumped

	// What fails the checks is refused, and an older report never
	// replaces a newer one.
	signed := func(r report.Report, s ssh.Signer) []byte { return encodeSigned(t, r, s) }
	later := reportAt("n2", t0.Add(time.Hour))
	for name, msg := range map[string]gossip.Message{
		"signed by another node's key": {From: "n2", Kind: ackKind, Body: signed(later, s1)},
		"unsigned":                     {From: "n2", Kind: ackKind, Body: signed(later, nil)},
		"naming another node":          {From: "n2", Kind: ackKind, Body: signed(reportAt("n1", t0.Add(time.Hour)), s2)},
		"from outside the inventory":   {From: "n9", Kind: ackKind, Body: signed(reportAt("n9", t0.Add(time.Hour)), s2)},
		"without a signature length":   {From: "n2", Kind: ackKind, Body: []byte("garbage")},
		"with a length past its end":   {From: "n2", Kind: ackKind, Body: []byte("99\nshort")},
	} {
		before := testutil.ToFloat64(n1.metrics.DrainAcks.WithLabelValues("rejected"))
		n1.d.take(msg)
		if got := testutil.ToFloat64(n1.metrics.DrainAcks.WithLabelValues("rejected")); got != before+1 {
			t.Errorf("an ack %s was not refused", name)
		}
	}
	n1.d.take(gossip.Message{From: "n2", Kind: ackKind, Body: signed(reportAt("n2", t0.Add(-time.Hour)), s2)})
	if acks := n1.d.acks(); len(acks) != 1 || !acks[0].Time.Equal(dropped.Time) {
		t.Errorf("an older report replaced the newest: %+v", acks)
	}
	// Not asked for (or asked longer ago than subscribeFor): refused.
	n1.d.mu.Lock()
	n1.d.asked["n2"] = time.Now().Add(-subscribeFor - time.Second)
	n1.d.mu.Unlock()
	before := testutil.ToFloat64(n1.metrics.DrainAcks.WithLabelValues("rejected"))
	n1.d.take(gossip.Message{From: "n2", Kind: ackKind, Body: signed(reportAt("n2", t0.Add(2*time.Hour)), s2)})
	if got := testutil.ToFloat64(n1.metrics.DrainAcks.WithLabelValues("rejected")); got != before+1 {
		t.Error("a report not asked for was taken")
	}
	// A report counts for ackTTL.
	n1.d.mu.Lock()
	n1.d.gotAt["n2"] = time.Now().Add(-ackTTL - time.Second)
	n1.d.mu.Unlock()
	if acks := n1.d.acks(); len(acks) != 0 {
		t.Errorf("a report older than ackTTL still counts: %+v", acks)
	}
	if n1.d.has("n2", report.ContentDigest(listing)) || n1.d.has("n2", report.ContentDigest(changed)) {
		t.Error("a content received longer ago than ackTTL is still no news: git's copy would never be read")
	}
	// Keys that change drop what was taken under the old ones.
	n1.d.mu.Lock()
	n1.d.gotAt["n2"] = time.Now()
	n1.d.mu.Unlock()
	n1.d.setKeys(sync.ReportKeys{"n1": s1.PublicKey(), "n2": s1.PublicKey()}, m)
	if acks := n1.d.acks(); len(acks) != 0 {
		t.Errorf("a report taken under a key since rotated still counts: %+v", acks)
	}
	n1.d.mu.Lock()
	pastKept := len(n1.d.past)
	n1.d.mu.Unlock()
	if pastKept != 0 {
		t.Error("the contents replaced under a key since rotated are kept")
	}
	n1.d.setKeys(keys, m)
	// A node that leaves the inventory leaves the acks.
	delete(files, "nodes/n2.yaml")
	m2, err := render.Render(files)
	if err != nil {
		t.Fatal(err)
	}
	n1.d.setKeys(keys, m2)
	if acks := n1.d.acks(); len(acks) != 0 {
		t.Errorf("n2's ack kept after it left the inventory: %+v", acks)
	}
}

// TestWithAcks: the planner gets each node's newest report, from git or
// from the ring; this node's own never comes from the ring.
func TestWithAcks(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	peers := []report.Report{reportAt("n2", t0), reportAt("n3", t0)}
	acks := []report.Report{reportAt("n1", t0.Add(time.Hour)), reportAt("n2", t0.Add(time.Second)), reportAt("n3", t0.Add(-time.Second)), reportAt("n4", t0)}
	got, merged := withAcks(slices.Clone(peers), acks, "n1", t0.Add(time.Minute))
	want := map[string]time.Time{"n2": t0.Add(time.Second), "n3": t0, "n4": t0}
	if !merged {
		t.Error("n2's and n4's reports over the ring not merged")
	}
	if len(got) != len(want) {
		t.Fatalf("got %d reports: %+v", len(got), got)
	}
	for _, r := range got {
		if !r.Time.Equal(want[r.Node]) {
			t.Errorf("%s: report of %v, want %v", r.Node, r.Time, want[r.Node])
		}
	}
	// Past the limit (the last fetch plus the clock lead: git has been
	// unreachable a while) a report over the ring does not count.
	if got, merged := withAcks(slices.Clone(peers), acks, "n1", t0.Add(-time.Millisecond)); merged || !got[0].Time.Equal(t0) || len(got) != 2 {
		t.Errorf("reports past the limit merged: %+v", got)
	}
}

// TestRolloutWaits: a node that runs a replica of a Service asks the
// nodes of the replicas its rollout waits for; one that runs none does not.
func TestRolloutWaits(t *testing.T) {
	plan := &planner.Plan{
		Placements: []planner.Placement{
			{Instance: "web-0", Service: "web", Node: "n1", Released: true, Outdated: "restart"},
			{Instance: "web-1", Service: "web", Node: "n2", Outdated: "restart"},
			{Instance: "web-2", Service: "web", Node: "n3", Outdated: "restart"},
			{Instance: "db-0", Service: "db", Node: "n4"},
		},
		Services: []planner.Service{
			{Name: "web", Rollout: &planner.Rollout{Waiting: []string{"web-0"}}},
			{Name: "db"},
		},
	}
	for node, want := range map[string][]string{"n1": nil, "n2": {"n1"}, "n3": {"n1"}, "n4": nil} {
		if got := rolloutWaits(plan, node); !slices.Equal(got, want) {
			t.Errorf("%s asks %v, want %v", node, got, want)
		}
	}
}

func encodeSigned(t *testing.T, r report.Report, s ssh.Signer) []byte {
	t.Helper()
	data := r.Marshal()
	var sig []byte
	if s != nil {
		var err error
		if sig, err = sync.SignReport(data, s); err != nil {
			t.Fatal(err)
		}
	}
	return encodeAck(data, sig)
}
