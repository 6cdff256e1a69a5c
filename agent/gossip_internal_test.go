package agent

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/internal/loopnet"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// TestGossipWantsAndStale: with a ring, a fetch skips the report of a node
// the ring vouches for (alive, announcing the content this node has read:
// a heartbeat), and asks for every other report, the branch and the
// certificates; the ring's news makes a fetch worth it only when it
// announces what this node lacks, or a member changed state since the
// last fetch began.
func TestGossipWantsAndStale(t *testing.T) {
	const prefix = "refs/keel/reports/"
	d1, d2 := strings.Repeat("1", 32), strings.Repeat("2", 32)
	tip := strings.Repeat("a", 40)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	w := &gitWorker{opts: Options{Node: "self"}, digests: map[string]string{"a": d1, "b": d1, "c": d1}, tips: map[string]bool{tip: true}, fetchedAt: t0}
	member := func(alive bool, digest string, since time.Time) gossip.Member {
		return gossip.Member{Alive: alive, Since: since, HasMeta: true, Meta: gossip.Meta{Report: digest, Tip: tip}}
	}
	v := gossip.View{Members: map[string]gossip.Member{
		"self": member(true, d2, t0.Add(-time.Hour)),
		"a":    member(true, d1, t0.Add(-time.Hour)), // vouched for: heartbeats skipped
		"b":    member(true, d2, t0.Add(-time.Hour)), // announced content not read yet
		"c":    member(false, d1, t0.Add(-time.Hour)),
	}}
	want := w.wants(v, prefix)
	for ref, wanted := range map[string]bool{
		prefix + "a": false, prefix + "b": true, prefix + "c": true, prefix + "unknown": true,
		prefix + "self":   false, // made afresh at each pass
		"refs/heads/main": true, "refs/keel/certs/www.example.com": true,
	} {
		if got := want(plumbing.ReferenceName(ref), plumbing.ZeroHash); got != wanted {
			t.Errorf("want(%s) = %v, want %v", ref, got, wanted)
		}
	}
	if !w.stale(v) {
		t.Error("b announced content this node has not read: not stale")
	}
	v.Members["b"] = member(true, d1, t0.Add(-time.Hour))
	if w.stale(v) {
		t.Error("everything announced is read, nothing changed since the fetch: stale")
	}
	if v.Members["a"] = member(false, d1, t0.Add(time.Second)); !w.stale(v) {
		t.Error("a died after the last fetch began (it may still push): not stale")
	}
	v.Members["a"] = member(true, d1, t0.Add(-time.Hour))
	// A version announced that came over the ring already (drainAcks) is
	// neither fetched nor news.
	v.Members["b"] = member(true, d2, t0.Add(-time.Hour))
	now := time.Now()
	ring := func(digest string, past ...replaced) *drainAcks {
		return &drainAcks{got: map[string]report.Report{"b": {Node: "b", Time: now}}, digest: map[string]string{"b": digest},
			past: map[string][]replaced{"b": past}, gotAt: map[string]time.Time{"b": now}, limit: now.Add(time.Second)}
	}
	w.acks = ring(d2)
	if w.stale(v) || w.wants(v, prefix)(plumbing.ReferenceName(prefix+"b"), plumbing.ZeroHash) {
		t.Error("b's announced report came over the ring: still stale, or fetched")
	}
	// Nor is one the ring has brought a newer report since (the push of
	// a burst's last report, once the next burst is under way).
	d3 := strings.Repeat("3", 32)
	w.acks = ring(d3, replaced{d1, now}, replaced{d2, now})
	if w.stale(v) || w.wants(v, prefix)(plumbing.ReferenceName(prefix+"b"), plumbing.ZeroHash) {
		t.Error("b's announced report was replaced over the ring: still stale, or fetched")
	}
	// But it is once the ring's report or the replacement is older than
	// ackCover (git's copy is read before the ring's stops counting), or
	// when the plan does not count the ring's report (past its limit).
	for name, acks := range map[string]*drainAcks{
		"received longer ago than ackCover": func() *drainAcks {
			d := ring(d2)
			d.gotAt["b"] = now.Add(-ackCover - time.Second)
			return d
		}(),
		"replaced longer ago than ackCover": ring(d3, replaced{d2, now.Add(-ackCover - time.Second)}),
		"dated past the plan's limit": func() *drainAcks {
			d := ring(d2)
			d.limit = now.Add(-time.Second)
			return d
		}(),
		"with no plan made with the ring": func() *drainAcks {
			d := ring(d2)
			d.limit = time.Time{}
			return d
		}(),
	} {
		w.acks = acks
		if !w.stale(v) || !w.wants(v, prefix)(plumbing.ReferenceName(prefix+"b"), plumbing.ZeroHash) {
			t.Errorf("b's announced report, %s: not fetched", name)
		}
	}
	w.acks = nil
	v.Members["b"] = member(true, d1, t0.Add(-time.Hour))
	m := v.Members["b"]
	m.Meta.Tip = strings.Repeat("b", 40)
	if v.Members["b"] = m; !w.stale(v) {
		t.Error("a tip this node has not fetched: not stale")
	}
}

// TestHeartbeat: the push interval of an unchanged report is the
// reportInterval, shortened to the default of a cluster without a ring
// while this node sees no majority of its ring.
func TestHeartbeat(t *testing.T) {
	c := render.Cluster{ReportInterval: render.DefaultGossipReportInterval}
	if got := heartbeat(c, false); got != time.Minute {
		t.Errorf("heartbeat = %s, want 1m", got)
	}
	if got := heartbeat(c, true); got != 10*time.Second {
		t.Errorf("minority heartbeat = %s, want 10s", got)
	}
	if got := heartbeat(render.Cluster{ReportInterval: render.Duration(3e9)}, true); got != 3*time.Second {
		t.Errorf("minority heartbeat of a 3s interval = %s, want 3s", got)
	}
}

// TestRingKeeperFollowsTheModelAndStalls: the ring starts when the model
// turns gossip on (with a key file), stops without leaving when the loop
// is stuck and starts again at the next apply, and leaves when the node
// leaves the inventory; without a key file it does not start and says so.
func TestRingKeeperFollowsTheModelAndStalls(t *testing.T) {
	m, keyFile := oneNodeModel(t)
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
	metrics := NewMetrics(prometheus.NewRegistry())

	k := newRingKeeper(Options{Node: "n1", Now: time.Now}, log, metrics)
	k.apply(m, false)
	if k.on() || !strings.Contains(logs.String(), "no --gossip-key") {
		t.Fatalf("started without a key file, or did not say why: %s", logs.String())
	}

	k = newRingKeeper(Options{Node: "n1", Now: time.Now, GossipKeyFile: keyFile}, log, metrics)
	defer k.close()
	k.apply(m, false)
	if !k.on() {
		t.Fatalf("not started: %s", logs.String())
	}
	if g, _ := k.view(0); g == nil || !g.Members["n1"].Alive {
		t.Fatalf("view %+v: n1 not alive in its own ring", g)
	}
	k.stall()
	if k.on() {
		t.Fatal("still in the ring with the loop stuck")
	}
	k.apply(m, false)
	if !k.on() {
		t.Fatalf("not started again after the stall: %s", logs.String())
	}
	k.apply(m, true)
	if k.on() {
		t.Fatal("still in the ring after leaving the inventory")
	}
}

type syncWriter struct {
	mu gosync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestSafetyPoll: in a ring, the poll is the longest of --poll, the report
// interval and 300 ms a node, so that a large cluster lists the refs a
// few times a second in all.
func TestSafetyPoll(t *testing.T) {
	c := render.Cluster{ReportInterval: render.DefaultGossipReportInterval}
	for _, tc := range []struct {
		poll time.Duration
		n    int
		want time.Duration
	}{
		{10 * time.Second, 3, time.Minute},
		{10 * time.Second, 1000, 5 * time.Minute},
		{10 * time.Minute, 1000, 10 * time.Minute},
	} {
		if got := safetyPoll(tc.poll, c, tc.n); got != tc.want {
			t.Errorf("safetyPoll(%s, %d nodes) = %s, want %s", tc.poll, tc.n, got, tc.want)
		}
	}
}

// oneNodeModel renders a cluster of one node, n1 at 127.0.0.1, with a
// gossip ring on a free port, and writes a key file for it.
func oneNodeModel(t *testing.T) (*render.Model, string) {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freeRingPort(t, "127.0.0.1")
	m, err := render.Render(fstest.MapFS{
		"cluster.yaml":  {Data: fmt.Appendf(nil, "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {gossip: {port: %d}}\n", port)},
		"nodes/n1.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 127.0.0.1}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, keyFile
}

// oneNodeRing is oneNodeModel with n1's ring started (closed at the end of
// the test).
func oneNodeRing(t *testing.T) (*render.Model, *ringKeeper) {
	t.Helper()
	m, keyFile := oneNodeModel(t)
	k := newRingKeeper(Options{Node: "n1", Now: time.Now, GossipKeyFile: keyFile}, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()))
	t.Cleanup(k.close)
	k.apply(m, false)
	if !k.on() {
		t.Fatal("ring not started")
	}
	return m, k
}

// freeRingPort returns a port free for TCP and UDP on every address, and
// skips the test where an address cannot be listened on (the loopback
// aliases localcluster uses).
func freeRingPort(t *testing.T, addrs ...string) int {
	t.Helper()
	for _, a := range addrs {
		l, err := net.Listen("tcp", a+":0")
		if err != nil {
			t.Skipf("cannot listen on %s (loopback aliases, as localcluster's): %v", a, err)
		}
		l.Close()
	}
	port, err := loopnet.FreePort(addrs...)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestRingRestartKeepsWhoItSaw: a node's ring vouches for its peers, so it
// does not fetch their heartbeats and the reports it holds grow old. When
// its ring moves to another port (a commit the peers have not applied
// yet), or a commit turns gossip off, the peers it saw alive a moment ago
// must not be judged dead by those old reports: this node would take the
// whole cluster's stateless work.
func TestRingRestartKeepsWhoItSaw(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "gossip.key")
	key := make([]byte, 32)
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := []string{"127.0.1.1", "127.0.1.2", "127.0.1.3"}
	port, moved := freeRingPort(t, addrs...), freeRingPort(t, addrs...)
	model := func(gossipPort int) *render.Model {
		files := fstest.MapFS{}
		cluster := "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {livenessTTL: 180s}\n"
		if gossipPort != 0 {
			cluster = fmt.Sprintf("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {livenessTTL: 180s, gossip: {port: %d}}\n", gossipPort)
		}
		files["cluster.yaml"] = &fstest.MapFile{Data: []byte(cluster)}
		for i, a := range addrs {
			files[fmt.Sprintf("nodes/n%d.yaml", i+1)] = &fstest.MapFile{Data: fmt.Appendf(nil, "apiVersion: keel/v1\nkind: Node\nmetadata: {name: n%d}\nspec: {address: %s}\n", i+1, a)}
		}
		m, err := render.Render(files)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	fast := gossip.Timing{ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond, SuspicionMult: 2,
		GossipInterval: 50 * time.Millisecond, PushPullInterval: time.Second}
	peers := map[string]netip.AddrPort{}
	for i, a := range addrs {
		peers[fmt.Sprintf("n%d", i+1)] = netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port))
	}
	for i := 2; i <= 3; i++ {
		r, err := gossip.Start(gossip.Config{Node: fmt.Sprintf("n%d", i), Addr: netip.MustParseAddr(addrs[i-1]), Port: port,
			Keys: [][]byte{key}, Cluster: "t", Timing: fast})
		if err != nil {
			t.Skipf("cannot listen on %s (loopback aliases): %v", addrs[i-1], err)
		}
		defer r.Stop()
		r.SetPeers(peers)
	}
	log := slog.New(slog.DiscardHandler)
	k := newRingKeeper(Options{Node: "n1", Now: time.Now, GossipKeyFile: keyFile, GossipTiming: fast}, log, NewMetrics(prometheus.NewRegistry()))
	defer k.close()
	k.apply(model(port), false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, _ := k.view(0)
		if g != nil && g.Members["n2"].Alive && g.Members["n3"].Alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n2 and n3 never alive in n1's ring: %+v", g)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The reports n1 holds: its own, fresh; its peers', unchanged (so not
	// fetched) for ten minutes, past the TTL of three.
	now := time.Now()
	reports := []report.Report{reportAt("n1", now), reportAt("n2", now.Add(-10*time.Minute)), reportAt("n3", now.Add(-10*time.Minute))}
	alive := func(m *render.Model) string {
		g, _ := k.view(0)
		p := planner.Compute(planner.Input{Model: m, Commit: strings.Repeat("c", 40), Reports: reports, Now: now, Gossip: g})
		var names []string
		for _, n := range p.Nodes {
			if n.Alive {
				names = append(names, n.Name)
			}
		}
		return strings.Join(names, ",")
	}
	if got := alive(model(port)); got != "n1,n2,n3" {
		t.Fatalf("in the ring: alive %q, want n1,n2,n3", got)
	}
	// The port moves: n1's new ring holds n1 alone (n2 and n3 have not
	// applied the commit yet).
	m := model(moved)
	k.apply(m, false)
	if !k.on() {
		t.Fatal("the ring did not move")
	}
	if got := alive(m); got != "n1,n2,n3" {
		t.Errorf("after the ring moved: alive %q, want n1,n2,n3 (seen alive a moment ago)", got)
	}
	// Gossip turned off.
	m = model(0)
	k.apply(m, false)
	if k.on() {
		t.Fatal("still in a ring with gossip off")
	}
	if got := alive(m); got != "n1,n2,n3" {
		t.Errorf("after gossip was turned off: alive %q, want n1,n2,n3 (seen alive a moment ago)", got)
	}
}

func reportAt(node string, at time.Time) report.Report {
	return report.Report{APIVersion: render.APIVersion, Kind: report.Kind, Node: node, Time: at,
		Capacity: report.Capacity{CPU: 64000, Memory: 256 << 30}}
}

// TestPollWithACutOffNode: on a large cluster the safety poll (5 min on
// 1,000 nodes) is longer than the TTL (3 min); a node alive by its reports
// alone (the ring lost it but its reports still come, or the ring never
// saw it: no key, an old agent) is kept alive only by the reports the poll
// brings, so while there is one the poll is a third of the TTL at most: it
// must not die and come back at every poll, its work moving each time.
func TestPollWithACutOffNode(t *testing.T) {
	own, k := oneNodeRing(t)
	// The loop's state on a node of a 1,000-node cluster at the defaults.
	big := &render.Model{Cluster: own.Cluster, Nodes: make([]render.Node, 1000)}
	a := &Agent{opts: Options{Poll: 10 * time.Second}, cluster: own.Cluster, ring: k, applied: &appliedCommit{model: big},
		plan: &planner.Plan{}}
	if got := a.pollInterval(); got != 5*time.Minute {
		t.Fatalf("safety poll %s, want 5m", got)
	}
	// n7 alive by its reports, not in the ring (cut off, or never in it).
	a.plan.Nodes = []planner.Node{{Name: "n1", Alive: true}, {Name: "n7", Alive: true}}
	g, _ := k.view(0)
	a.noteRing(a.plan, g)
	if got, ttl := a.pollInterval(), time.Duration(own.Cluster.LivenessTTL); got > ttl/3 {
		t.Errorf("poll %s with a node alive by its reports alone, want at most a third of the TTL %s", got, ttl)
	}
	// n7 dead: nothing to keep alive.
	a.plan.Nodes[1].Alive = false
	a.noteRing(a.plan, g)
	if got := a.pollInterval(); got != 5*time.Minute {
		t.Errorf("safety poll %s with the other node dead, want 5m", got)
	}
}

// TestHeartbeatWithANodeOutsideTheRing: a node outside the ring but alive
// by its reports (it refused the commit that turned gossip on, or its
// agent has no gossip) judges this node by its reports, at the TTL of a
// cluster without gossip (30 s): this node's heartbeat is then the short
// one, not the ring's minute.
func TestHeartbeatWithANodeOutsideTheRing(t *testing.T) {
	m, k := oneNodeRing(t)
	a := &Agent{opts: Options{Node: "n1", Poll: 10 * time.Second}, cluster: m.Cluster, ring: k, applied: &appliedCommit{model: m},
		plan: &planner.Plan{Nodes: []planner.Node{{Name: "n1", Alive: true}}}}
	if got := a.heartbeatInterval(); got != time.Minute {
		t.Fatalf("heartbeat %s with every node in the ring, want 1m", got)
	}
	a.plan.Nodes = append(a.plan.Nodes, planner.Node{Name: "n2", Alive: true})
	g, _ := k.view(0)
	a.noteRing(a.plan, g)
	if got := a.heartbeatInterval(); got != 10*time.Second {
		t.Errorf("heartbeat %s with n2 alive outside the ring, want 10s", got)
	}
}

// TestPublisherLongHeartbeatIsNoStall: with a ring the loop hands an
// unchanged report only once a report interval; an interval longer than
// the stall limit (a reportInterval of 2 min against 3 × 5 s + 1 min) must
// not be taken for a stuck loop, which stops the heartbeat and the ring
// (the peers then find the node dead and move its work) at every
// interval.
func TestPublisherLongHeartbeatIsNoStall(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	bare := filepath.Join(t.TempDir(), "c.git")
	if out, err := exec.Command("git", "init", "-q", "--bare", "-b", "main", bare).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var stalls atomic.Int32
	p := newPublisher(Options{Node: "n1", StateDir: t.TempDir(), Remote: sync.Remote{URL: bare}, GitTimeout: time.Minute, Now: time.Now},
		slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), 300*time.Millisecond, nil, func() { stalls.Add(1) })
	defer p.close()
	const interval = time.Second
	// The loop passes often but hands the unchanged report only when an
	// interval has gone since the last hand-off (Agent.publish's due).
	for range 4 {
		now := time.Now()
		p.publish(publication{report: reportAt("n1", now), builtAt: now, prefix: render.DefaultReportRefPrefix, interval: interval, ttl: time.Minute})
		time.Sleep(interval + 100*time.Millisecond) // the loop's pace, not a wait on a condition
	}
	if n := stalls.Load(); n != 0 {
		t.Errorf("the publisher took a loop that hands a report once an interval for a stuck one %d times", n)
	}
	if n := testutil.ToFloat64(p.metrics.ReportPushes); n < 4 {
		t.Errorf("%v pushes, want at least the 4 hand-offs", n)
	}
}
