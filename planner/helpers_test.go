package planner

// Helpers shared by the planner's table and property tests: a small model of
// a cluster repository written out as real YAML (so that every test goes
// through render.Render, as the agents do), report builders, and lookups in
// a plan.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing/fstest"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// fataler is what both *testing.T and *rapid.T offer.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// t0 is the cluster time most tests are built around.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// secs is t0 plus n seconds.
func secs(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

// commitC is the commit being planned in most tests.
const commitC = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"

// nodeDef is a Node document.
type nodeDef struct {
	Name    string
	Labels  map[string]string
	CPU     string // capacity override, "" for none
	Memory  string
	Drained bool   // schedulable: false
	PodCIDR string // explicit subnet, "" to let render derive one
	Address string // the node's own address, "" for one by position
	YML     bool   // write nodes/<name>.yml instead of .yaml
}

// workloadDef is a Jail or a Service document.
type workloadDef struct {
	Service  bool // a Service (else a Jail)
	Name     string
	Replicas int // Service only; written as is, so 0 means none
	Image    string
	Command  []string
	Env      map[string]string
	CPU      string
	Memory   string
	Volumes  []string
	Node     string
	Selector map[string]string
	Address  string // Jail only: network.address
	// Strategy is the Service's spec.strategy, nil for none.
	Strategy map[string]any
}

// ingressDef is an Ingress document.
type ingressDef struct {
	Name, Host, Service string
}

// repoDef is a cluster repository.
type repoDef struct {
	TTL       string // livenessTTL, "" for the default
	Nodes     []nodeDef
	Workloads []workloadDef
	Ingresses []ingressDef
	Pins      map[string]string // keel.lock pins
	Lock      []byte            // a whole keel.lock, instead of Pins
}

func yamlDoc(v map[string]any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// doc writes the Node document by hand (flow style, labels sorted): the
// property tests write hundreds per scenario, and this is much cheaper
// than a YAML encoder.
func (n nodeDef) doc(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: keel/v1\nkind: Node\nmetadata:\n  name: %s\n", n.Name)
	if len(n.Labels) > 0 {
		b.WriteString("  labels: {")
		for k, key := range sortedKeys(n.Labels) {
			if k > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%q: %q", key, n.Labels[key])
		}
		b.WriteString("}\n")
	}
	addr := n.Address
	if addr == "" {
		addr = fmt.Sprintf("192.0.%d.%d", 2+i/250, 1+i%250)
	}
	fmt.Fprintf(&b, "spec:\n  address: %s\n", addr)
	if n.PodCIDR != "" {
		fmt.Fprintf(&b, "  podCIDR: %s\n", n.PodCIDR)
	}
	if n.CPU != "" || n.Memory != "" {
		b.WriteString("  capacity:\n")
		if n.CPU != "" {
			fmt.Fprintf(&b, "    cpu: %q\n", n.CPU)
		}
		if n.Memory != "" {
			fmt.Fprintf(&b, "    memory: %s\n", n.Memory)
		}
	}
	if n.Drained {
		b.WriteString("  schedulable: false\n")
	}
	return b.String()
}

func (w workloadDef) doc() string {
	tmpl := map[string]any{"image": cmpOr(w.Image, "base/app")}
	if len(w.Command) > 0 {
		tmpl["command"] = w.Command
	}
	if len(w.Env) > 0 {
		tmpl["env"] = w.Env
	}
	res := map[string]any{}
	if w.CPU != "" {
		res["cpu"] = w.CPU
	}
	if w.Memory != "" {
		res["memory"] = w.Memory
	}
	if len(res) > 0 {
		tmpl["resources"] = res
	}
	var vols []any
	for _, v := range w.Volumes {
		vols = append(vols, map[string]any{"name": v, "mountPath": "/var/db/" + v})
	}
	if len(vols) > 0 {
		tmpl["volumes"] = vols
	}
	if w.Node != "" {
		tmpl["node"] = w.Node
	}
	if len(w.Selector) > 0 {
		tmpl["nodeSelector"] = w.Selector
	}
	if !w.Service {
		if w.Address != "" {
			tmpl["network"] = map[string]any{"address": w.Address}
		}
		return yamlDoc(map[string]any{"apiVersion": "keel/v1", "kind": "Jail", "metadata": map[string]any{"name": w.Name}, "spec": tmpl})
	}
	spec := map[string]any{"replicas": w.Replicas, "port": 8080, "template": tmpl}
	if w.Strategy != nil {
		spec["strategy"] = w.Strategy
	}
	return yamlDoc(map[string]any{"apiVersion": "keel/v1", "kind": "Service", "metadata": map[string]any{"name": w.Name}, "spec": spec})
}

func (g ingressDef) doc() string {
	return yamlDoc(map[string]any{"apiVersion": "keel/v1", "kind": "Ingress", "metadata": map[string]any{"name": g.Name},
		"spec": map[string]any{"host": g.Host, "backend": map[string]any{"service": g.Service}, "tls": map[string]any{"email": "ops@example.com"}}})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// fs writes the repository. With layout nil every workload and Ingress has
// its own file; otherwise layout shuffles the documents and spreads them over
// a few multi-document files with made-up names, as a user might.
func (r repoDef) fs(layout *rand.Rand) fstest.MapFS {
	cluster := map[string]any{"apiVersion": "keel/v1", "kind": "Cluster", "metadata": map[string]any{"name": "test"}}
	if r.TTL != "" {
		ttl, err := time.ParseDuration(r.TTL)
		if err != nil {
			panic(err)
		}
		cluster["spec"] = map[string]any{"livenessTTL": r.TTL, "reportInterval": (ttl / 3).String()}
	}
	fsys := fstest.MapFS{"cluster.yaml": {Data: []byte(yamlDoc(cluster))}}
	for i, n := range r.Nodes {
		ext := ".yaml"
		if n.YML {
			ext = ".yml"
		}
		fsys["nodes/"+n.Name+ext] = &fstest.MapFile{Data: []byte(n.doc(i))}
	}
	type named struct{ file, doc string }
	var docs []named
	for _, w := range r.Workloads {
		docs = append(docs, named{"apps/" + w.Name + ".yaml", w.doc()})
	}
	for _, g := range r.Ingresses {
		docs = append(docs, named{"ingress/" + g.Name + ".yaml", g.doc()})
	}
	if layout == nil {
		for _, d := range docs {
			fsys[d.file] = &fstest.MapFile{Data: []byte(d.doc)}
		}
	} else {
		layout.Shuffle(len(docs), func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
		dirs := []string{"", "apps/", "deep/er/", "z/", "a/b/"}
		files := 1 + layout.IntN(4)
		for i, d := range docs {
			f := fmt.Sprintf("%sspecs-%d.yaml", dirs[(i%files)%len(dirs)], (i%files)*7+layout.IntN(2))
			if layout.IntN(3) == 0 {
				f = strings.TrimSuffix(f, ".yaml") + ".yml"
			}
			if old := fsys[f]; old != nil {
				old.Data = append(old.Data, []byte("---\n"+d.doc)...)
			} else {
				fsys[f] = &fstest.MapFile{Data: []byte("# generated\n---\n" + d.doc)}
			}
		}
		fsys["README.md"] = &fstest.MapFile{Data: []byte("not a spec\n")}
	}
	switch {
	case r.Lock != nil:
		fsys[render.LockFile] = &fstest.MapFile{Data: r.Lock}
	case len(r.Pins) > 0:
		var b strings.Builder
		b.WriteString("apiVersion: keel/v1\nkind: Lock\npins:\n")
		for _, k := range sortedKeys(r.Pins) {
			fmt.Fprintf(&b, "  %s: %s\n", k, r.Pins[k])
		}
		fsys[render.LockFile] = &fstest.MapFile{Data: []byte(b.String())}
	}
	return fsys
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// renderFS renders a repository, failing on any error.
func renderFS(t fataler, fsys fstest.MapFS) *render.Model {
	t.Helper()
	m, err := render.Render(fsys)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return m
}

// model renders r in its plain layout.
func (r repoDef) model(t fataler) *render.Model {
	t.Helper()
	return renderFS(t, r.fs(nil))
}

// tableNodes are nodes with explicit subnets, so that tests can write
// addresses: the i-th (from 0) holds 10.200.<i+1>.0/24.
func tableNodes(names ...string) []nodeDef {
	out := make([]nodeDef, len(names))
	for i, n := range names {
		out[i] = nodeDef{Name: n, PodCIDR: fmt.Sprintf("10.200.%d.0/24", i+1)}
	}
	return out
}

// svc is a stateless Service with the given number of replicas.
func svc(name string, replicas int) workloadDef {
	return workloadDef{Service: true, Name: name, Replicas: replicas}
}

// reportOf builds a valid report of node at time at.
func reportOf(node string, at time.Time, insts ...report.Instance) report.Report {
	return report.Report{
		APIVersion: render.APIVersion, Kind: report.Kind, Node: node, Time: at,
		Capacity:  report.Capacity{CPU: 64000, Memory: 256 << 30},
		Instances: insts,
	}
}

// withVolumes returns r listing the given volumes.
func withVolumes(r report.Report, names ...string) report.Report {
	for _, n := range names {
		r.Volumes = append(r.Volumes, report.Volume{Name: n})
	}
	return r
}

// seen is an instance as a report lists it.
func seen(name string, state report.State, addr, hash string) report.Instance {
	var a netip.Addr
	if addr != "" {
		a = netip.MustParseAddr(addr)
	}
	return report.Instance{Name: name, State: state, Address: a, SpecHash: hash}
}

// hashOf is the current specHash of an instance of m.
func hashOf(t fataler, m *render.Model, name string) string {
	t.Helper()
	inst := m.Instance(name)
	if inst == nil {
		t.Fatalf("no instance %s in the model", name)
	}
	return inst.SpecHash
}

// hashAfter is the specHash of an instance's spec changed by edit: what a
// node running an older (or newer) version of the spec reports.
func hashAfter(t fataler, m *render.Model, name string, edit func(*render.JailSpec)) string {
	t.Helper()
	inst := m.Instance(name)
	if inst == nil {
		t.Fatalf("no instance %s in the model", name)
	}
	s := inst.Spec
	s.Command = slices.Clone(s.Command)
	s.Volumes = slices.Clone(s.Volumes)
	env := map[string]string{}
	for k, v := range s.Env {
		env[k] = v
	}
	s.Env = env
	edit(&s)
	if len(s.Env) == 0 {
		s.Env = nil
	}
	return render.SpecHash(s)
}

// Edits that make a spec differ by each class of change.
var (
	editImage   = func(s *render.JailSpec) { s.Image += "-old" }
	editEnv     = func(s *render.JailSpec) { s.Env["OLD"] = "1" }
	editCommand = func(s *render.JailSpec) { s.Command = append(s.Command, "--old") }
	editCPU     = func(s *render.JailSpec) { s.Resources.CPU += 10 }
)

// plan computes the plan of model m with the given reports, at commitC,
// with the reader's clock at t0.
func plan(m *render.Model, reports ...report.Report) *Plan {
	return Compute(Input{Model: m, Commit: commitC, Reports: reports, Now: t0})
}

func planJSON(t fataler, p *Plan) []byte {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("marshal plan: %v", err)
	}
	return b
}

func placementOf(p *Plan, inst string) *Placement {
	for i := range p.Placements {
		if p.Placements[i].Instance == inst {
			return &p.Placements[i]
		}
	}
	return nil
}

// nodeOfInstance is the node an instance is placed on, "" when none.
func nodeOfInstance(p *Plan, inst string) string {
	if pl := placementOf(p, inst); pl != nil {
		return pl.Node
	}
	return ""
}

func unschedulableOf(p *Plan, inst string) *Unschedulable {
	for i := range p.Unschedulable {
		if p.Unschedulable[i].Instance == inst {
			return &p.Unschedulable[i]
		}
	}
	return nil
}

func planNode(p *Plan, name string) *Node {
	for i := range p.Nodes {
		if p.Nodes[i].Name == name {
			return &p.Nodes[i]
		}
	}
	return nil
}

func planService(p *Plan, name string) *Service {
	for i := range p.Services {
		if p.Services[i].Name == name {
			return &p.Services[i]
		}
	}
	return nil
}

func planIngress(p *Plan, name string) *Ingress {
	for i := range p.Ingresses {
		if p.Ingresses[i].Name == name {
			return &p.Ingresses[i]
		}
	}
	return nil
}

// warningOf returns the first warning with this code and subject, or nil.
func warningOf(p *Plan, code, subject string) *Warning {
	for i := range p.Warnings {
		if w := &p.Warnings[i]; w.Code == code && w.Subject == subject {
			return w
		}
	}
	return nil
}

func aliveNames(p *Plan) []string {
	var out []string
	for _, n := range p.Nodes {
		if n.Alive {
			out = append(out, n.Name)
		}
	}
	return out
}

// effectiveReports replays the rule of "Reports and liveness" independently
// of the planner: per node of the inventory, the newest report not dated
// more than an hour ahead of now; between two of the same time, the one
// whose canonical form sorts last (any rule would do, as long as every
// agent applies the same).
func effectiveReports(m *render.Model, reports []report.Report, now time.Time) map[string]*report.Report {
	out := map[string]*report.Report{}
	for i := range reports {
		r := &reports[i]
		if m.Node(r.Node) == nil || r.Time.After(now.Add(time.Hour)) {
			continue
		}
		cur := out[r.Node]
		if cur == nil || r.Time.After(cur.Time) || (r.Time.Equal(cur.Time) && bytes.Compare(r.Marshal(), cur.Marshal()) > 0) {
			out[r.Node] = r
		}
	}
	return out
}

// hostOf is the last byte of an IPv4 address.
func hostOf(a netip.Addr) int { return int(a.As4()[3]) }

// addrIn is host h of the /24 p.
func addrIn(p netip.Prefix, h int) netip.Addr {
	b := p.Addr().As4()
	b[3] = byte(h)
	return netip.AddrFrom4(b)
}
