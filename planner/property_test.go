package planner

// Property tests over generated clusters (docs/architecture.md, "How it is tested"):
// up to 200 nodes with skewed clocks, dead nodes still holding volumes,
// duplicate and stale reports, full, drained and refusing nodes, malformed
// report files, pins, explicit addresses, rollouts and Ingresses.
// TestGeneratorCoverage proves that the generator produces each of these.

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// scenario is a generated cluster: its repository, the model rendered from
// it, and the reports an agent fetched (the malformed ones already dropped,
// as sync drops what report.Parse rejects).
type scenario struct {
	repo      repoDef
	model     *render.Model
	commit    string
	now       time.Time
	ttl       time.Duration
	reports   []report.Report // parsed, in ref order
	malformed []string        // how each report file report.Parse rejected was malformed
	stale     int             // older copies of a node's report
	ghosts    int             // reports of nodes outside the inventory
}

func (s *scenario) input() Input {
	return Input{Model: s.model, Commit: s.commit, Reports: slices.Clone(s.reports), Now: s.now}
}

var (
	genCPUs     = []string{"100m", "250m", "500m", "1", "2"}
	genMemories = []string{"128M", "256M", "512M", "1G", "2G"}
	genStates   = []report.State{report.StateRunning, report.StateRunning, report.StateRunning, report.StateStarting, report.StateCrashLoop, report.StateFailed, report.StateStopped}
)

// genScenario draws a scenario. Every choice is a rapid draw, so that a
// failing case shrinks towards a small cluster.
func genScenario(t *rapid.T) *scenario {
	ttl := time.Duration(rapid.SampledFrom([]int{30, 60}).Draw(t, "ttl")) * time.Second
	repo := repoDef{TTL: ttl.String()}
	// Mostly small clusters, where collisions are likely; some large ones.
	nNodes := rapid.IntRange(1, 24).Draw(t, "nodes")
	if rapid.IntRange(0, 6).Draw(t, "large") == 0 {
		nNodes = rapid.IntRange(25, 200).Draw(t, "nodes")
	}
	word := rapid.StringMatching(`[a-z]{1,4}`)
	for i := range nNodes {
		n := nodeDef{Name: fmt.Sprintf("%s%d", word.Draw(t, "node"), i), Labels: map[string]string{"zone": rapid.SampledFrom([]string{"x", "y", "z"}).Draw(t, "zone")}}
		if rapid.IntRange(0, 7).Draw(t, "ingressLabel") == 0 {
			n.Labels[IngressLabel] = "true"
		}
		if rapid.IntRange(0, 2).Draw(t, "ssd") == 0 {
			n.Labels["disk"] = "ssd"
		}
		n.Drained = rapid.IntRange(0, 9).Draw(t, "drained") == 0
		switch rapid.IntRange(0, 9).Draw(t, "capacityOverride") {
		case 0:
			n.CPU, n.Memory = rapid.SampledFrom([]string{"1", "2", "4", "16"}).Draw(t, "cpu"), rapid.SampledFrom([]string{"1G", "4G", "16G"}).Draw(t, "memory")
		case 1:
			n.CPU = rapid.SampledFrom([]string{"1", "2", "4"}).Draw(t, "cpu")
		}
		if rapid.IntRange(0, 3).Draw(t, "explicitSubnet") == 0 {
			n.PodCIDR = fmt.Sprintf("10.200.%d.0/24", i)
		}
		n.YML = rapid.IntRange(0, 4).Draw(t, "yml") == 0
		repo.Nodes = append(repo.Nodes, n)
	}
	randomNode := func(label string) string { return repo.Nodes[rapid.IntRange(0, nNodes-1).Draw(t, label)].Name }

	type stateful struct{ name, node string }
	var statefuls []stateful
	for k := range rapid.IntRange(0, 10).Draw(t, "services") {
		w := workloadDef{Service: true, Name: fmt.Sprintf("svc%d", k), Replicas: rapid.IntRange(0, 8).Draw(t, "replicas"),
			CPU: rapid.SampledFrom(genCPUs).Draw(t, "cpu"), Memory: rapid.SampledFrom(genMemories).Draw(t, "memory")}
		if rapid.IntRange(0, 3).Draw(t, "stateful") == 0 {
			w.Volumes = []string{"data"}
		}
		switch rapid.IntRange(0, 9).Draw(t, "constraint") {
		case 0:
			w.Selector = map[string]string{"zone": "x"}
		case 1:
			w.Selector = map[string]string{"disk": "ssd"}
		case 2:
			w.Node = randomNode("specNode")
		}
		if len(w.Volumes) > 0 {
			for i := range w.Replicas {
				statefuls = append(statefuls, stateful{fmt.Sprintf("%s-%d", w.Name, i), w.Node})
			}
		}
		repo.Workloads = append(repo.Workloads, w)
	}
	addrs := map[string]bool{}
	for k := range rapid.IntRange(0, 8).Draw(t, "jails") {
		w := workloadDef{Name: fmt.Sprintf("jail%d", k), CPU: rapid.SampledFrom(genCPUs).Draw(t, "cpu"), Memory: rapid.SampledFrom(genMemories).Draw(t, "memory")}
		if rapid.IntRange(0, 2).Draw(t, "stateful") == 0 {
			w.Volumes = []string{w.Name + "-vol"}
		}
		node := ""
		if rapid.IntRange(0, 3).Draw(t, "explicitAddress") == 0 {
			i := rapid.IntRange(0, nNodes-1).Draw(t, "addressNode")
			if repo.Nodes[i].PodCIDR != "" {
				a := fmt.Sprintf("10.200.%d.%d", i, rapid.IntRange(2, 12).Draw(t, "host"))
				if !addrs[a] {
					addrs[a] = true
					w.Address, node = a, repo.Nodes[i].Name
				}
			}
		}
		if len(w.Volumes) > 0 {
			statefuls = append(statefuls, stateful{w.Name, node})
		}
		repo.Workloads = append(repo.Workloads, w)
	}
	repo.Pins = map[string]string{}
	for _, s := range statefuls {
		if rapid.IntRange(0, 2).Draw(t, "pin") == 0 {
			repo.Pins[s.name] = cmpOr(s.node, randomNode("pinNode"))
		}
	}
	var services []string
	for _, w := range repo.Workloads {
		if w.Service {
			services = append(services, w.Name)
		}
	}
	if len(services) > 0 {
		for k := range rapid.IntRange(0, 3).Draw(t, "ingresses") {
			repo.Ingresses = append(repo.Ingresses, ingressDef{Name: fmt.Sprintf("ing%d", k), Host: fmt.Sprintf("h%d.example.com", k),
				Service: rapid.SampledFrom(services).Draw(t, "backend")})
		}
	}
	m := repo.model(t)

	sc := &scenario{repo: repo, model: m, commit: commitC, ttl: ttl, now: t0.Add(time.Duration(rapid.IntRange(0, 20).Draw(t, "now")) * time.Second)}

	// Each node's fate, and the report it would publish.
	const (
		fateAlive     = iota // dated around t0, ±40 s: its clock is skewed
		fateDead             // older than the TTL
		fateNever            // no report at all
		fateFuture           // dated more than an hour ahead of the reader
		fateMalformed        // a file report.Parse rejects
	)
	fates := make([]int, nNodes)
	reps := make([]*report.Report, nNodes)
	for i, n := range repo.Nodes {
		switch f := rapid.IntRange(0, 19).Draw(t, "fate"); {
		case f < 13:
			fates[i] = fateAlive
		case f < 16:
			fates[i] = fateDead
		case f < 17:
			fates[i] = fateNever
		case f < 18:
			fates[i] = fateFuture
		default:
			fates[i] = fateMalformed
		}
		var at time.Time
		switch fates[i] {
		case fateNever:
			continue
		case fateDead:
			at = t0.Add(-ttl - time.Duration(rapid.IntRange(1, 3600).Draw(t, "age"))*time.Second)
		case fateFuture:
			// Far enough past the limit that neither a stale copy (up to 5 min
			// older) nor another reader (clock off by 30 s) accepts it.
			at = sc.now.Add(time.Hour + time.Duration(rapid.IntRange(600, 48*3600).Draw(t, "ahead"))*time.Second)
		default:
			at = t0.Add(time.Duration(rapid.IntRange(-40000, 40000).Draw(t, "skewMillis")) * time.Millisecond)
		}
		r := reportOf(n.Name, at)
		r.Capacity = report.Capacity{
			CPU:    render.CPU(1000 * rapid.SampledFrom([]int{1, 2, 4, 8, 16}).Draw(t, "reportCPU")),
			Memory: render.Bytes(rapid.SampledFrom([]int64{2, 4, 8, 32, 64}).Draw(t, "reportMemory") << 30),
		}
		if rapid.IntRange(0, 9).Draw(t, "capacityUnknown") == 0 {
			r.Capacity = report.Capacity{}
		}
		switch rapid.IntRange(0, 11).Draw(t, "refused") {
		case 0, 1:
			r.Refused = &report.Refusal{Commit: commitC, Reason: "minAgentVersion 9.0.0"}
		case 2:
			r.Refused = &report.Refusal{Commit: "0badc0de", Reason: "untrusted"}
		}
		if rapid.IntRange(0, 7).Draw(t, "racctOff") == 0 {
			r = racctOff(r)
		}
		reps[i] = &r
	}
	withReport := func(label string) int {
		i := rapid.IntRange(0, nNodes-1).Draw(t, label)
		for reps[i] == nil {
			i = (i + 1) % nNodes
			if i == 0 && !slices.ContainsFunc(reps, func(r *report.Report) bool { return r != nil }) {
				return -1
			}
		}
		return i
	}
	hostOn := func(i int) netip.Addr {
		p := m.Node(repo.Nodes[i].Name).PodCIDR.Prefix
		switch rapid.IntRange(0, 3).Draw(t, "addressKind") {
		case 0:
			return netip.Addr{}
		case 1, 2:
			return addrIn(p, rapid.IntRange(2, 12).Draw(t, "host"))
		default:
			return addrIn(p, rapid.IntRange(2, 254).Draw(t, "host"))
		}
	}
	// A Service in the middle of a rollout: every replica runs on one
	// alive node, some at an older spec.
	rolling := map[string]bool{}
	for _, svc := range m.Services {
		rolling[svc.Name] = rapid.IntRange(0, 2).Draw(t, "rolling") == 0
	}
	withAliveReport := func(label string) int {
		i := withReport(label)
		for k := range nNodes {
			if j := (i + k) % nNodes; fates[j] == fateAlive {
				return j
			}
		}
		return i
	}
	if withReport("any") >= 0 {
		for _, inst := range m.Instances {
			var holders []int
			switch h := rapid.IntRange(0, 9).Draw(t, "holders"); {
			case rolling[inst.Service]:
				holders = []int{withAliveReport("holder")}
			case h >= 9:
				holders = []int{withReport("holder"), withReport("holder")}
			case h >= 5:
				holders = []int{withReport("holder")}
			}
			for k, i := range holders {
				if k > 0 && i == holders[0] {
					continue
				}
				hash := inst.SpecHash
				switch rapid.IntRange(0, 7).Draw(t, "hash") {
				case 3:
					hash = hashAfter(t, m, inst.Name, editImage)
				case 4:
					hash = hashAfter(t, m, inst.Name, editEnv)
				case 5:
					hash = hashAfter(t, m, inst.Name, editCPU)
				case 6:
					hash = "0123456789abcdef" // an older agent's
				}
				state := rapid.SampledFrom(genStates).Draw(t, "state")
				if rolling[inst.Service] && rapid.IntRange(0, 5).Draw(t, "rollingState") > 0 {
					state = report.StateRunning
				}
				reps[i].Instances = append(reps[i].Instances, report.Instance{
					Name: inst.Name, State: state, Address: hostOn(i), SpecHash: hash,
					Restarts: rapid.IntRange(0, 3).Draw(t, "restarts"),
				})
				if inst.Stateful {
					for _, v := range inst.Spec.Volumes {
						reps[i].Volumes = append(reps[i].Volumes, report.Volume{Name: v.Name})
					}
				}
			}
			if inst.Stateful && rapid.IntRange(0, 5).Draw(t, "volumesOnly") == 0 {
				i := withReport("volumeHolder")
				for _, v := range inst.Spec.Volumes {
					reps[i].Volumes = append(reps[i].Volumes, report.Volume{Name: v.Name})
				}
			}
		}
		for k, g := range m.Ingresses {
			if rapid.Bool().Draw(t, "certificate") {
				i := withReport("certificateHolder")
				reps[i].Certificates = append(reps[i].Certificates, report.Certificate{Host: g.Host, Expires: t0.Add(time.Duration(k+30) * 24 * time.Hour)})
			}
		}
	}
	// The report files an agent fetches: one per ref, and the stale copy
	// a lagging mirror may still serve.
	type reportFile struct {
		ref  string
		data []byte
		bad  string // how it is malformed; "" for a good report
	}
	var files []reportFile
	for i, r := range reps {
		if r == nil {
			continue
		}
		if rapid.IntRange(0, 9).Draw(t, "deleted") == 0 {
			r.Instances = append(r.Instances, report.Instance{Name: fmt.Sprintf("old%d", i), State: report.StateStopped, Address: hostOn(i), SpecHash: "beef"})
		}
		if rapid.IntRange(0, 7).Draw(t, "full") == 0 {
			// Full to capacity: exactly what it reports running.
			var sum render.Resources
			for _, ri := range r.Instances {
				if inst := m.Instance(ri.Name); inst != nil {
					sum.CPU += inst.Spec.Resources.CPU
					sum.Memory += inst.Spec.Resources.Memory
				}
			}
			r.Capacity = report.Capacity{CPU: max(sum.CPU, 10), Memory: max(sum.Memory, 1)}
		}
		ref := r.Node
		if rapid.IntRange(0, 9).Draw(t, "stale") == 0 {
			// Usually older; sometimes a second report of the same time
			// with other content, which a fixed rule must break.
			old := *r
			old.Time = r.Time.Add(-time.Duration(rapid.IntRange(0, 300).Draw(t, "staleAge")) * time.Second)
			old.Instances = slices.Clone(r.Instances[:rapid.IntRange(0, len(r.Instances)).Draw(t, "staleKeep")])
			old.Volumes = nil
			files = append(files, reportFile{ref, old.Marshal(), ""})
			sc.stale++
		}
		data, bad := r.Marshal(), ""
		if fates[i] == fateMalformed {
			data, bad = malform(t, *r)
		}
		files = append(files, reportFile{ref, data, bad})
	}
	if rapid.IntRange(0, 3).Draw(t, "ghost") == 0 {
		g := reportOf("ghost", t0.Add(time.Duration(rapid.IntRange(-40, 400).Draw(t, "ghostTime"))*time.Second))
		files = append(files, reportFile{"ghost", g.Marshal(), ""})
		sc.ghosts++
	}
	// What sync does with the files: parse each on its ref, drop the bad.
	for _, f := range files {
		r, err := report.Parse(f.data, f.ref)
		switch {
		case f.bad != "" && err == nil:
			t.Fatalf("report.Parse accepted a malformed report (%s):\n%s", f.bad, f.data)
		case f.bad != "":
			sc.malformed = append(sc.malformed, f.bad)
		case err != nil:
			t.Fatalf("report.Parse rejected a good report of %s: %v\n%s", f.ref, err, f.data)
		default:
			sc.reports = append(sc.reports, r)
		}
	}
	return sc
}

// malform turns a report into a file that report.Parse must reject, and
// says how.
func malform(t *rapid.T, r report.Report) ([]byte, string) {
	replace := func(data []byte, old, new string) []byte {
		if !bytes.Contains(data, []byte(old)) {
			t.Fatalf("malform: %q not in\n%s", old, data)
		}
		return bytes.Replace(data, []byte(old), []byte(new), 1)
	}
	if len(r.Instances) == 0 {
		r.Instances = []report.Instance{{Name: "x", State: report.StateRunning}}
	}
	switch kind := rapid.IntRange(0, 11).Draw(t, "malformed"); kind {
	case 0:
		r.Node += "x"
		return r.Marshal(), "speaks for another node"
	case 1:
		r.Instances[0].State = "sleeping"
		return r.Marshal(), "unknown state"
	case 2:
		return replace(r.Marshal(), "instances:\n  - name: ", "instances:\n  - address: 10.200.1.300\n    name: "), "bad address"
	case 3:
		return replace(r.Marshal(), "time: ", "clock: "), "no time"
	case 4:
		return replace(r.Marshal(), "kind: Report", "kind: Jail"), "wrong kind"
	case 5:
		return replace(r.Marshal(), "node: ", "node: [unclosed "), "invalid YAML"
	case 6:
		r.Commit = "not-hex!"
		return r.Marshal(), "commit not hex"
	case 7:
		r.Capacity = report.Capacity{CPU: 2000, Memory: 1 << 30}
		return replace(r.Marshal(), "capacity:\n  cpu: ", "capacity:\n  cpu: lots\n  oldcpu: "), "bad cpu"
	case 8:
		r.Instances[0].Name = "Web_0"
		return r.Marshal(), "bad instance name"
	case 9:
		return nil, "empty file"
	case 10:
		return replace(r.Marshal(), "apiVersion: keel/v1", "apiVersion: keel/v2"), "wrong apiVersion"
	default:
		r.Volumes = append(r.Volumes, report.Volume{Name: "Bad Vol"})
		return r.Marshal(), "bad volume name"
	}
}

// features lists what a scenario exercises, judged from its input and plan.
func features(sc *scenario, p *Plan) []string {
	var out []string
	add := func(ok bool, name string) {
		if ok {
			out = append(out, name)
		}
	}
	eff := effectiveReports(sc.model, sc.reports, sc.now)
	alive := map[string]bool{}
	for _, n := range aliveNames(p) {
		alive[n] = true
	}
	reporters := map[string]int{}
	var aliveTimes []time.Time
	deadHolder := false
	for name, r := range eff {
		if alive[name] {
			aliveTimes = append(aliveTimes, r.Time)
			for _, ri := range r.Instances {
				if sc.model.Instance(ri.Name) != nil {
					reporters[ri.Name]++
				}
			}
		} else {
			for _, v := range r.Volumes {
				if volumeOwner(sc.model, v.Name) != nil {
					deadHolder = true
				}
			}
		}
	}
	dup := false
	for _, c := range reporters {
		dup = dup || c >= 2
	}
	add(dup, "duplicate-alive-reports")
	add(deadHolder, "dead-node-holding-volumes")
	if len(aliveTimes) >= 2 {
		add(slices.MaxFunc(aliveTimes, time.Time.Compare).Sub(slices.MinFunc(aliveTimes, time.Time.Compare)) >= 20*time.Second, "clocks-skewed-20s+")
	}
	full, refused, drained := false, false, false
	for _, n := range p.Nodes {
		full = full || (n.Alive && !n.Unlimited && (n.Committed.CPU >= n.Capacity.CPU || n.Committed.Memory >= n.Capacity.Memory))
		refused = refused || n.RefusedCommit
		drained = drained || !n.Schedulable
	}
	add(full, "node-full-to-capacity")
	add(slices.ContainsFunc(p.Nodes, func(n Node) bool { return n.Alive && n.Unlimited }), "node-capacity-unknown")
	add(refused, "node-refused-commit")
	add(drained, "node-drained")
	add(slices.ContainsFunc(p.Nodes, func(n Node) bool { return n.Alive && n.LimitsOff }), "node-limits-off")
	add(len(sc.malformed) > 0, "malformed-reports-dropped")
	for _, m := range sc.malformed {
		if !slices.Contains(out, "malformed:"+m) {
			out = append(out, "malformed:"+m)
		}
	}
	add(sc.stale > 0, "stale-report-copies")
	add(sc.ghosts > 0, "reports-of-unknown-nodes")
	codes := map[string]bool{}
	for _, w := range p.Warnings {
		codes[w.Code] = true
	}
	for _, c := range []string{WarnReportIgnored, WarnPinnedDead, WarnHeldTwice, WarnOverCapacity, WarnDuplicate, WarnRolloutPaused, WarnUnschedulable, WarnRefused, WarnIngressNoNode, WarnSpecNodeIgnore, WarnUnpinned} {
		add(codes[c], "warning:"+c)
	}
	reasons := map[string]bool{}
	released := false
	for _, pl := range p.Placements {
		reasons[pl.Reason] = true
		released = released || (pl.Released && pl.Service != "")
	}
	for _, r := range []string{ReasonPinned, ReasonHeld, ReasonSticky, ReasonNew} {
		add(reasons[r], "placement:"+r)
	}
	add(released, "rollout-released")
	for _, svc := range sc.model.Services {
		n := 0
		for _, name := range svc.Instances {
			if pl := placementOf(p, name); pl != nil && pl.Outdated != "" {
				if r := eff[pl.Node]; r != nil && r.Instance(name) != nil && r.Instance(name).State == report.StateRunning {
					n++
				}
			}
		}
		if n >= 2 {
			add(!slices.Contains(out, "rollout-2+-outdated-running"), "rollout-2+-outdated-running")
		}
	}
	add(len(p.Nodes) >= 100, "100+-nodes")
	return out
}

// volumeOwner is the instance of m that has volume v, or nil.
func volumeOwner(m *render.Model, v string) *render.Instance {
	for i := range m.Instances {
		for _, vol := range m.Instances[i].Spec.Volumes {
			if vol.Name == v {
				return &m.Instances[i]
			}
		}
	}
	return nil
}

// TestGeneratorCoverage draws a fixed set of scenarios and checks that the
// generator produces every situation the properties are meant to cover.
func TestGeneratorCoverage(t *testing.T) {
	const draws = 120
	gen := rapid.Custom(genScenario)
	counts := map[string]int{}
	for i := range draws {
		sc := gen.Example(i)
		for _, f := range features(sc, Compute(sc.input())) {
			counts[f]++
		}
	}
	var lines []string
	for _, k := range sortedKeys(counts) {
		lines = append(lines, fmt.Sprintf("%-32s %d", k, counts[k]))
	}
	t.Logf("features over %d scenarios:\n%s", draws, strings.Join(lines, "\n"))
	for _, want := range []string{
		"duplicate-alive-reports", "dead-node-holding-volumes", "clocks-skewed-20s+", "node-full-to-capacity",
		"node-refused-commit", "node-drained", "node-limits-off", "malformed-reports-dropped",
		"stale-report-copies", "reports-of-unknown-nodes", "100+-nodes",
		"warning:" + WarnHeldTwice, "warning:" + WarnPinnedDead, "warning:" + WarnOverCapacity, "warning:" + WarnReportIgnored,
		"placement:" + ReasonPinned, "placement:" + ReasonHeld, "placement:" + ReasonSticky, "placement:" + ReasonNew,
		"rollout-released", "rollout-2+-outdated-running",
	} {
		if counts[want] == 0 {
			t.Errorf("no scenario in %d has %s", draws, want)
		}
	}
}

// shuffled returns the reports in another order, each with its lists in
// another order too, as another agent may have fetched them.
func shuffled(rng *rand.Rand, reports []report.Report) []report.Report {
	rs := slices.Clone(reports)
	rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	for k := range rs {
		rs[k].Instances = slices.Clone(rs[k].Instances)
		rng.Shuffle(len(rs[k].Instances), func(i, j int) { rs[k].Instances[i], rs[k].Instances[j] = rs[k].Instances[j], rs[k].Instances[i] })
		rs[k].Volumes = slices.Clone(rs[k].Volumes)
		rng.Shuffle(len(rs[k].Volumes), func(i, j int) { rs[k].Volumes[i], rs[k].Volumes[j] = rs[k].Volumes[j], rs[k].Volumes[i] })
		rs[k].Certificates = slices.Clone(rs[k].Certificates)
		rng.Shuffle(len(rs[k].Certificates), func(i, j int) {
			rs[k].Certificates[i], rs[k].Certificates[j] = rs[k].Certificates[j], rs[k].Certificates[i]
		})
	}
	return rs
}

func TestPropertyShuffledInputSamePlan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		want := Compute(sc.input())
		wantJSON := planJSON(t, want)
		seed := rapid.Uint64().Draw(t, "shuffle")
		rng := rand.New(rand.NewPCG(seed, ^seed))
		// Another agent: the same commit checked out with the documents in
		// other files, the report refs listed in another order, its own
		// clock off by up to half a minute, but (like the first) not so far
		// behind the newest report that the clock cap applies: readers
		// agree whatever their clocks within that bound.
		now := sc.now // capped: only the same clock gives the same cap
		if want.ClusterTime.Before(sc.now.Add(sc.ttl / 3)) {
			now = want.ClusterTime.Add(-sc.ttl / 3).Add(time.Duration(rng.IntN(60001)) * time.Millisecond)
		}
		in := Input{
			Model:   renderFS(t, sc.repo.fs(rng)),
			Commit:  sc.commit,
			Reports: shuffled(rng, sc.reports),
			Now:     now,
		}
		got := Compute(in)
		if gotJSON := planJSON(t, got); !bytes.Equal(gotJSON, wantJSON) {
			t.Fatalf("plans differ:\n%s", firstDiff(gotJSON, wantJSON))
		}
		if got.PlanID != want.PlanID {
			t.Fatalf("plan ID %s, want %s", got.PlanID, want.PlanID)
		}
	})
}

// firstDiff shows where two byte strings first differ.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-200)
	return fmt.Sprintf("at byte %d:\n got: …%s\nwant: …%s", i, a[lo:min(len(a), i+200)], b[lo:min(len(b), i+200)])
}

// capacityOf replays the capacity rule: the Node file's override field by
// field, else the report's; unknown when neither gives both.
func capacityOf(n *render.Node, r *report.Report) (render.Resources, bool) {
	var c render.Resources
	if r != nil {
		c = render.Resources{CPU: r.Capacity.CPU, Memory: r.Capacity.Memory}
	}
	if n.Capacity != nil {
		if n.Capacity.CPU != 0 {
			c.CPU = n.Capacity.CPU
		}
		if n.Capacity.Memory != 0 {
			c.Memory = n.Capacity.Memory
		}
	}
	return c, c.CPU != 0 && c.Memory != 0
}

func TestPropertyNewPlacementsNeverOverCommit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		p := Compute(sc.input())
		eff := effectiveReports(sc.model, sc.reports, sc.now)
		sum := map[string]render.Resources{}
		count := map[string]int{}
		hasNew := map[string]bool{}
		for _, pl := range p.Placements {
			inst := sc.model.Instance(pl.Instance)
			s := sum[pl.Node]
			s.CPU += inst.Spec.Resources.CPU
			s.Memory += inst.Spec.Resources.Memory
			sum[pl.Node] = s
			count[pl.Node]++
			hasNew[pl.Node] = hasNew[pl.Node] || pl.Reason == ReasonNew
		}
		for _, n := range p.Nodes {
			capacity, known := capacityOf(sc.model.Node(n.Name), eff[n.Name])
			if n.Unlimited == known || (known && n.Capacity != capacity) {
				t.Fatalf("%s: capacity %+v (unlimited %v), want %+v (known %v)", n.Name, n.Capacity, n.Unlimited, capacity, known)
			}
			if n.Committed != sum[n.Name] {
				t.Fatalf("%s: committed %+v, but its placements sum to %+v", n.Name, n.Committed, sum[n.Name])
			}
			if !hasNew[n.Name] {
				continue
			}
			if known && (sum[n.Name].CPU > capacity.CPU || sum[n.Name].Memory > capacity.Memory) {
				t.Fatalf("%s has new placements and %+v committed, over its capacity %+v", n.Name, sum[n.Name], capacity)
			}
			if count[n.Name] > maxPerNode {
				t.Fatalf("%s has new placements and %d instances, more than its /24 holds", n.Name, count[n.Name])
			}
		}
	})
}

func TestPropertyStatefulStaysWithItsData(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		p := Compute(sc.input())
		eff := effectiveReports(sc.model, sc.reports, sc.now)
		holders := map[string][]string{} // volume → nodes listing it
		for _, name := range sortedKeys(eff) {
			for _, v := range eff[name].Volumes {
				if !slices.Contains(holders[v.Name], name) {
					holders[v.Name] = append(holders[v.Name], name)
				}
			}
		}
		seen := map[string]bool{}
		for _, pl := range p.Placements {
			if seen[pl.Instance] {
				t.Fatalf("%s is placed twice", pl.Instance)
			}
			seen[pl.Instance] = true
		}
		for _, inst := range sc.model.Instances {
			if !inst.Stateful {
				continue
			}
			pl := placementOf(p, inst.Name)
			if pin, ok := sc.model.Lock.Pins[inst.Name]; ok {
				if pl == nil || pl.Node != pin || pl.Reason != ReasonPinned {
					t.Fatalf("%s is pinned to %s but placed %+v", inst.Name, pin, pl)
				}
				continue
			}
			var held []string
			for _, v := range inst.Spec.Volumes {
				for _, h := range holders[v.Name] {
					if !slices.Contains(held, h) {
						held = append(held, h)
					}
				}
			}
			switch {
			case len(held) > 1:
				if pl != nil {
					t.Fatalf("%s's volumes are on %v, yet it is placed on %s", inst.Name, held, pl.Node)
				}
			case len(held) == 1:
				if pl == nil || pl.Node != held[0] || pl.Reason != ReasonHeld {
					t.Fatalf("%s's volumes are on %s, yet it is placed %+v", inst.Name, held[0], pl)
				}
			}
		}
	})
}

func TestPropertyAddingANodeMovesNoStickyInstance(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		// Lock the subnets, as keel lock does before a node joins, so that
		// the newcomer's subnet cannot push another node's.
		// The model with that lock allocates and pins exactly as sc.model.
		before := sc.repo
		before.Pins, before.Lock = nil, render.NewLock(sc.model).Marshal()
		pA := Compute(sc.input())

		after := before
		newcomer := nodeDef{Name: "new" + rapid.StringMatching(`[a-z]{0,4}`).Draw(t, "newcomer"),
			Labels: map[string]string{"zone": rapid.SampledFrom([]string{"x", "y"}).Draw(t, "zone")}}
		if rapid.Bool().Draw(t, "ingressLabel") {
			newcomer.Labels[IngressLabel] = "true"
		}
		after.Nodes = append(slices.Clone(before.Nodes), newcomer)
		mB := renderFS(t, after.fs(nil))
		reports := slices.Clone(sc.reports)
		reported := rapid.Bool().Draw(t, "reported")
		if reported {
			// Its first report is no newer than the cluster's newest, so
			// that nobody's liveness changes with it.
			at := pA.ClusterTime
			if at.IsZero() {
				at = t0
			}
			reports = append(reports, reportOf(newcomer.Name, at.Add(-time.Duration(rapid.IntRange(0, 5000).Draw(t, "lag"))*time.Millisecond)))
		}
		pB := Compute(Input{Model: mB, Commit: sc.commit, Reports: reports, Now: sc.now})
		eff := effectiveReports(sc.model, sc.reports, sc.now)
		for _, a := range pA.Placements {
			b := placementOf(pB, a.Instance)
			switch {
			case !reported:
				// A node that has not reported is dead: nothing changes.
				if b == nil || !reflect.DeepEqual(*b, a) {
					t.Fatalf("%s placed %+v, then %+v once a silent node joined", a.Instance, a, b)
				}
			case a.Reason != ReasonNew:
				if b == nil || b.Node != a.Node || b.Reason != a.Reason {
					t.Fatalf("%s placed %+v, then %+v once %s joined", a.Instance, a, b, newcomer.Name)
				}
				// The address it reports and keeps stays kept. (One that
				// reports no address, or one another instance has, gets one
				// by probing, which new placements on the node may shift.)
				if ri := reportedAt(eff, a.Node, a.Instance); ri != nil && a.Address == ri.Address && b.Address != a.Address {
					t.Fatalf("%s reports %s on %s, placed there at %s, then at %s once %s joined", a.Instance, ri.Address, a.Node, a.Address, b.Address, newcomer.Name)
				}
			}
		}
		if !reported && len(pA.Unschedulable) != len(pB.Unschedulable) {
			t.Fatalf("a silent node changed what is unschedulable: %v then %v", pA.Unschedulable, pB.Unschedulable)
		}
	})
}

func TestPropertyDeadNodeLosesOnlyItsStatelessWork(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		pA := Compute(sc.input())
		// A node can die without moving the cluster's newest report time
		// when it is not the only one to hold it.
		atNewest := 0
		for _, n := range pA.Nodes {
			if n.Alive && n.ReportTime.Equal(pA.ClusterTime) {
				atNewest++
			}
		}
		var candidates []string
		for _, n := range pA.Nodes {
			if n.Alive && !n.ReportTime.IsZero() && (n.ReportTime.Before(pA.ClusterTime) || atNewest > 1) {
				candidates = append(candidates, n.Name)
			}
		}
		if len(candidates) == 0 {
			return
		}
		x := rapid.SampledFrom(candidates).Draw(t, "dies")
		eff := effectiveReports(sc.model, sc.reports, sc.now)
		last := *eff[x]
		last.Time = pA.ClusterTime.Add(-sc.ttl - time.Duration(rapid.IntRange(1, 100000).Draw(t, "pastTTLMillis"))*time.Millisecond)
		reports := []report.Report{last}
		for _, r := range sc.reports {
			if r.Node != x {
				reports = append(reports, r)
			}
		}
		pB := Compute(Input{Model: sc.model, Commit: sc.commit, Reports: reports, Now: sc.now})
		wantAlive := slices.DeleteFunc(aliveNames(pA), func(n string) bool { return n == x })
		if got := aliveNames(pB); !slices.Equal(got, wantAlive) {
			t.Fatalf("alive %v after %s died, want %v", got, x, wantAlive)
		}
		for _, a := range pA.Placements {
			b := placementOf(pB, a.Instance)
			stateful := sc.model.Instance(a.Instance).Stateful
			switch {
			case a.Node == x && !stateful:
				if b != nil && b.Node == x {
					t.Fatalf("stateless %s stays on dead %s: %+v", a.Instance, x, b)
				}
			case a.Node == x && (a.Reason == ReasonPinned || a.Reason == ReasonHeld):
				if b == nil || b.Node != x {
					t.Fatalf("stateful %s (%s) left dead %s: %+v", a.Instance, a.Reason, x, b)
				}
			case a.Node != x && a.Reason != ReasonNew:
				if b == nil || b.Node != a.Node {
					t.Fatalf("%s (%s on %s) moved when %s died: %+v", a.Instance, a.Reason, a.Node, x, b)
				}
			}
		}
	})
}

func TestPropertyPlacedOrUnschedulable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		p := Compute(sc.input())
		placed, unsched := map[string]int{}, map[string]int{}
		for _, pl := range p.Placements {
			placed[pl.Instance]++
			inst := sc.model.Instance(pl.Instance)
			switch {
			case inst == nil:
				t.Fatalf("placement of unknown instance %s", pl.Instance)
			case sc.model.Node(pl.Node) == nil:
				t.Fatalf("%s placed on unknown node %s", pl.Instance, pl.Node)
			case pl.Service != inst.Service:
				t.Fatalf("%s placed as a replica of %q, want %q", pl.Instance, pl.Service, inst.Service)
			case !slices.Contains([]string{ReasonPinned, ReasonHeld, ReasonSticky, ReasonNew}, pl.Reason):
				t.Fatalf("%s placed for reason %q", pl.Instance, pl.Reason)
			case planNode(p, pl.Node).LimitsOff && limited(inst) && pl.Reason != ReasonPinned && pl.Reason != ReasonHeld:
				t.Fatalf("%s (limits %+v) placed on %s, which cannot enforce them, for reason %q", pl.Instance, inst.Spec.Resources, pl.Node, pl.Reason)
			}
		}
		for _, u := range p.Unschedulable {
			unsched[u.Instance]++
			if strings.TrimSpace(u.Reason) == "" {
				t.Fatalf("%s is unschedulable without a reason", u.Instance)
			}
			if sc.model.Instance(u.Instance) == nil {
				t.Fatalf("unknown instance %s listed unschedulable", u.Instance)
			}
			if warningOf(p, WarnUnschedulable, u.Instance) == nil {
				t.Fatalf("%s is unschedulable without a warning", u.Instance)
			}
		}
		for _, inst := range sc.model.Instances {
			if placed[inst.Name]+unsched[inst.Name] != 1 {
				t.Fatalf("%s: placed %d times and unschedulable %d times, want exactly one of them once", inst.Name, placed[inst.Name], unsched[inst.Name])
			}
		}
	})
}

func TestPropertyRolloutKeepsMinAvailable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		p := Compute(sc.input())
		eff := effectiveReports(sc.model, sc.reports, sc.now)
		for _, pl := range p.Placements {
			inst := sc.model.Instance(pl.Instance)
			var want render.ChangeClass
			if ri := reportedAt(eff, pl.Node, pl.Instance); ri != nil {
				if c := render.ClassifyHashChange(ri.SpecHash, inst.SpecHash); c == render.ChangeReplace || c == render.ChangeRestart {
					want = c
				}
			}
			if pl.Outdated != want {
				t.Fatalf("%s outdated %q, want %q", pl.Instance, pl.Outdated, want)
			}
			if pl.Released && pl.Outdated == "" {
				t.Fatalf("%s released with nothing to update", pl.Instance)
			}
		}
		// No plan takes more available members of a Service out of
		// service than its strategy allows: those available (ready on an
		// alive node) may fall to Replicas − maxUnavailable and no lower,
		// and the ones released are the first outdated ones in index
		// order. Whatever reports arrive, in whatever order: the
		// scenario's are random, stale, duplicated and shuffled.
		alive := map[string]bool{}
		for _, n := range p.Nodes {
			alive[n.Name] = n.Alive
		}
		for _, svc := range sc.model.Services {
			st := strategyOf(&svc)
			var available, outdatedAvailable, released []string
			for _, name := range append(slices.Clone(svc.Instances), svc.Surge...) {
				pl := placementOf(p, name)
				if pl == nil {
					continue
				}
				ri := reportedAt(eff, pl.Node, name)
				if ri == nil || !alive[pl.Node] || !ri.IsReady() {
					continue
				}
				available = append(available, name)
				if pl.Outdated != "" {
					outdatedAvailable = append(outdatedAvailable, name)
				}
				if pl.Released {
					released = append(released, name)
				}
			}
			allowed := max(0, len(available)-(len(svc.Instances)-st.MaxUnavailable))
			if len(released) > allowed || len(released) > st.MaxUnavailable+st.MaxSurge {
				t.Fatalf("Service %s: %d available members released at once (%v), %d allowed (%d available of %d replicas, maxUnavailable %d)",
					svc.Name, len(released), released, allowed, len(available), len(svc.Instances), st.MaxUnavailable)
			}
			if !slices.Equal(released, outdatedAvailable[:len(released)]) {
				t.Fatalf("Service %s: released %v, want the first outdated ones in index order %v", svc.Name, released, outdatedAvailable)
			}
		}
	})
}

// reportedAt is the entry for inst in the effective report of node, or nil.
func reportedAt(eff map[string]*report.Report, node, inst string) *report.Instance {
	if r := eff[node]; r != nil {
		return r.Instance(inst)
	}
	return nil
}

// TestPropertyOutputsAgreeWithReports checks the rest of the plan against
// the rules replayed independently: liveness, endpoints, addresses and
// Ingress owners.
func TestPropertyOutputsAgreeWithReports(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		p := Compute(sc.input())
		eff := effectiveReports(sc.model, sc.reports, sc.now)
		var newest time.Time
		for _, r := range eff {
			if r.Time.After(newest) {
				newest = r.Time
			}
		}
		// The newest report's time, but never more than MaxClockLead ahead
		// of the reader's clock.
		if limit := sc.now.Add(sc.ttl / 3); newest.After(limit) {
			newest = limit
		}
		if !p.ClusterTime.Equal(newest) {
			t.Fatalf("cluster time %s, want the newest report's %s (capped at now + TTL/3)", p.ClusterTime, newest)
		}
		alive := map[string]bool{}
		for _, n := range p.Nodes {
			r := eff[n.Name]
			want := r != nil && newest.Sub(r.Time) <= sc.ttl
			if n.Alive != want {
				t.Fatalf("%s alive %v, want %v", n.Name, n.Alive, want)
			}
			alive[n.Name] = n.Alive
			if refused := r != nil && r.Refused != nil && r.Refused.Commit == sc.commit; n.RefusedCommit != refused {
				t.Fatalf("%s refused %v, want %v", n.Name, n.RefusedCommit, refused)
			}
			if off := r != nil && r.LimitsOff(); n.LimitsOff != off {
				t.Fatalf("%s limits off %v, want %v", n.Name, n.LimitsOff, off)
			}
		}
		for _, svc := range sc.model.Services {
			var want []Endpoint
			taken := map[netip.Addr]bool{} // one endpoint per address
			placedOn := map[string]Placement{}
			for _, pl := range p.Placements {
				placedOn[pl.Instance] = pl
			}
			// A copy leaves the endpoints when its node is about to stop
			// it: a surge instance no longer placed, a copy away from its
			// placement once the placement's copy is ready (at once when
			// stateful), a copy released for a restart or a replace.
			draining := func(name, node string) bool {
				pl, ok := placedOn[name]
				inst := sc.model.Instance(name)
				switch {
				case !ok:
					return inst.Surge
				case node != pl.Node:
					kept := reportedAt(eff, pl.Node, name)
					return inst.Stateful || (kept != nil && kept.IsReady())
				default:
					return pl.Released
				}
			}
			for _, name := range append(slices.Clone(svc.Instances), svc.Surge...) {
				for _, node := range sortedKeys(eff) {
					// Nodes are in name order in the model, as in sortedKeys.
					if ri := eff[node].Instance(name); alive[node] && ri != nil && ri.IsReady() && ri.Address.IsValid() && !taken[ri.Address] && !draining(name, node) {
						taken[ri.Address] = true
						want = append(want, Endpoint{Instance: name, Node: node, Address: ri.Address})
					}
				}
			}
			got := planService(p, svc.Name)
			if got == nil || len(got.Endpoints) != len(want) || (len(want) > 0 && !slices.Equal(got.Endpoints, want)) {
				t.Fatalf("Service %s endpoints %+v, want %+v", svc.Name, got, want)
			}
		}
		checkAddresses(t, p, sc.model)
		anyLabelled := false
		for _, n := range sc.model.Nodes {
			anyLabelled = anyLabelled || (alive[n.Name] && n.Labels[IngressLabel] == "true")
		}
		for _, g := range p.Ingresses {
			switch {
			case len(aliveNames(p)) == 0:
				if g.Owner != "" {
					t.Fatalf("Ingress %s owned by %s with no node alive", g.Name, g.Owner)
				}
			case !alive[g.Owner]:
				t.Fatalf("Ingress %s owned by %q, which is not alive", g.Name, g.Owner)
			case anyLabelled && sc.model.Node(g.Owner).Labels[IngressLabel] != "true":
				t.Fatalf("Ingress %s owned by unlabelled %s while a labelled node is alive", g.Name, g.Owner)
			}
		}
	})
}

// TestPropertyHostileClocks (issue 8 items 3, 4, 8) adds hostile reports to
// a scenario: ghosts (nodes outside the inventory) dated anywhere from the
// epoch to years ahead and listing any instance in any state, and copies
// of inventory reports dated far ahead, far behind or at equal times. The
// clock and the cluster time stay within MaxClockLead of the reader; a
// ghost moves nothing; every stateful placement waits for every other node
// whose newest report lists it not stopped, and for no other.
func TestPropertyHostileClocks(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		lead := MaxClockLead(sc.model)
		if lead != sc.ttl/3 {
			t.Fatalf("MaxClockLead %s for TTL %s", lead, sc.ttl)
		}
		hostileTime := func(label string) time.Time {
			switch rapid.IntRange(0, 5).Draw(t, label+"Kind") {
			case 0:
				return time.Unix(0, 0).UTC() // far past
			case 1:
				return sc.now.Add(time.Duration(rapid.IntRange(1, 20*365*24).Draw(t, label+"Hours")) * time.Hour) // far future
			case 2:
				return sc.now // equal to the reader
			case 3:
				return sc.now.Add(lead) // exactly the bound
			case 4:
				return sc.now.Add(lead + time.Millisecond) // just past it
			default:
				return sc.now.Add(time.Duration(rapid.IntRange(-7200, 7200).Draw(t, label+"Secs")) * time.Second)
			}
		}
		var names []string
		for _, inst := range sc.model.Instances {
			names = append(names, inst.Name)
		}
		var ghosts []report.Report
		for g := range rapid.IntRange(0, 3).Draw(t, "ghosts") {
			r := reportOf(fmt.Sprintf("ghost%d", g), hostileTime("ghost"))
			if len(names) > 0 {
				for range rapid.IntRange(0, 3).Draw(t, "ghostInstances") {
					name := rapid.SampledFrom(names).Draw(t, "ghostInstance")
					if r.Instance(name) == nil {
						r.Instances = append(r.Instances, report.Instance{Name: name, State: rapid.SampledFrom(genStates).Draw(t, "ghostState")})
					}
				}
			}
			ghosts = append(ghosts, r)
		}
		reports := slices.Clone(sc.reports)
		for range rapid.IntRange(0, 2).Draw(t, "liars") {
			if len(sc.reports) == 0 {
				break
			}
			liar := rapid.SampledFrom(sc.reports).Draw(t, "liar")
			liar.Time = hostileTime("liar")
			if rapid.Bool().Draw(t, "liarClock") {
				liar.Clock = hostileTime("liarClock")
			}
			reports = append(reports, liar)
		}
		in := Input{Model: sc.model, Commit: sc.commit, Reports: reports, Now: sc.now}
		p := Compute(in)
		if p.ClusterTime.After(sc.now.Add(lead)) {
			t.Fatalf("cluster time %s, more than %s ahead of the reader's %s", p.ClusterTime, lead, sc.now)
		}
		withGhosts := append(slices.Clone(reports), ghosts...)
		if c := PeerClock(sc.model, withGhosts, sc.now); c.Before(sc.now) || c.After(sc.now.Add(lead)) {
			t.Fatalf("peer clock %s, outside [now, now+%s]", c, lead)
		}
		// A ghost moves nothing: same alive set, same nodes, same addresses.
		in.Reports = withGhosts
		pg := Compute(in)
		if !slices.Equal(aliveNames(pg), aliveNames(p)) || !pg.ClusterTime.Equal(p.ClusterTime) {
			t.Fatalf("ghosts changed the alive set %v → %v or the cluster time", aliveNames(p), aliveNames(pg))
		}
		for _, a := range p.Placements {
			b := placementOf(pg, a.Instance)
			if b == nil || b.Node != a.Node || b.Address != a.Address || b.Generation != a.Generation {
				t.Fatalf("ghosts moved %s: %+v → %+v", a.Instance, a, b)
			}
		}
		// Break before make, replayed: the newest report of each node.
		newest := map[string]*report.Report{}
		for i := range withGhosts {
			r := &withGhosts[i]
			if cur := newest[r.Node]; cur == nil || r.Time.After(cur.Time) || (r.Time.Equal(cur.Time) && bytes.Compare(r.Marshal(), cur.Marshal()) > 0) {
				newest[r.Node] = r
			}
		}
		for _, pl := range pg.Placements {
			if !sc.model.Instance(pl.Instance).Stateful {
				if len(pl.WaitsFor) > 0 {
					t.Fatalf("stateless %s waits for %v", pl.Instance, pl.WaitsFor)
				}
				continue
			}
			var want []string
			for node, r := range newest {
				if ri := r.Instance(pl.Instance); node != pl.Node && ri != nil && ri.State != report.StateStopped {
					want = append(want, node)
				}
			}
			slices.Sort(want)
			if !slices.Equal(pl.WaitsFor, want) {
				t.Fatalf("stateful %s on %s waits for %v, want %v", pl.Instance, pl.Node, pl.WaitsFor, want)
			}
		}
	})
}

// TestPropertyLivenessHysteresis (issue 8 item 8) replays a sequence of
// plans: 2 to 5 agents, each passing at its own rate with a skewed clock
// and planning from the reports published so far (its own view); starved
// nodes skip passes for 25 to 35 s at a time (their reports arrive around
// the TTL of 30 s), some nodes die for good, and a stateful instance's pin
// moves. Checked at every start (see sim.start): (a) a stateful instance
// never starts while another node runs it or while a report the starter
// has lists it not stopped; (b) a stateless instance moves only off a node
// dead for good or silent for more than the TTL, only onto a node whose
// reports have run unbroken for the settle period, and always to a higher
// generation than any copy that runs, so it never moves back on its own;
// (c) no report time and no cluster time runs more than MaxClockLead
// ahead of its node's clock.
func TestPropertyLivenessHysteresis(t *testing.T) {
	var moved, settled int
	rapid.Check(t, func(t *rapid.T) {
		const end = 240
		n := rapid.IntRange(2, 5).Draw(t, "nodes")
		var names []string
		for i := range n {
			names = append(names, fmt.Sprintf("n%d", i+1))
		}
		pin := rapid.SampledFrom(names).Draw(t, "pin")
		repo := repoDef{Nodes: tableNodes(names...), Workloads: []workloadDef{
			svc("web", rapid.IntRange(1, 4).Draw(t, "web")), svc("api", rapid.IntRange(1, 2).Draw(t, "api")),
			{Name: "db", Volumes: []string{"db-data"}},
		}, Pins: map[string]string{"db": pin}}
		m1 := repo.model(t)
		m2 := m1
		repin := -1
		if rapid.Bool().Draw(t, "repin") {
			repo.Pins = map[string]string{"db": rapid.SampledFrom(names).Draw(t, "newPin")}
			m2 = repo.model(t)
			repin = rapid.IntRange(0, end).Draw(t, "repinAt")
		}
		model := func(s int) *render.Model {
			if repin >= 0 && s >= repin {
				return m2
			}
			return m1
		}
		ttl := int(time.Duration(m1.Cluster.LivenessTTL) / time.Second)
		var nodes []*simNode
		deaths := 0
		for _, name := range names {
			var gaps [][2]int
			for range rapid.IntRange(0, 4).Draw(t, name+"Starved") {
				gaps = append(gaps, [2]int{rapid.IntRange(0, end).Draw(t, name+"GapAt"), rapid.IntRange(ttl-5, ttl+5).Draw(t, name+"GapLen")})
			}
			dies := -1
			if deaths < n-1 && rapid.IntRange(0, 3).Draw(t, name+"Dies") == 0 {
				dies = rapid.IntRange(1, end).Draw(t, name+"DiesAt")
				deaths++
			}
			nodes = append(nodes, &simNode{
				name:   name,
				offset: time.Duration(rapid.IntRange(-2000, 2000).Draw(t, name+"OffsetMs")) * time.Millisecond,
				passes: passSchedule(end, rapid.SampledFrom([]int{1, 2, 3, 5}).Draw(t, name+"Interval"), gaps...),
				diesAt: dies,
			})
		}
		c := newSim(t, model, nodes)
		c.run(end)
		moved += len(c.moves)
		settled += c.settleChecks
	})
	t.Logf("%d moves, %d of them checked against settling", moved, settled)
	if settled == 0 {
		t.Fatal("no stateless instance ever moved: the generator tests nothing")
	}
}

// TestPropertyHostileReportSizes (issue 8, "property tests cover report
// sets with hostile sizes"): on top of a generated cluster, many reports of
// nodes of the inventory and of ghosts (nodes outside it), some listing
// thousands of instances: unknown names, names of Services and of nodes,
// replicas beyond the count, the same name twice in one report and across
// reports, every state, huge, negative and the largest generations,
// addresses anywhere, volumes of no instance and of real ones, clocks far
// off. report.Parse refuses some of this (duplicates, generations); the
// planner gets such reports from no other path, but must hold anyway.
// Checked: Compute never panics; it places each instance of the model at
// most once (placed or unschedulable, exactly once), only on nodes of the
// inventory, so the plan's size follows the model, not the reports;
// WaitsFor names exactly the nodes whose newest report lists the stateful
// instance not stopped (the one place where a node outside the inventory
// may appear); ghosts move nothing; the plan does not depend on the order
// of the reports; and Pending lists each thing once, naming nodes outside
// the inventory only for their own stops and moves off them.
func TestPropertyHostileReportSizes(t *testing.T) {
	hostileSeen := map[string]int{} // what the generator produced, across cases
	defer func() {
		for _, what := range []string{"report-of-thousands", "duplicate-in-report", "saturated-generation", "pending-stop", "warning:" + WarnNodeLeaving} {
			if hostileSeen[what] == 0 && !t.Failed() {
				t.Errorf("the generator never produced %s: %v", what, hostileSeen)
			}
		}
	}()
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t)
		m := sc.model
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0))
		var names []string
		for _, inst := range m.Instances {
			names = append(names, inst.Name)
		}
		for _, s := range m.Services {
			names = append(names, s.Name, fmt.Sprintf("%s-%d", s.Name, s.Replicas), fmt.Sprintf("%s-%d", s.Name, 100000))
		}
		var volumes []string
		for _, inst := range m.Instances {
			for _, v := range inst.Spec.Volumes {
				volumes = append(volumes, v.Name)
			}
		}
		for _, n := range m.Nodes {
			names = append(names, n.Name)
		}
		var inventory []string
		for _, n := range m.Nodes {
			inventory = append(inventory, n.Name)
		}
		pick := func(s []string) string { return s[rng.IntN(len(s))] }
		hostile := func(node string) report.Report {
			at := sc.now.Add(time.Duration(rng.IntN(120_000)-100_000) * time.Millisecond)
			switch rng.IntN(8) {
			case 0:
				at = time.Unix(0, 0).UTC()
			case 1:
				at = sc.now.Add(time.Duration(1+rng.IntN(20*365*24)) * time.Hour)
			case 2:
				at = sc.now // ties with other copies of the node's report
			}
			r := reportOf(node, at)
			r.Capacity = report.Capacity{CPU: render.CPU(rng.Int64N(1 << 40)), Memory: render.Bytes(rng.Int64N(1 << 62))}
			r.Decommissioned = rng.IntN(4) == 0
			n := rng.IntN(8)
			switch rng.IntN(16) {
			case 0:
				n = 1000 + rng.IntN(2000) // thousands
				hostileSeen["report-of-thousands"]++
			case 1, 2, 3:
				n = 50 + rng.IntN(250)
			}
			for range n {
				name := fmt.Sprintf("x%d", rng.IntN(5000)) // unknown
				if len(names) > 0 && rng.IntN(3) > 0 {
					name = pick(names)
				}
				gen := rng.IntN(4)
				switch rng.IntN(8) {
				case 0:
					gen = math.MaxInt
				case 1:
					gen = -1 - rng.IntN(10)
				case 2:
					gen = 1<<30 + rng.IntN(1<<20)
				}
				hash := fmt.Sprintf("%016x", rng.Uint64())
				if inst := m.Instance(name); inst != nil && rng.IntN(2) == 0 {
					hash = inst.SpecHash
				}
				var addr netip.Addr
				switch rng.IntN(4) {
				case 0:
					addr = netip.AddrFrom4([4]byte{10, 200, byte(rng.IntN(256)), byte(rng.IntN(256))})
				case 1:
					if mn := m.Node(pick(inventory)); mn != nil && mn.PodCIDR.IsValid() {
						addr = addrIn(mn.PodCIDR.Prefix, rng.IntN(256))
					}
				case 2:
					addr = netip.MustParseAddr("fd00::1")
				}
				r.Instances = append(r.Instances, report.Instance{Name: name, State: report.States[rng.IntN(len(report.States))],
					SpecHash: hash, Address: addr, Generation: gen, Restarts: rng.IntN(1 << 20)})
			}
			if len(r.Instances) > len(slices.CompactFunc(slices.SortedFunc(slices.Values(r.Instances), func(a, b report.Instance) int { return strings.Compare(a.Name, b.Name) }),
				func(a, b report.Instance) bool { return a.Name == b.Name })) {
				hostileSeen["duplicate-in-report"]++
			}
			for range rng.IntN(4) * (1 + n/10) {
				v := fmt.Sprintf("vol%d", rng.IntN(1000)) // of no instance
				if len(volumes) > 0 && rng.IntN(2) == 0 {
					v = pick(volumes)
				}
				r.Volumes = append(r.Volumes, report.Volume{Name: v})
			}
			for _, g := range m.Ingresses {
				if rng.IntN(3) == 0 {
					r.Certificates = append(r.Certificates, report.Certificate{Host: g.Host, Expires: at.Add(time.Hour)})
				}
			}
			return r
		}
		var onInventory, ghosts []report.Report
		for range rapid.IntRange(0, 12).Draw(t, "hostileReports") {
			onInventory = append(onInventory, hostile(pick(inventory)))
		}
		for range rapid.IntRange(0, 12).Draw(t, "ghostReports") {
			ghosts = append(ghosts, hostile(fmt.Sprintf("ghost%d", rng.IntN(6))))
		}
		base := append(slices.Clone(sc.reports), onInventory...)
		all := append(slices.Clone(base), ghosts...)
		in := Input{Model: m, Commit: sc.commit, Reports: all, Now: sc.now}
		p := Compute(in)

		// Each instance of the model placed or unschedulable, exactly once,
		// on a node of the inventory.
		seen := map[string]int{}
		for _, pl := range p.Placements {
			seen[pl.Instance]++
			if m.Instance(pl.Instance) == nil || m.Node(pl.Node) == nil {
				t.Fatalf("placement %+v names an instance or a node outside the model", pl)
			}
		}
		for _, u := range p.Unschedulable {
			seen[u.Instance]++
		}
		for _, inst := range m.Instances {
			if seen[inst.Name] != 1 {
				t.Fatalf("%s placed or unschedulable %d times", inst.Name, seen[inst.Name])
			}
		}
		if len(seen) != len(m.Instances) || len(p.Nodes) != len(m.Nodes) || len(p.Routes) > len(m.Nodes) || len(p.Ingresses) != len(m.Ingresses) {
			t.Fatalf("plan size does not follow the model: %d instances named of %d, %d nodes of %d, %d routes, %d ingresses of %d",
				len(seen), len(m.Instances), len(p.Nodes), len(m.Nodes), len(p.Routes), len(p.Ingresses), len(m.Ingresses))
		}
		for i, n := range p.Nodes {
			if n.Name != m.Nodes[i].Name {
				t.Fatalf("plan node %d is %s, want %s", i, n.Name, m.Nodes[i].Name)
			}
		}
		for _, s := range p.Services {
			svc := m.Service(s.Name)
			if svc == nil || len(s.Endpoints) > len(svc.Instances)*len(m.Nodes) {
				t.Fatalf("service %s: %d endpoints", s.Name, len(s.Endpoints))
			}
			for _, ep := range s.Endpoints {
				if !slices.Contains(svc.Instances, ep.Instance) || m.Node(ep.Node) == nil || !planNode(p, ep.Node).Alive {
					t.Fatalf("service %s: endpoint %+v", s.Name, ep)
				}
			}
		}
		for _, g := range p.Ingresses {
			if g.Owner != "" && m.Node(g.Owner) == nil {
				t.Fatalf("ingress %s served by %s, not in the inventory", g.Name, g.Owner)
			}
		}
		for _, w := range p.Warnings {
			hostileSeen["warning:"+w.Code]++
			if len(w.Message) > 300+40*len(m.Nodes) {
				t.Fatalf("warning of %d bytes: %.200s...", len(w.Message), w.Message)
			}
		}
		// WaitsFor: exactly the nodes whose newest report lists the
		// stateful instance in any state but stopped (any listing).
		newest := map[string]*report.Report{}
		for i := range all {
			r := &all[i]
			if cur := newest[r.Node]; cur == nil || Newer(r, cur) {
				newest[r.Node] = r
			}
		}
		for _, pl := range p.Placements {
			var want []string
			if m.Instance(pl.Instance).Stateful {
				for node, r := range newest {
					if node != pl.Node && slices.ContainsFunc(r.Instances, func(ri report.Instance) bool {
						return ri.Name == pl.Instance && ri.State != report.StateStopped
					}) {
						want = append(want, node)
					}
				}
				slices.Sort(want)
			}
			if !slices.Equal(pl.WaitsFor, want) {
				t.Fatalf("%s on %s waits for %v, want %v", pl.Instance, pl.Node, pl.WaitsFor, want)
			}
		}
		// Generations: a copy its node reports keeps its generation; a new
		// copy gets one above every other copy the inventory reports,
		// saturating at the largest (never wrapping around to negative).
		eff := effectiveReports(m, all, sc.now)
		for _, pl := range p.Placements {
			var own *report.Instance
			top := 0
			for node, r := range eff {
				// A name listed twice in a report: the first listing.
				if ri := r.Instance(pl.Instance); ri != nil {
					top = max(top, ri.Generation)
					if node == pl.Node {
						own = ri
					}
				}
			}
			switch {
			case own != nil && pl.Generation != own.Generation:
				t.Fatalf("%s on %s: generation %d, its node reports %d", pl.Instance, pl.Node, pl.Generation, own.Generation)
			case own == nil && (pl.Generation < 1 || pl.Generation < top || pl.Generation == top && top != math.MaxInt):
				t.Fatalf("%s, a new copy on %s: generation %d, copies elsewhere up to %d", pl.Instance, pl.Node, pl.Generation, top)
			}
			if pl.Generation == math.MaxInt {
				hostileSeen["saturated-generation"]++
			}
		}
		// Ghosts move nothing.
		pb := Compute(Input{Model: m, Commit: sc.commit, Reports: base, Now: sc.now})
		if pb.PlanID != p.PlanID || !slices.Equal(aliveNames(pb), aliveNames(p)) {
			t.Fatalf("ghost reports changed the plan: %v → %v", aliveNames(pb), aliveNames(p))
		}
		for i := range p.Placements {
			a, b := pb.Placements[i], p.Placements[i]
			a.WaitsFor, b.WaitsFor = nil, nil
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("ghost reports changed a placement: %+v → %+v", a, b)
			}
		}
		// The order of the reports does not matter.
		shuffled := slices.Clone(all)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if ps := Compute(Input{Model: m, Commit: sc.commit, Reports: shuffled, Now: sc.now}); !bytes.Equal(planJSON(t, ps), planJSON(t, p)) {
			t.Fatalf("shuffling the reports changed the plan")
		}
		// Pending: each (action, instance, node) once; a node outside the
		// inventory only where it stops what its newest report lists.
		distinct := 0
		for _, r := range newest {
			ns := map[string]bool{}
			for _, ri := range r.Instances {
				ns[ri.Name] = true
			}
			distinct += len(ns)
		}
		pending := Pending(m, p, all)
		if len(pending) > len(m.Instances)+distinct {
			t.Fatalf("%d pending changes for %d instances and %d distinct listings", len(pending), len(m.Instances), distinct)
		}
		once := map[[3]string]bool{}
		for _, c := range pending {
			key := [3]string{c.Action, c.Instance, c.Node}
			if once[key] {
				t.Fatalf("pending change listed twice: %+v", c)
			}
			once[key] = true
			switch {
			case c.Action == ActionStop:
				hostileSeen["pending-stop"]++
				r := newest[c.Node]
				if m.Node(c.Node) != nil || r == nil || !slices.ContainsFunc(r.Instances, func(ri report.Instance) bool {
					return ri.Name == c.Instance && ri.State != report.StateStopped
				}) {
					t.Fatalf("stop %+v: not a node outside the inventory that lists it", c)
				}
			case c.Action == ActionRemove:
				if m.Node(c.Node) == nil || !planNode(p, c.Node).Alive {
					t.Fatalf("remove %+v on a node that is not alive in the inventory", c)
				}
			case c.Node != "" && m.Node(c.Node) == nil:
				t.Fatalf("pending %+v on a node outside the inventory", c)
			case m.Instance(c.Instance) == nil:
				t.Fatalf("pending %+v of an instance outside the model", c)
			}
		}
	})
}
