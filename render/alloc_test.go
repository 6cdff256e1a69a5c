package render_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/render"
)

// cluster builds a repository with the given nodes (named, with addresses
// 192.0.2.x) and services, plus an optional keel.lock.
func cluster(nodes []string, services []string, lock string) fstest.MapFS {
	fsys := fstest.MapFS{
		"cluster.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: test}\n")},
	}
	for i, n := range nodes {
		fsys["nodes/"+n+".yaml"] = &fstest.MapFile{Data: fmt.Appendf(nil,
			"apiVersion: keel/v1\nkind: Node\nmetadata: {name: %s}\nspec: {address: 192.0.%d.%d}\n", n, 2+i/250, 1+i%250)}
	}
	for _, s := range services {
		fsys["apps/"+s+".yaml"] = &fstest.MapFile{Data: fmt.Appendf(nil,
			"apiVersion: keel/v1\nkind: Service\nmetadata: {name: %s}\nspec: {port: 80, template: {image: base/x}}\n", s)}
	}
	if lock != "" {
		fsys["keel.lock"] = &fstest.MapFile{Data: []byte(lock)}
	}
	return fsys
}

func mustRender(t *testing.T, fsys fstest.MapFS) *render.Model {
	t.Helper()
	m, err := render.Render(fsys)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return m
}

func subnets(m *render.Model) map[string]string {
	out := map[string]string{}
	for _, n := range m.Nodes {
		out[n.Name] = n.PodCIDR.String()
	}
	return out
}

func vips(m *render.Model) map[string]string {
	out := map[string]string{}
	for _, s := range m.Services {
		out[s.Name] = s.VIP.String()
	}
	return out
}

func TestDerivedSubnetsAreDistinct(t *testing.T) {
	var nodes []string
	for i := range 60 {
		nodes = append(nodes, fmt.Sprintf("node-%02d", i))
	}
	m := mustRender(t, cluster(nodes, nil, ""))
	seen := map[string]string{}
	pod := netip.MustParsePrefix("10.200.0.0/16")
	for _, n := range m.Nodes {
		if n.PodCIDRSource != render.SourceDerived {
			t.Errorf("%s: source %q, want derived", n.Name, n.PodCIDRSource)
		}
		if n.PodCIDR.Bits() != 24 || !pod.Contains(n.PodCIDR.Addr()) {
			t.Errorf("%s: %s is not a /24 of %s", n.Name, n.PodCIDR, pod)
		}
		if other, dup := seen[n.PodCIDR.String()]; dup {
			t.Errorf("%s and %s share %s", n.Name, other, n.PodCIDR)
		}
		seen[n.PodCIDR.String()] = n.Name
	}
	if len(seen) != 60 {
		t.Fatalf("got %d distinct subnets, want 60", len(seen))
	}
}

func TestFullPodCIDRIsAnError(t *testing.T) {
	fsys := cluster([]string{"a", "b", "c"}, nil, "")
	fsys["cluster.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {podCIDR: 10.200.0.0/23}\n")}
	_, err := render.Render(fsys)
	if err == nil || !strings.Contains(err.Error(), "no free /24") {
		t.Fatalf("want a 'no free /24' error for 3 nodes in a /23, got %v", err)
	}
}

// TestLockedSubnetNeverMoves locks another node onto the slot a node would
// derive, and checks that the lock wins and the new node probes past it.
func TestLockedSubnetNeverMoves(t *testing.T) {
	alone := mustRender(t, cluster([]string{"web1"}, nil, ""))
	natural := alone.Nodes[0].PodCIDR.String()

	lock := "apiVersion: keel/v1\nkind: Lock\nsubnets:\n  db1: " + natural + "\n"
	m := mustRender(t, cluster([]string{"db1", "web1"}, nil, lock))
	got := subnets(m)
	if got["db1"] != natural {
		t.Errorf("locked db1 moved to %s, want %s", got["db1"], natural)
	}
	if got["web1"] == natural || got["web1"] == "" {
		t.Errorf("web1 got %q: it must probe past the locked %s", got["web1"], natural)
	}
	if n := m.Node("db1"); n.PodCIDRSource != render.SourceLocked {
		t.Errorf("db1 source %q, want locked", n.PodCIDRSource)
	}
}

func TestLockedVIPNeverMoves(t *testing.T) {
	alone := mustRender(t, cluster([]string{"n1"}, []string{"web"}, ""))
	natural := alone.Services[0].VIP.String()

	lock := "apiVersion: keel/v1\nkind: Lock\nvips:\n  api: " + natural + "\n"
	m := mustRender(t, cluster([]string{"n1"}, []string{"api", "web"}, lock))
	got := vips(m)
	if got["api"] != natural {
		t.Errorf("locked api moved to %s, want %s", got["api"], natural)
	}
	if got["web"] == natural || got["web"] == "" {
		t.Errorf("web got %q: it must probe past the locked %s", got["web"], natural)
	}
}

// TestAddingNodesAndServicesKeepsLockedAllocations locks a cluster, then
// adds many nodes and services: nothing locked moves, and all stay distinct.
func TestAddingNodesAndServicesKeepsLockedAllocations(t *testing.T) {
	var nodes, services []string
	for i := range 10 {
		nodes = append(nodes, fmt.Sprintf("n%d", i))
		services = append(services, fmt.Sprintf("svc%d", i))
	}
	before := mustRender(t, cluster(nodes, services, ""))
	lock := string(render.NewLock(before).Marshal())
	for i := 10; i < 80; i++ {
		nodes = append(nodes, fmt.Sprintf("n%d", i))
		services = append(services, fmt.Sprintf("svc%d", i))
	}
	after := mustRender(t, cluster(nodes, services, lock))
	for name, s := range subnets(before) {
		if got := subnets(after)[name]; got != s {
			t.Errorf("node %s moved from %s to %s", name, s, got)
		}
	}
	for name, v := range vips(before) {
		if got := vips(after)[name]; got != v {
			t.Errorf("service %s moved from %s to %s", name, v, got)
		}
	}
	assertDistinct(t, "subnet", subnets(after))
	assertDistinct(t, "VIP", vips(after))
}

func assertDistinct(t *testing.T, what string, m map[string]string) {
	t.Helper()
	seen := map[string]string{}
	for k, v := range m {
		if other, dup := seen[v]; dup {
			t.Errorf("%s %s is shared by %s and %s", what, v, k, other)
		}
		seen[v] = k
	}
}

func TestVIPsAvoidNetworkAndBroadcast(t *testing.T) {
	fsys := cluster([]string{"n1"}, []string{"a", "b"}, "")
	fsys["cluster.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {serviceCIDR: 10.201.0.0/30}\n")}
	m := mustRender(t, fsys)
	for _, s := range m.Services {
		if a := s.VIP.String(); a != "10.201.0.1" && a != "10.201.0.2" {
			t.Errorf("service %s got %s; in a /30 only .1 and .2 are usable", s.Name, a)
		}
	}
	assertDistinct(t, "VIP", vips(m))
}

func TestLockRoundTripAndIdempotence(t *testing.T) {
	m := mustRender(t, cluster([]string{"a", "b"}, []string{"web"}, ""))
	first := render.NewLock(m)
	data := first.Marshal()
	m2 := mustRender(t, cluster([]string{"a", "b"}, []string{"web"}, string(data)))
	second := render.NewLock(m2)
	if !second.Equal(first) || string(second.Marshal()) != string(data) {
		t.Fatalf("lock is not idempotent:\n%s\nthen\n%s", data, second.Marshal())
	}
	if d := m2.Lock.Diff(second); len(d) != 0 {
		t.Fatalf("a current lock reports a diff: %v", d)
	}
	for _, d := range m2.Diagnostics.Warnings() {
		if strings.Contains(d.Message, "keel lock") {
			t.Errorf("a current lock still warns: %s", d)
		}
	}
}

func TestLockDropsDeletedEntries(t *testing.T) {
	m := mustRender(t, cluster([]string{"a", "b"}, []string{"web", "api"}, ""))
	lock := string(render.NewLock(m).Marshal())
	m2 := mustRender(t, cluster([]string{"a"}, []string{"web"}, lock))
	var stale int
	for _, d := range m2.Diagnostics.Warnings() {
		if strings.Contains(d.Message, "drop the entry") {
			stale++
		}
	}
	if stale != 2 {
		t.Errorf("want 2 stale-entry warnings (node b, service api), got %d: %v", stale, m2.Diagnostics)
	}
	got := m2.Lock.Diff(render.NewLock(m2))
	want := []string{"- subnets.b: " + subnets(m)["b"], "- vips.api: " + vips(m)["api"]}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("diff = %q, want %q", got, want)
	}
}

func TestDerivationIgnoresFileOrder(t *testing.T) {
	names := []string{"zeta", "alpha", "mid", "beta"}
	a := subnets(mustRender(t, cluster(names, nil, "")))
	b := subnets(mustRender(t, cluster([]string{"beta", "mid", "alpha", "zeta"}, nil, "")))
	for k, v := range a {
		if b[k] != v {
			t.Errorf("%s: %s vs %s depending on input order", k, v, b[k])
		}
	}
}

func TestGossipDefaults(t *testing.T) {
	fsys := cluster([]string{"a"}, []string{"web"}, "")
	m := mustRender(t, fsys)
	if m.Cluster.Gossip != nil || m.Cluster.ReportInterval != render.DefaultReportInterval || m.Cluster.LivenessTTL != render.DefaultLivenessTTL {
		t.Fatalf("without gossip: %+v", m.Cluster)
	}
	fsys["cluster.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: test}\nspec: {gossip: {port: 7946}}\n")}
	m = mustRender(t, fsys)
	if m.Cluster.Gossip == nil || m.Cluster.Gossip.Port != 7946 || m.Cluster.ReportInterval != render.DefaultGossipReportInterval || m.Cluster.LivenessTTL != render.DefaultGossipLivenessTTL {
		t.Fatalf("with gossip: %+v", m.Cluster)
	}
	fsys["cluster.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: test}\nspec: {gossip: {port: 7946}, reportInterval: 5s, livenessTTL: 15s}\n")}
	if m = mustRender(t, fsys); m.Cluster.ReportInterval != render.Duration(5e9) || m.Cluster.LivenessTTL != render.Duration(15e9) {
		t.Fatalf("gossip with intervals set: %+v", m.Cluster)
	}
}

// TestGossipIntervalsScaleWithTheCluster: with a ring, the default
// heartbeat is 60 s up to 300 nodes and 200 ms a node beyond, the TTL three
// times it; set values are kept.
func TestGossipIntervalsScaleWithTheCluster(t *testing.T) {
	nodes := make([]string, 1000)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("n%d", i)
	}
	fsys := cluster(nodes, nil, "")
	fsys["cluster.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: test}\nspec: {gossip: {port: 7946}, allowEmpty: true, podCIDR: 10.0.0.0/8, serviceCIDR: 172.16.0.0/16}\n")}
	m := mustRender(t, fsys)
	if m.Cluster.ReportInterval != render.Duration(200e9) || m.Cluster.LivenessTTL != render.Duration(600e9) {
		t.Fatalf("1,000 nodes: reportInterval %s, livenessTTL %s; want 3m20s, 10m0s", m.Cluster.ReportInterval, m.Cluster.LivenessTTL)
	}
	for n, want := range map[int]time.Duration{1: time.Minute, 300: time.Minute, 310: time.Minute + 2*time.Second, 1000: 200 * time.Second} {
		if got := time.Duration(render.GossipReportInterval(n)); got != want {
			t.Errorf("GossipReportInterval(%d) = %s, want %s", n, got, want)
		}
	}
}
