package planner

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// FutureLimit is how far ahead of the reader's clock a report may be dated
// before it is ignored as broken, for liveness as for everything else.
const FutureLimit = time.Hour

// MaxClockLead is how far the cluster clock may run ahead of the reader's
// own clock: a third of the liveness TTL. A report whose sender clock is
// further ahead is not followed (Accepts), and the plan's ClusterTime is
// capped at Now + MaxClockLead, so that no single report, honest or not,
// can make the live nodes look dead.
func MaxClockLead(m *render.Model) time.Duration {
	return time.Duration(m.Cluster.LivenessTTL) / 3
}

// Accepts says why report r must not move this node's clock at now, or
// returns nil when it may: the node is in the inventory (a report from
// anywhere else is a ghost), and its sender clock is at most MaxClockLead
// ahead of now. Signatures are checked before a report reaches the
// planner: sync drops a report of a node with a reportKey whose signature
// does not verify.
func Accepts(m *render.Model, r *report.Report, now time.Time) error {
	if m.Node(r.Node) == nil {
		return fmt.Errorf("node %s is not in the inventory", r.Node)
	}
	if lead := MaxClockLead(m); r.SenderClock().After(now.Add(lead)) {
		return fmt.Errorf("report of %s is dated %s, more than %s ahead of this clock", r.Node, r.SenderClock().UTC().Format(time.RFC3339), lead)
	}
	return nil
}

// PeerClock is the clock a node's report carries: its own clock now, or
// the newest sender clock among the reports the planner accepts if that
// is later (so that a node with a slow clock still looks alive). It is
// never more than MaxClockLead ahead of now, and it follows the reports
// as they are: when a report that led goes, the clock drops back at once.
func PeerClock(m *render.Model, reports []report.Report, now time.Time) time.Time {
	t := now
	for i := range reports {
		r := &reports[i]
		if c := r.SenderClock(); c.After(t) && Accepts(m, r, now) == nil {
			t = c
		}
	}
	return t
}

// SettlePeriod is how long a node's reports must have run unbroken (its
// report's Time minus its Since) before it may take an instance that
// another node reports: one livenessTTL. A node that was judged dead and
// reports again is settling until then: it keeps what it runs, may get
// instances that no node reports, and takes nothing from another node, so
// that reports arriving around the TTL (a starved CPU, a slow network)
// move an instance at most once per death of its node and never back.
//
// With a gossip ring it is the TTL up to 30 s: the ring tells every node
// of a death or a return within a second or two, so views agree sooner
// (and a ring's TTL, minutes, bounds only the reports' ages).
func SettlePeriod(m *render.Model) time.Duration {
	ttl := time.Duration(m.Cluster.LivenessTTL)
	if m.Cluster.Gossip != nil {
		return min(ttl, gossipSettle)
	}
	return ttl
}

// gossipSettle bounds the settle period of a cluster with a gossip ring.
const gossipSettle = 30 * time.Second

// gossipTrust returns the ring's members and whether this view of the
// ring may decide liveness: only when it holds a strict majority of the
// inventory alive (this node counts). A node cut off from the ring sees
// every other node die at once; it must not take their work, so it falls
// back to the reports' ages (counting when the ring last saw each node),
// and so does every node while a majority of the cluster is down.
func (p *planner) gossipTrust(assume bool) (map[string]Member, bool) {
	g := p.in.Gossip
	if g == nil || g.Members == nil || assume {
		return nil, false
	}
	alive := 0
	for _, ns := range p.nodes {
		if g.Members[ns.Name].Alive {
			alive++
		}
	}
	if 2*alive > len(p.nodes) {
		return g.Members, true
	}
	p.warn(WarnGossipMinority, "", "the gossip ring shows %d of the %d nodes alive, not a majority: liveness is judged by the reports' ages", alive, len(p.nodes))
	return g.Members, false
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// maxPerNode is how many instances fit in a node's /24: .2 to .254.
const maxPerNode = 253

// IngressLabel marks the nodes that should serve Ingresses.
const IngressLabel = render.IngressLabel

// nodeState is the planner's working view of one node.
type nodeState struct {
	Node
	idx    int
	labels map[string]string
	hash   uint64
	report *report.Report
	count  int       // instances placed
	used   [256]bool // addresses reserved or given out in its /24
	given  [256]bool // addresses handed out in this plan
}

// room is what a node has left for new placements, kept apart from
// nodeState in one compact slice so that scanning every node for every new
// instance stays in the CPU cache.
type room struct {
	cpu, mem  int64 // free; math.MaxInt64 when the capacity is unknown
	slots     int32 // addresses left in the node's /24
	hash      uint64
	settling  bool // takes no instance another node reports
	limitsOff bool // takes no instance with resource limits
}

func (r *room) fits(req render.Resources) bool {
	return r.slots > 0 && int64(req.CPU) <= r.cpu && int64(req.Memory) <= r.mem
}

// sighting is one alive-or-dead node's report of an instance.
type sighting struct {
	node *nodeState
	inst *report.Instance
}

type planner struct {
	in         Input
	m          *render.Model
	plan       *Plan
	nodes      []*nodeState
	byName     map[string]*nodeState
	index      map[string]int32          // instance name → index in m.Instances
	sightings  [][]sighting              // by instance index: the nodes that report it
	holders    map[string][]*nodeState   // volume → nodes that report holding it
	volumePins map[string][]*nodeState   // volume of a pinned instance → its pin's node (sharedPins)
	placed     []*Placement              // by instance index
	on         []*nodeState              // by instance index: the node it is placed on
	counts     map[string][]int32        // Service → replicas placed per node index
	cands      map[string][]int32        // Service or Jail → candidate node indexes
	room       []room                    // by node index
	newest     map[string]*report.Report // every node's newest report, inventory or not
	rolling    map[string]bool           // Service → its surge instances are placed (surging)
	rollouts   []*Rollout                // by Service index: its rollout, nil when steady
	warnings   []Warning
}

func (p *planner) warn(code, subject, format string, args ...any) {
	p.warnings = append(p.warnings, Warning{Code: code, Subject: subject, Message: fmt.Sprintf(format, args...)})
}

// Compute makes the plan for in. It is deterministic: the same input in any
// order gives the same plan, byte for byte.
func Compute(in Input) *Plan {
	p := &planner{
		in:        in,
		m:         in.Model,
		plan:      &Plan{Commit: in.Commit},
		byName:    map[string]*nodeState{},
		index:     make(map[string]int32, len(in.Model.Instances)),
		sightings: make([][]sighting, len(in.Model.Instances)),
		holders:   map[string][]*nodeState{},
		placed:    make([]*Placement, len(in.Model.Instances)),
		on:        make([]*nodeState, len(in.Model.Instances)),
		counts:    map[string][]int32{},
		cands:     map[string][]int32{},
	}
	p.readNodes()
	p.surging()
	p.place()
	p.generations()
	p.breakBeforeMake()
	p.assignAddresses()
	p.pace()
	p.endpoints()
	p.ingresses()
	p.finish()
	return p.plan
}

// readNodes builds the node views and judges liveness.
func (p *planner) readNodes() {
	for i := range p.m.Instances {
		p.index[p.m.Instances[i].Name] = int32(i)
	}
	for i, n := range p.m.Nodes {
		ns := &nodeState{
			Node: Node{
				Name: n.Name, Schedulable: n.Schedulable, Address: n.Address.Addr, PodCIDR: n.PodCIDR.Prefix,
			},
			idx: i, labels: n.Labels, hash: hash64(n.Name),
		}
		p.nodes = append(p.nodes, ns)
		p.byName[n.Name] = ns
	}
	// The newest report of each node; ties broken on content so that the
	// choice never depends on input order. For liveness only the nodes of
	// the inventory count, and a report dated more than FutureLimit ahead
	// is set aside; p.newest keeps every node's newest report, whatever
	// its node and date, for break before make and for the nodes leaving.
	p.newest = map[string]*report.Report{}
	for i := range p.in.Reports {
		r := &p.in.Reports[i]
		if cur := p.newest[r.Node]; cur == nil || Newer(r, cur) {
			p.newest[r.Node] = r
		}
		ns := p.byName[r.Node]
		switch {
		case ns == nil:
			continue // leaving (below)
		case r.Time.After(p.in.Now.Add(FutureLimit)):
			p.warn(WarnReportIgnored, r.Node, "report of %s ignored: it is dated %s, more than an hour ahead of this clock", r.Node, r.Time.UTC().Format(time.RFC3339))
			continue
		}
		if ns.report == nil || Newer(r, ns.report) {
			ns.report = r
		}
	}
	for node, r := range p.newest {
		if p.byName[node] == nil {
			p.leaving(r)
		}
	}
	var newest time.Time
	reports := 0
	for _, ns := range p.nodes {
		if ns.report != nil {
			reports++
			if ns.report.Time.After(newest) {
				newest = ns.report.Time
			}
		}
	}
	// A report dated ahead of this clock (a fast clock, or a lie) moves the
	// cluster time by MaxClockLead at most.
	if limit := p.in.Now.Add(MaxClockLead(p.m)); !p.in.Now.IsZero() && newest.After(limit) {
		newest = limit
	}
	p.plan.ClusterTime = newest.UTC()
	assume := p.in.AssumeAlive && reports == 0
	p.plan.AssumedAlive = assume
	if assume && len(p.nodes) > 0 {
		p.warn(WarnNoReports, "", "no node has reported: planning as if every node of the inventory were alive, with its declared capacity")
	}
	ttl := time.Duration(p.m.Cluster.LivenessTTL)
	settle := SettlePeriod(p.m)
	ring, trusted := p.gossipTrust(assume)
	for _, ns := range p.nodes {
		r := ns.report
		// heard is the last sign of life: the report's time, or later
		// when the ring vouches for the node (see Liveness).
		var heard time.Time
		var rejoined time.Time
		switch {
		case assume:
			ns.Alive = true
		case r == nil && slices.Contains(p.in.PresumeAlive, ns.Name):
			ns.Alive = true
			p.warn(WarnPresumedAlive, ns.Name, "node %s has not reported yet: presumed alive for now", ns.Name)
		case r == nil:
			p.warn(WarnNodeDead, ns.Name, "node %s is dead: it has never reported", ns.Name)
		default:
			heard = r.Time
			mem, known := ring[ns.Name]
			switch {
			case known && trusted && mem.Alive:
				ns.Alive, heard, rejoined = true, later(heard, newest), mem.Rejoined
			case known && trusted && r.Time.After(mem.Since) && newest.Sub(r.Time) <= ttl:
				// Cut off from the ring, but its reports still come.
				ns.Alive = true
				p.warn(WarnGossipCutOff, ns.Name, "node %s is out of the gossip ring since %s but still reports: alive by its report",
					ns.Name, mem.Since.UTC().Format(time.RFC3339))
			case known && trusted:
				p.warn(WarnNodeDead, ns.Name, "node %s is dead: the gossip ring lost it at %s, and it has not reported since",
					ns.Name, mem.Since.UTC().Format(time.RFC3339))
			default:
				// No ring, a ring this node cannot trust, or a node the
				// ring has not seen: the report's age, counting the last
				// time the ring saw the node alive.
				if g := p.in.Gossip; g != nil {
					heard = later(heard, g.Seen[ns.Name])
				}
				if known {
					if mem.Alive {
						heard = later(heard, newest)
					} else {
						heard = later(heard, mem.Since)
					}
					rejoined = mem.Rejoined
				}
				if newest.Sub(heard) > ttl {
					p.warn(WarnNodeDead, ns.Name, "node %s is dead: its last report is %s older than the newest (livenessTTL %s)", ns.Name, newest.Sub(heard).Round(time.Second), ttl)
				} else {
					ns.Alive = true
				}
			}
		}
		switch {
		case !ns.Alive || r == nil:
		case !r.Since.IsZero() && heard.Sub(r.Since) < settle:
			ns.Settling = true
			p.warn(WarnSettling, ns.Name, "node %s is settling: its reports have run unbroken for %s only (settle period %s); it takes no instance from another node until then",
				ns.Name, heard.Sub(r.Since).Round(time.Second), settle)
		case !rejoined.IsZero() && newest.Sub(rejoined) < settle:
			ns.Settling = true
			p.warn(WarnSettling, ns.Name, "node %s is settling: it came back to the gossip ring %s ago (settle period %s); it takes no instance from another node until then",
				ns.Name, newest.Sub(rejoined).Round(time.Second), settle)
		}
		if r != nil {
			ns.ReportTime = r.Time.UTC()
			ns.LimitsOff = r.LimitsOff()
			if ns.Alive {
				for _, pr := range r.Problems {
					p.warn(WarnHostProblem, ns.Name, "node %s reports a host problem: %s: %s (fix: %s)", ns.Name, pr.Check, pr.Problem, pr.Fix)
				}
			}
			if r.Refused != nil && p.in.Commit != "" && r.Refused.Commit == p.in.Commit {
				ns.RefusedCommit = true
				p.warn(WarnRefused, ns.Name, "node %s refused commit %s: %s", ns.Name, short(p.in.Commit), r.Refused.Reason)
			}
			for j := range r.Instances {
				ri := &r.Instances[j]
				// A name listed twice in one report (report.Parse refuses
				// that; a report built otherwise may not) is one sighting,
				// the first, as report.Instance finds it. A node's
				// sightings are appended together, so its last is enough.
				if k, ok := p.index[ri.Name]; ok {
					if s := p.sightings[k]; len(s) == 0 || s[len(s)-1].node != ns {
						p.sightings[k] = append(p.sightings[k], sighting{ns, ri})
					}
				}
				if a := ri.Address; a.Is4() && ns.PodCIDR.Contains(a) {
					ns.used[a.As4()[3]] = true
				}
			}
			for _, v := range r.Volumes {
				p.holders[v.Name] = append(p.holders[v.Name], ns)
			}
		}
		// Capacity: the Node file's override, field by field, else the report.
		spec := p.m.Nodes[ns.idx].Capacity
		switch {
		case spec != nil && spec.CPU != 0 && spec.Memory != 0:
			ns.Capacity = *spec
		case r != nil && r.Capacity.CPU != 0 && r.Capacity.Memory != 0:
			ns.Capacity = render.Resources{CPU: r.Capacity.CPU, Memory: r.Capacity.Memory}
			if spec != nil {
				ns.Capacity.CPU = cmp.Or(spec.CPU, ns.Capacity.CPU)
				ns.Capacity.Memory = cmp.Or(spec.Memory, ns.Capacity.Memory)
			}
		default:
			ns.Unlimited = true
		}
	}
	p.room = make([]room, len(p.nodes))
	for i, ns := range p.nodes {
		p.room[i] = room{cpu: math.MaxInt64, mem: math.MaxInt64, slots: maxPerNode, hash: ns.hash, settling: ns.Settling, limitsOff: ns.LimitsOff}
		if !ns.Unlimited {
			p.room[i].cpu, p.room[i].mem = int64(ns.Capacity.CPU), int64(ns.Capacity.Memory)
		}
	}
	for _, s := range p.sightings {
		slices.SortFunc(s, func(a, b sighting) int { return cmp.Compare(a.node.idx, b.node.idx) })
	}
	for _, h := range p.holders {
		slices.SortFunc(h, func(a, b *nodeState) int { return cmp.Compare(a.idx, b.idx) })
	}
	// Reserve the explicit addresses of every instance on their node.
	for _, inst := range p.m.Instances {
		if a := inst.Spec.Network.Address; a.IsValid() {
			if ns := p.byName[inst.Node]; ns != nil && ns.PodCIDR.Contains(a.Addr) {
				ns.used[a.As4()[3]] = true
			}
		}
	}
}

// Newer reports whether a should win over b as a node's report: the
// later one, ties broken on content so that the choice never depends on
// input order (keel status chooses as the planner does).
func Newer(a, b *report.Report) bool {
	if !a.Time.Equal(b.Time) {
		return a.Time.After(b.Time)
	}
	return string(a.Marshal()) > string(b.Marshal())
}

// maxNamed is how many instances a warning names before it counts the rest.
const maxNamed = 5

// leaving warns about the newest report of a node that is not in the
// inventory. When it lists instances in any state but stopped, the node is
// leaving (deleted from nodes/, its agent decommissions it: see
// Pending's ActionStop) or it never was a member (a stray report): the
// planner cannot tell which, and treats both alike. Either way its agent,
// if any, stops them, and a stateful one starts elsewhere only once the
// report says it stopped (WaitsFor). Otherwise the report is ignored.
func (p *planner) leaving(r *report.Report) {
	var names []string
	count := 0
	seen := map[string]bool{}
	for _, ri := range r.Instances {
		if ri.State == report.StateStopped || seen[ri.Name] {
			continue
		}
		seen[ri.Name] = true
		count++
		if len(names) < maxNamed {
			names = append(names, ri.Name)
		}
	}
	if count == 0 {
		p.warn(WarnReportIgnored, r.Node, "report of %s ignored: the node is not in the inventory", r.Node)
		return
	}
	slices.Sort(names)
	list := strings.Join(names, ", ")
	if count > len(names) {
		list += fmt.Sprintf(" and %d more", count-len(names))
	}
	state := "its agent stops them once it applies a commit without the node"
	if r.Decommissioned {
		state = "its agent is decommissioning it and stops them"
	}
	p.warn(WarnNodeLeaving, r.Node, "node %s is not in the inventory, but its report lists %d %s not stopped (%s): %s; stateful ones start elsewhere only once it reports them stopped (if its host is off for good, delete its report ref)",
		r.Node, count, pluralWord(count, "instance"), list, state)
}

func pluralWord(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// matches reports whether node n satisfies the instance's constraints.
func matches(inst *render.Instance, n *nodeState) bool {
	if inst.Node != "" && inst.Node != n.Name {
		return false
	}
	for k, v := range inst.NodeSelector {
		if got, ok := n.labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// limited reports whether the instance has resource limits for its node
// to enforce (render gives every instance some by default).
func limited(inst *render.Instance) bool {
	return inst.Spec.Resources != (render.Resources{})
}

// enforces reports whether node n can run inst: not when inst has limits
// and n's report says it cannot enforce them (its driver refuses such an
// instance rather than run it unlimited).
func enforces(inst *render.Instance, n *nodeState) bool {
	return !n.LimitsOff || !limited(inst)
}

func (p *planner) put(inst *render.Instance, ns *nodeState, reason string) {
	pl := &Placement{Instance: inst.Name, Service: inst.Service, Node: ns.Name, Reason: reason}
	k := p.index[inst.Name]
	p.placed[k] = pl
	p.on[k] = ns
	ns.count++
	ns.Committed.CPU += inst.Spec.Resources.CPU
	ns.Committed.Memory += inst.Spec.Resources.Memory
	r := &p.room[ns.idx]
	r.slots--
	r.cpu -= int64(inst.Spec.Resources.CPU)
	r.mem -= int64(inst.Spec.Resources.Memory)
	if inst.Service != "" {
		p.serviceCounts(inst.Service)[ns.idx]++
	}
}

// serviceCounts returns, per node index, how many replicas of the Service
// are placed there so far.
func (p *planner) serviceCounts(service string) []int32 {
	c, ok := p.counts[service]
	if !ok {
		c = make([]int32, len(p.nodes))
		p.counts[service] = c
	}
	return c
}

// candidates returns the nodes that may take a new placement of inst,
// whatever their free capacity: alive, schedulable, matching its
// constraints, and not refusing the commit. Replicas of a Service share
// their constraints, so the list is computed once per Service.
func (p *planner) candidates(inst *render.Instance) []int32 {
	key := "jail/" + inst.Name
	if inst.Service != "" {
		key = "service/" + inst.Service
	}
	if c, ok := p.cands[key]; ok {
		return c
	}
	c := []int32{}
	for _, ns := range p.nodes {
		if ns.Alive && ns.Schedulable && !ns.RefusedCommit && matches(inst, ns) {
			c = append(c, int32(ns.idx))
		}
	}
	p.cands[key] = c
	return c
}

func (p *planner) unschedulable(inst *render.Instance, format string, args ...any) {
	reason := fmt.Sprintf(format, args...)
	p.plan.Unschedulable = append(p.plan.Unschedulable, Unschedulable{Instance: inst.Name, Service: inst.Service, Reason: reason})
	p.warn(WarnUnschedulable, inst.Name, "%s cannot be placed: %s", inst.Name, reason)
}

// place runs steps 2 to 5: pinned, held and sticky instances stay where they
// are, then new ones are placed.
func (p *planner) place() {
	var fresh []*render.Instance
	for i := range p.m.Instances {
		inst := &p.m.Instances[i]
		if inst.Surge && !p.rolling[inst.Service] {
			continue // no rollout under way: a surge instance runs nowhere
		}
		if !p.placeExisting(inst) {
			fresh = append(fresh, inst)
		}
	}
	// New placements in a fixed order: by Service (or Jail) name, then index.
	slices.SortFunc(fresh, func(a, b *render.Instance) int {
		return cmp.Or(strings.Compare(group(a), group(b)), cmp.Compare(a.Index, b.Index), strings.Compare(a.Name, b.Name))
	})
	for _, inst := range fresh {
		p.placeNew(inst)
	}
	for _, ns := range p.nodes {
		if !ns.Unlimited && (ns.Committed.CPU > ns.Capacity.CPU || ns.Committed.Memory > ns.Capacity.Memory) {
			p.warn(WarnOverCapacity, ns.Name, "node %s is over capacity: %s CPU and %s memory committed, %s and %s available (instances already there stay)",
				ns.Name, ns.Committed.CPU, ns.Committed.Memory, ns.Capacity.CPU, ns.Capacity.Memory)
		}
	}
}

func group(i *render.Instance) string { return cmp.Or(i.Service, i.Name) }

// placeExisting places an instance that is pinned, held or sticky, and
// reports whether it did (or found it unschedulable).
func (p *planner) placeExisting(inst *render.Instance) bool {
	// Step 2: a pin is binding, alive or not.
	if node, ok := p.m.Lock.Pins[inst.Name]; ok && inst.Stateful {
		ns := p.byName[node]
		if ns == nil {
			p.unschedulable(inst, "pinned to node %s, which is not in the inventory", node)
			return true
		}
		if !ns.Alive {
			p.warn(WarnPinnedDead, inst.Name, "stateful %s is pinned to node %s, which is dead: it stays there until the node returns or the pin is changed", inst.Name, node)
		}
		if !matches(inst, ns) {
			p.warn(WarnSpecNodeIgnore, inst.Name, "stateful %s is pinned to node %s, which no longer matches its constraints; the pin wins", inst.Name, node)
		}
		p.limitsWarning(inst, ns, "is pinned to")
		p.put(inst, ns, ReasonPinned)
		return true
	}
	// Step 3: an unpinned stateful instance stays with its volumes. A
	// volume it shares with pinned Jails is where their pin says (render
	// lets only Jails fixed to one node share a volume): the pin, not a
	// report, places the shared volume, so the sharers never split.
	if inst.Stateful {
		var holders []*nodeState
		reason := ReasonHeld
		for _, v := range inst.Spec.Volumes {
			hs := p.holders[v.Name]
			if pinned := p.sharedPins()[v.Name]; len(pinned) > 0 {
				hs, reason = pinned, ReasonPinned
			}
			for _, h := range hs {
				if !slices.Contains(holders, h) {
					holders = append(holders, h)
				}
			}
		}
		slices.SortFunc(holders, func(a, b *nodeState) int { return cmp.Compare(a.idx, b.idx) })
		switch len(holders) {
		case 0:
		case 1:
			if !holders[0].Alive {
				p.warn(WarnPinnedDead, inst.Name, "stateful %s stays with its volumes on node %s, which is dead", inst.Name, holders[0].Name)
			}
			if !matches(inst, holders[0]) {
				p.warn(WarnSpecNodeIgnore, inst.Name, "stateful %s stays with its volumes on node %s, which does not match its constraints; the volumes win", inst.Name, holders[0].Name)
			}
			p.limitsWarning(inst, holders[0], "stays with its volumes on")
			p.put(inst, holders[0], reason)
			return true
		default:
			names := make([]string, len(holders))
			for i, h := range holders {
				names[i] = h.Name
			}
			p.warn(WarnHeldTwice, inst.Name, "volumes of %s are held by several nodes (%s): resolve by hand, then pin it in keel.lock", inst.Name, strings.Join(names, ", "))
			p.unschedulable(inst, "its volumes are held by several nodes (%s)", strings.Join(names, ", "))
			return true
		}
	}
	// Step 4: sticky to an alive node that reports it and still matches.
	var best *sighting
	var eligible int
	k := p.index[inst.Name]
	for i, s := range p.sightings[k] {
		ns := s.node
		if !ns.Alive || !matches(inst, ns) || (!inst.Stateful && !ns.Schedulable) || !enforces(inst, ns) {
			continue
		}
		eligible++
		if best == nil || betterSighting(inst, s, *best) {
			best = &p.sightings[k][i]
		}
	}
	if best == nil {
		return false
	}
	if eligible > 1 {
		p.warn(WarnDuplicate, inst.Name, "%s is reported by %d alive nodes: %s keeps it, the others stop it", inst.Name, eligible, best.node.Name)
	}
	p.put(inst, best.node, ReasonSticky)
	return true
}

// limitsWarning warns when a stateful instance is held on a node that
// cannot enforce its limits: its node refuses it until it can.
func (p *planner) limitsWarning(inst *render.Instance, ns *nodeState, how string) {
	if !enforces(inst, ns) {
		p.warn(WarnHostProblem, inst.Name, "stateful %s %s node %s, which reports that it cannot enforce resource limits (racct): the node refuses to run it until it can", inst.Name, how, ns.Name)
	}
}

// sharedPins returns, for every volume of a pinned stateful instance, the
// nodes the pins put it on (one, unless the lock contradicts render's
// rules), computed once.
func (p *planner) sharedPins() map[string][]*nodeState {
	if p.volumePins != nil {
		return p.volumePins
	}
	p.volumePins = map[string][]*nodeState{}
	for i := range p.m.Instances {
		inst := &p.m.Instances[i]
		ns := p.byName[p.m.Lock.Pins[inst.Name]]
		if ns == nil || !inst.Stateful {
			continue
		}
		for _, v := range inst.Spec.Volumes {
			if !slices.Contains(p.volumePins[v.Name], ns) {
				p.volumePins[v.Name] = append(p.volumePins[v.Name], ns)
			}
		}
	}
	return p.volumePins
}

// betterSighting prefers the newer copy (the higher generation: the copy
// that was started because the other's node was judged dead keeps the
// instance when that node returns, so nothing moves back), then, between
// copies of one generation, the one on a settled node over one on a
// settling node (a node back from the dead may have started the instance
// without its report ever saying so: the others then started theirs at
// the same generation, and the returning node's copy must not win it back
// on the rendezvous hash), then the node running the current spec, then
// the higher rendezvous hash.
func betterSighting(inst *render.Instance, a, b sighting) bool {
	if a.inst.Generation != b.inst.Generation {
		return a.inst.Generation > b.inst.Generation
	}
	if a.node.Settling != b.node.Settling {
		return !a.node.Settling
	}
	ca := a.inst.State == report.StateRunning && a.inst.SpecHash == inst.SpecHash
	cb := b.inst.State == report.StateRunning && b.inst.SpecHash == inst.SpecHash
	if ca != cb {
		return ca
	}
	ih := hash64(inst.Name)
	return rendezvous(ih, a.node.hash) > rendezvous(ih, b.node.hash)
}

// generations gives every placement its copy's generation: the one its
// node reports, or one more than the highest reported anywhere for a copy
// to start.
func (p *planner) generations() {
	for i, pl := range p.placed {
		if pl == nil {
			continue
		}
		if ri := p.reportedOn(i, p.on[i]); ri != nil {
			pl.Generation = ri.Generation
			continue
		}
		top := 0
		for _, s := range p.sightings[i] {
			top = max(top, s.inst.Generation)
		}
		if top < math.MaxInt { // a hostile report may claim the largest
			top++
		}
		pl.Generation = top
	}
}

// breakBeforeMake names, for every stateful placement, the other nodes
// whose newest report lists the instance in any state but stopped. Every
// report counts here, including those liveness ignores (a dead node, a
// node no longer in the inventory, a report dated ahead): a report that
// says the instance runs is not proof that it stopped, however old.
func (p *planner) breakBeforeMake() {
	for node, r := range p.newest {
		for j := range r.Instances {
			ri := &r.Instances[j]
			k, ok := p.index[ri.Name]
			if !ok || ri.State == report.StateStopped {
				continue
			}
			// A name listed twice (a report built without report.Parse)
			// counts as not stopped if any listing says so.
			if pl := p.placed[k]; pl != nil && p.m.Instances[k].Stateful && node != pl.Node && !slices.Contains(pl.WaitsFor, node) {
				pl.WaitsFor = append(pl.WaitsFor, node)
			}
		}
	}
	for _, pl := range p.placed {
		if pl != nil {
			slices.Sort(pl.WaitsFor)
		}
	}
}

// placeNew runs step 5 for one instance: among the candidate nodes with
// room, the one with the fewest replicas of the same Service, then the
// highest rendezvous hash. An instance that some node of the inventory
// reports (dead, drained or no longer matching: a move) never goes to a
// settling node (SettlePeriod).
func (p *planner) placeNew(inst *render.Instance) {
	ih := hash64(inst.Name)
	req := inst.Spec.Resources
	var counts []int32
	if inst.Service != "" {
		counts = p.serviceCounts(inst.Service)
	}
	moving := len(p.sightings[p.index[inst.Name]]) > 0
	lim := limited(inst)
	bestIdx := int32(-1)
	var bestCount int32
	var bestScore uint64
	var settling int
	var limitsOff []string
	for _, i := range p.candidates(inst) {
		r := &p.room[i]
		if lim && r.limitsOff {
			limitsOff = append(limitsOff, p.nodes[i].Name)
			continue
		}
		if !r.fits(req) {
			continue
		}
		if moving && r.settling {
			settling++
			continue
		}
		var count int32
		if counts != nil {
			count = counts[i]
		}
		if bestIdx >= 0 && count > bestCount {
			continue
		}
		score := rendezvous(ih, r.hash)
		if bestIdx < 0 || count < bestCount || score > bestScore {
			bestIdx, bestCount, bestScore = i, count, score
		}
	}
	var best *nodeState
	if bestIdx >= 0 {
		best = p.nodes[bestIdx]
	}
	if best != nil {
		p.put(inst, best, ReasonNew)
		if inst.Stateful {
			p.warn(WarnUnpinned, inst.Name, "stateful %s is not pinned in keel.lock: run keel lock to pin it to %s", inst.Name, best.Name)
		}
		return
	}
	// Nothing fits: say why, from the most to the least fundamental reason.
	var alive, matching int
	for _, ns := range p.nodes {
		if ns.Alive {
			alive++
			if matches(inst, ns) {
				matching++
			}
		}
	}
	switch {
	case alive == 0:
		p.unschedulable(inst, "no node is alive")
	case matching == 0:
		p.unschedulable(inst, "no alive node matches %s", constraintText(inst))
	case len(p.candidates(inst)) == 0:
		p.unschedulable(inst, "every alive node that matches is unschedulable or refused this commit")
	case len(limitsOff) == len(p.candidates(inst)):
		p.unschedulable(inst, "it has resource limits, and every eligible node reports that it cannot enforce them (resource accounting is off on %s)", nameList(limitsOff))
	case settling > 0:
		p.unschedulable(inst, "another node reports it, and every node with room for it is settling (reporting unbroken for less than %s): it stays where it is until one has settled", SettlePeriod(p.m))
	default:
		note := ""
		if len(limitsOff) > 0 {
			note = fmt.Sprintf("; %s cannot enforce resource limits", nameList(limitsOff))
		}
		p.unschedulable(inst, "not enough capacity: it needs %s CPU and %s memory, and no eligible node has that much free (or room for another address)%s", req.CPU, req.Memory, note)
	}
}

// nameList names nodes in a message: at most maxNamed, then a count.
func nameList(names []string) string {
	if len(names) > 1 {
		return "nodes " + listed(names)
	}
	return "node " + listed(names)
}

// listed names at most maxNamed of names, then counts the rest.
func listed(names []string) string {
	s := strings.Join(names[:min(len(names), maxNamed)], ", ")
	if len(names) > maxNamed {
		s += fmt.Sprintf(" and %d more", len(names)-maxNamed)
	}
	return s
}

func constraintText(inst *render.Instance) string {
	var parts []string
	if inst.Node != "" {
		parts = append(parts, "node "+inst.Node)
	}
	for _, k := range slices.Sorted(mapsKeys(inst.NodeSelector)) {
		parts = append(parts, k+"="+inst.NodeSelector[k])
	}
	return strings.Join(parts, ", ")
}

// assignAddresses runs step 6.
func (p *planner) assignAddresses() {
	// Explicit addresses first: the spec wins over an address a node
	// reports for another instance.
	for i := range p.m.Instances {
		inst := &p.m.Instances[i]
		pl := p.placed[i]
		if a := inst.Spec.Network.Address; pl != nil && a.IsValid() {
			pl.Address = a.Addr
			if ns := p.on[i]; ns.PodCIDR.Contains(a.Addr) {
				p.givenOut(ns, a.Addr)
			}
		}
	}
	for i := range p.m.Instances {
		pl := p.placed[i]
		if pl == nil || pl.Address.IsValid() {
			continue
		}
		ns := p.on[i]
		// A sticky (or pinned, or held) instance keeps the address its node
		// reports for it, unless another instance was given it already.
		if ri := p.reportedOn(i, ns); ri != nil && ri.Address.Is4() && ns.PodCIDR.Contains(ri.Address) && !p.givenOut(ns, ri.Address) {
			pl.Address = ri.Address
			continue
		}
	}
	// Then new addresses, in instance order, probing past every address
	// explicit, reported or already given out.
	for i := range p.m.Instances {
		inst := &p.m.Instances[i]
		pl := p.placed[i]
		if pl == nil || pl.Address.IsValid() {
			continue
		}
		ns := p.on[i]
		if !ns.PodCIDR.IsValid() {
			continue
		}
		start := int(hash64(inst.Name) % maxPerNode)
		for k := range maxPerNode {
			host := 2 + (start+k)%maxPerNode
			if !ns.used[host] {
				ns.used[host] = true
				b := ns.PodCIDR.Addr().As4()
				b[3] = byte(host)
				pl.Address = netip.AddrFrom4(b)
				break
			}
		}
	}
}

// givenOut reserves a for one instance on ns and reports whether it was
// already given to another in this plan. (Reported addresses are marked
// used up front; given tracks which of them an instance has kept, so that
// two instances cannot keep the same one.)
func (p *planner) givenOut(ns *nodeState, a netip.Addr) bool {
	host := a.As4()[3]
	if ns.given[host] {
		return true
	}
	ns.given[host] = true
	ns.used[host] = true
	return false
}

// reportedOn returns node ns's report of the instance with index i, or nil.
func (p *planner) reportedOn(i int, ns *nodeState) *report.Instance {
	for _, s := range p.sightings[i] {
		if s.node == ns {
			return s.inst
		}
	}
	return nil
}

// defaultProgressDeadline stands in for a strategy's progressDeadline
// when a model gives none (render always does).
const defaultProgressDeadline = 10 * time.Minute

// strategyOf returns svc's strategy, with the zero fields of a model made
// by hand taken as render's defaults: at most one replica unavailable.
func strategyOf(svc *render.Service) render.Strategy {
	st := svc.Strategy
	if st.MaxUnavailable <= 0 && st.MaxSurge <= 0 {
		st.MaxUnavailable = 1
	}
	if st.ProgressDeadline <= 0 {
		st.ProgressDeadline = render.Duration(defaultProgressDeadline)
	}
	if st.FailureAction == "" {
		st.FailureAction = render.FailurePause
	}
	return st
}

// members returns the names of a Service's replicas, in index order, and
// then of its surge instances.
func members(svc *render.Service) []string {
	return append(slices.Clip(svc.Instances), svc.Surge...)
}

// available reports whether an instance as its node reports it counts as
// available: ready, and for minReady at least at the cluster time. (An
// older agent's report, without readiness, counts a running instance as
// ready since ever.) Without minReady, ready is enough: an agent plans at
// the time of its last fetch, and its own instance that turned ready
// since must count at once, so that the pass that sees it ready also
// releases the next replica and drops it from this node's proxies (the
// report saying ready then also acknowledges that drain).
func (p *planner) available(ri *report.Instance, minReady time.Duration) bool {
	if ri == nil || !ri.IsReady() {
		return false
	}
	return minReady <= 0 || ri.ReadySince.IsZero() || !p.plan.ClusterTime.Before(ri.ReadySince.Add(minReady))
}

// surging decides, before placement, which Services run their surge
// instances: those with a replica that an alive node reports at an
// outdated spec (a restart or a replace away from the rendered one), and
// those whose surge instances run while a replica is not yet available at
// the rendered spec (the rollout's last step). A Service whose replicas
// crash at steady state does not surge.
func (p *planner) surging() {
	p.rolling = map[string]bool{}
	for i := range p.m.Services {
		svc := &p.m.Services[i]
		if len(svc.Surge) == 0 {
			continue
		}
		minReady := time.Duration(strategyOf(svc).MinReadySeconds) * time.Second
		outdated, allAvailable, surgeRuns := false, true, false
		for _, name := range svc.Instances {
			k := p.index[name]
			inst := &p.m.Instances[k]
			current := false
			for _, sg := range p.sightings[k] {
				if !sg.node.Alive {
					continue
				}
				switch render.ClassifyHashChange(sg.inst.SpecHash, inst.SpecHash) {
				case render.ChangeReplace, render.ChangeRestart:
					outdated = true
				default:
					current = current || p.available(sg.inst, minReady)
				}
			}
			allAvailable = allAvailable && current
		}
		for _, name := range svc.Surge {
			for _, sg := range p.sightings[p.index[name]] {
				surgeRuns = surgeRuns || (sg.node.Alive && sg.inst.State != report.StateStopped)
			}
		}
		p.rolling[svc.Name] = outdated || (surgeRuns && !allAvailable)
	}
}

// pace runs step 8: which outdated instances may be updated now. Every
// node paces from the same reports, without a coordinator: of a
// Service's members (its replicas and the surge instances placed), those
// available (ready for minReadySeconds on an alive node) may fall to
// Replicas − maxUnavailable and no lower, so the outdated available ones
// are released, in index order, only as far as that allows; an outdated
// member that is not available is released at once (it serves nothing).
// A member started at the rendered spec and not ready within
// progressDeadline fails the rollout: with failureAction pause nothing
// more is released; with continue it counts as available.
func (p *planner) pace() {
	for i := range p.m.Instances {
		inst := &p.m.Instances[i]
		pl := p.placed[i]
		if pl == nil {
			continue
		}
		if ri := p.reportedOn(i, p.on[i]); ri != nil {
			switch c := render.ClassifyHashChange(ri.SpecHash, inst.SpecHash); c {
			case render.ChangeReplace, render.ChangeRestart:
				pl.Outdated = c
			}
		}
		if inst.Service == "" && pl.Outdated != "" {
			pl.Released = true // a Jail has no siblings to pace against
		}
	}
	p.rollouts = make([]*Rollout, len(p.m.Services))
	for i := range p.m.Services {
		svc := &p.m.Services[i]
		st := strategyOf(svc)
		minReady := time.Duration(st.MinReadySeconds) * time.Second
		ro := &Rollout{Replicas: len(svc.Instances), MinAvailable: max(0, len(svc.Instances)-st.MaxUnavailable)}
		var outdatedAvailable, pulling []*Placement
		var notAvailable []string
		outdated := 0
		for _, name := range members(svc) {
			k := int(p.index[name])
			inst, pl := &p.m.Instances[k], p.placed[k]
			if pl == nil {
				continue
			}
			ri := p.reportedOn(k, p.on[k])
			avail := p.on[k].Alive && p.available(ri, minReady)
			if inst.Surge {
				ro.Surge++
			} else if ri != nil && pl.Outdated == "" {
				ro.Updated++
			}
			// A member whose node waits for its image at this spec (the
			// copy it replaces may run meanwhile) has made no progress
			// either until the pull ends.
			pulls := ri != nil && ri.Pull != nil && ri.Pull.SpecHash == inst.SpecHash && !ri.Pull.Since.IsZero()
			if pulls {
				pulling = append(pulling, pl)
			}
			if (pl.Outdated == "" && ri != nil && !ri.IsReady() && !ri.SpecSince.IsZero() &&
				p.plan.ClusterTime.Sub(ri.SpecSince) > time.Duration(st.ProgressDeadline)) ||
				(pulls && p.plan.ClusterTime.Sub(ri.Pull.Since) > time.Duration(st.ProgressDeadline)) {
				ro.Failed = append(ro.Failed, name)
				avail = avail || st.FailureAction == render.FailureContinue
			}
			if pl.Outdated != "" {
				outdated++
			}
			switch {
			case avail:
				ro.Available++
				if pl.Outdated != "" {
					outdatedAvailable = append(outdatedAvailable, pl)
				}
			default:
				notAvailable = append(notAvailable, name)
			}
		}
		if outdated == 0 && ro.Surge == 0 && len(ro.Failed) == 0 {
			continue
		}
		p.rollouts[i] = ro
		if len(ro.Failed) > 0 && st.FailureAction == render.FailurePause {
			ro.Paused = true
			p.warn(WarnRolloutPaused, svc.Name, "rollout of %s is paused: %s not ready within the progressDeadline of %s; the other replicas are left as they are until the spec changes (fix it, or git revert)",
				svc.Name, listed(ro.Failed), time.Duration(st.ProgressDeadline))
			// An outdated member waiting for its image stays released,
			// within the budget as before the pause: its node keeps
			// trying the pull and its old copy stays drained, rather
			// than its release coming and going with the pause.
			budget := ro.Available - ro.MinAvailable
			for _, pl := range pulling {
				switch {
				case pl.Outdated == "":
				case !slices.Contains(outdatedAvailable, pl):
					pl.Released = true
				case budget > 0:
					pl.Released = true
					budget--
				}
			}
			continue
		}
		for _, name := range members(svc) {
			k := int(p.index[name])
			if pl := p.placed[k]; pl != nil && pl.Outdated != "" && !slices.Contains(outdatedAvailable, pl) {
				pl.Released = true // not serving anyway: update at once
			}
		}
		budget := ro.Available - ro.MinAvailable
		for _, pl := range outdatedAvailable {
			if budget <= 0 {
				break
			}
			pl.Released = true
			budget--
		}
		left := len(outdatedAvailable) - max(0, ro.Available-ro.MinAvailable)
		if left > 0 {
			for _, name := range members(svc) {
				if pl := p.placed[int(p.index[name])]; pl != nil && (pl.Released || slices.Contains(notAvailable, name)) {
					ro.Waiting = append(ro.Waiting, name)
				}
			}
		}
		if left > 0 && len(notAvailable) > 0 {
			p.warn(WarnRolloutWaiting, svc.Name, "rollout of %s waits: %s not available yet (%d outdated %s left)",
				svc.Name, listed(notAvailable), left, pluralWord(left, "replica"))
		}
	}
}

// draining reports whether the copy of instance k that sg sees is being
// taken out of service, so that it leaves every node's endpoints before
// its node stops it: a surge instance whose rollout is over, a copy on a
// node other than the instance's placement once the placement's copy is
// ready (make before break) or at once for a stateful one (break before
// make), and a copy released for a restart or a replace. A replica that
// can be placed nowhere keeps serving where it runs.
func (p *planner) draining(k int32, sg sighting) bool {
	pl, inst := p.placed[k], &p.m.Instances[k]
	switch {
	case pl == nil:
		return inst.Surge
	case sg.node != p.on[k]:
		if inst.Stateful {
			return true
		}
		ri := p.reportedOn(int(k), p.on[k])
		return ri != nil && ri.IsReady()
	default:
		return pl.Released
	}
}

// endpoints runs step 7: every member of a Service reported ready on an
// alive node, but those being drained.
func (p *planner) endpoints() {
	for i := range p.m.Services {
		svc := &p.m.Services[i]
		s := Service{Name: svc.Name, VIP: svc.VIP.Addr, Port: svc.Port, Endpoints: []Endpoint{}, Rollout: p.rollouts[i]}
		seen := map[netip.Addr]bool{}
		for _, name := range members(svc) {
			k := p.index[name]
			for _, sg := range p.sightings[k] {
				ri := sg.inst
				if !sg.node.Alive || !ri.IsReady() || !ri.Address.Is4() || seen[ri.Address] || p.draining(k, sg) {
					continue
				}
				seen[ri.Address] = true
				s.Endpoints = append(s.Endpoints, Endpoint{Instance: name, Node: sg.node.Name, Address: ri.Address})
			}
		}
		p.plan.Services = append(p.plan.Services, s)
	}
}

// ingresses runs step 9.
func (p *planner) ingresses() {
	var labelled, alive []*nodeState
	for _, ns := range p.nodes {
		if !ns.Alive {
			continue
		}
		alive = append(alive, ns)
		if ns.labels[IngressLabel] == "true" {
			labelled = append(labelled, ns)
		}
	}
	candidates := labelled
	if len(candidates) == 0 {
		candidates = alive
	}
	// The owner issues the certificate for every node that can receive a
	// shared one: when any candidate can, the owner is one of them (a node
	// that cannot issues its own whoever owns the Ingress, and as the
	// owner it would share with no one).
	var sharing []*nodeState
	for _, ns := range candidates {
		if p.m.Nodes[ns.idx].CanReceiveCertificates() {
			sharing = append(sharing, ns)
		}
	}
	if len(sharing) > 0 {
		candidates = sharing
	}
	for _, in := range p.m.Ingresses {
		out := Ingress{Name: in.Name, Host: in.Host, Path: in.Path, Service: in.Backend.Service}
		ih := hash64(in.Name)
		var best *nodeState
		for _, ns := range candidates {
			if ns.report == nil || !slices.ContainsFunc(ns.report.Certificates, func(c report.Certificate) bool {
				return c.Host == in.Host && c.Holds(p.plan.ClusterTime)
			}) {
				continue
			}
			if best == nil || rendezvous(ih, ns.hash) > rendezvous(ih, best.hash) {
				best = ns
			}
		}
		out.Reason = "holds the certificate"
		if best == nil {
			out.Reason = "highest rendezvous hash"
			for _, ns := range candidates {
				if best == nil || rendezvous(ih, ns.hash) > rendezvous(ih, best.hash) {
					best = ns
				}
			}
		}
		if best == nil {
			out.Reason = "no alive node"
			p.warn(WarnIngressNoNode, in.Name, "Ingress %s (%s) has no alive node to serve it", in.Name, in.Host)
		} else {
			out.Owner = best.Name
			if len(labelled) == 0 {
				out.Reason += fmt.Sprintf("; no alive node is labelled %s=true", IngressLabel)
			}
		}
		p.plan.Ingresses = append(p.plan.Ingresses, out)
	}
}

// finish fills the per-node results, sorts everything and computes the ID.
func (p *planner) finish() {
	p.plan.Routes = []Route{}
	for _, ns := range p.nodes {
		if ns.Alive && ns.PodCIDR.IsValid() && ns.Address.IsValid() {
			p.plan.Routes = append(p.plan.Routes, Route{Node: ns.Name, Dest: ns.PodCIDR, Via: ns.Address})
		}
		p.plan.Nodes = append(p.plan.Nodes, ns.Node)
	}
	p.plan.Placements = make([]Placement, 0, len(p.placed))
	for i := range p.m.Instances {
		if pl := p.placed[i]; pl != nil {
			p.plan.Placements = append(p.plan.Placements, *pl)
		}
	}
	slices.SortFunc(p.plan.Unschedulable, func(a, b Unschedulable) int { return strings.Compare(a.Instance, b.Instance) })
	if p.plan.Unschedulable == nil {
		p.plan.Unschedulable = []Unschedulable{}
	}
	slices.SortFunc(p.warnings, func(a, b Warning) int {
		return cmp.Or(strings.Compare(a.Code, b.Code), strings.Compare(a.Subject, b.Subject), strings.Compare(a.Message, b.Message))
	})
	p.plan.Warnings = slices.Compact(p.warnings)
	if p.plan.Warnings == nil {
		p.plan.Warnings = []Warning{}
	}
	p.plan.PlanID, p.plan.PlacementID = planID(p.plan)
}

// planID hashes the outputs that agents must agree on, and (placement)
// the part of them that places instances and ingresses on nodes.
func planID(plan *Plan) (id, placement string) {
	type placed struct{ I, N, A string }
	all := struct {
		Commit     string
		Alive      []string
		Placements []placed
		Released   []string
		Ingress    [][2]string
	}{Commit: plan.Commit}
	for _, n := range plan.Nodes {
		if n.Alive {
			all.Alive = append(all.Alive, n.Name)
		}
	}
	for _, pl := range plan.Placements {
		all.Placements = append(all.Placements, placed{pl.Instance, pl.Node, pl.Address.String()})
		if pl.Released {
			all.Released = append(all.Released, pl.Instance)
		}
	}
	for _, in := range plan.Ingresses {
		all.Ingress = append(all.Ingress, [2]string{in.Name, in.Owner})
	}
	where := struct {
		Commit     string
		Placements []placed
		Ingress    [][2]string
	}{all.Commit, all.Placements, all.Ingress}
	return digest(all), digest(where)
}

func digest(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// hash64 is FNV-1a (64 bits) of s.
func hash64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// rendezvous scores the pair (instance, node): the highest score wins. It
// mixes the two precomputed name hashes (a multiply and xor-shifts, as in
// the finaliser of splitmix64), so that scoring one pair costs a few
// instructions: a cold plan scores every instance against every node.
func rendezvous(instance, node uint64) uint64 {
	z := (instance ^ node) * 0xbf58476d1ce4e5b9
	z ^= z >> 31
	z *= 0x94d049bb133111eb
	return z ^ (z >> 29)
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
