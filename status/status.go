// Package status is the cluster's read model: from the specs at a
// branch's tip and every node's report, it works out, as the nodes do,
// where the cluster stands and what is still missing. keel plan, keel
// status and keel dashboard share it, so that they never disagree.
//
// Compute is pure (no I/O, no clock); load.go reads the repository. The
// JSON form of Status is a public, stable interface (docs/cli.md, "keel
// status -o json").
package status

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// SchemaVersion is the version of the JSON document; it changes only when
// a field changes meaning or goes away (new fields do not change it).
const SchemaVersion = 1

// CertificateWarning is how long before expiry a certificate needs
// attention: ACME renews at a third of its life left (30 days of 90), so
// one that gets this close has failed to renew for weeks.
const CertificateWarning = 14 * 24 * time.Hour

// Node states.
const (
	NodeAlive      = "alive"      // reports within the liveness TTL
	NodeSettling   = "settling"   // alive, back for less than the settle period
	NodeDead       = "dead"       // its newest report is older than the TTL
	NodeUnreported = "unreported" // in the inventory, never reported
	NodeLeaving    = "leaving"    // not in the inventory, still reporting
)

// Status is the whole cluster at a glance.
type Status struct {
	SchemaVersion int       `json:"schemaVersion" yaml:"schemaVersion"`
	Time          time.Time `json:"time" yaml:"time"`
	Cluster       string    `json:"cluster" yaml:"cluster"`
	Branch        string    `json:"branch" yaml:"branch"`
	Tip           Commit    `json:"tip" yaml:"tip"`
	// Valid is false when the specs at the tip do not render; Errors
	// says why, and the nodes keep running the last valid commit.
	Valid  bool     `json:"valid" yaml:"valid"`
	Errors []string `json:"errors" yaml:"errors"`
	// Converged is true when every inventory node is alive, runs the tip
	// and agrees on the plan, every instance runs at the tip's spec where
	// the plan puts it, and every Service has all its endpoints.
	Converged bool `json:"converged" yaml:"converged"`
	// Headline is one sentence: "converged at <commit>" or what is missing
	// first; Missing lists everything missing, one sentence each.
	Headline string   `json:"headline" yaml:"headline"`
	Missing  []string `json:"missing" yaml:"missing"`
	PlanID   string   `json:"planID" yaml:"planID"`
	// Counts sums up the tables.
	Counts    Counts            `json:"counts" yaml:"counts"`
	Nodes     []Node            `json:"nodes" yaml:"nodes"`
	Services  []Service         `json:"services" yaml:"services"`
	Attention []Instance        `json:"attention" yaml:"attention"`
	Ingresses []Ingress         `json:"ingresses" yaml:"ingresses"`
	Volumes   []Volume          `json:"volumes" yaml:"volumes"`
	History   []History         `json:"history" yaml:"history"`
	Warnings  []planner.Warning `json:"warnings" yaml:"warnings"`
}

// Counts sums up the cluster.
type Counts struct {
	Nodes         int `json:"nodes" yaml:"nodes"`
	NodesAlive    int `json:"nodesAlive" yaml:"nodesAlive"`
	NodesAtTip    int `json:"nodesAtTip" yaml:"nodesAtTip"`
	Instances     int `json:"instances" yaml:"instances"`
	Running       int `json:"running" yaml:"running"`
	Unschedulable int `json:"unschedulable" yaml:"unschedulable"`
	Services      int `json:"services" yaml:"services"`
	ServicesReady int `json:"servicesReady" yaml:"servicesReady"`
}

// Commit is a commit of the branch.
type Commit struct {
	Hash    string    `json:"hash" yaml:"hash"`
	Subject string    `json:"subject" yaml:"subject"`
	Author  string    `json:"author" yaml:"author"`
	Time    time.Time `json:"time" yaml:"time"`
}

// Short is the commit's abbreviated hash.
func (c Commit) Short() string { return short(c.Hash) }

// Node is one node's row.
type Node struct {
	Name  string `json:"name" yaml:"name"`
	State string `json:"state" yaml:"state"`
	// ReportTime is when its newest report was written, and ReportAge
	// how long before Status.Time, in whole seconds (absent when the
	// node never reported).
	ReportTime   *time.Time `json:"reportTime,omitempty" yaml:"reportTime,omitempty"`
	ReportAge    *int64     `json:"reportAgeSeconds,omitempty" yaml:"reportAgeSeconds,omitempty"`
	AgentVersion string     `json:"agentVersion,omitempty" yaml:"agentVersion,omitempty"`
	// Commit is the commit the node applied; AtTip whether it is the tip.
	Commit  string          `json:"commit,omitempty" yaml:"commit,omitempty"`
	AtTip   bool            `json:"atTip" yaml:"atTip"`
	Refused *report.Refusal `json:"refused,omitempty" yaml:"refused,omitempty"`
	// PlanID is the plan the node follows; PlanAgrees whether it is the
	// plan most nodes at the tip follow.
	PlanID     string `json:"planID,omitempty" yaml:"planID,omitempty"`
	PlanAgrees bool   `json:"planAgrees" yaml:"planAgrees"`
	// Assigned counts the instances the plan puts on the node, Running
	// those of them it reports running.
	Assigned int `json:"assigned" yaml:"assigned"`
	Running  int `json:"running" yaml:"running"`
	// Committed is what its assigned instances reserve; Capacity is nil
	// when the node's capacity is unknown (no limit).
	Committed Resources  `json:"committed" yaml:"committed"`
	Capacity  *Resources `json:"capacity" yaml:"capacity"`
	// Problems are the host prerequisites that do not hold; Errors the
	// errors of its instances, "instance: error".
	Problems []report.Problem `json:"problems" yaml:"problems"`
	Errors   []string         `json:"errors" yaml:"errors"`
	// Report is the node's newest report as read (for the node's page).
	Report *report.Report `json:"-" yaml:"-"`
}

// Resources are CPU and memory as plain numbers, for programs: zero is a
// valid amount here (nothing committed), unlike in a spec.
type Resources struct {
	CPUMillicores int64 `json:"cpuMillicores" yaml:"cpuMillicores"`
	MemoryBytes   int64 `json:"memoryBytes" yaml:"memoryBytes"`
}

func resourcesOf(r render.Resources) Resources {
	return Resources{CPUMillicores: int64(r.CPU), MemoryBytes: int64(r.Memory)}
}

// Service is one Service's row.
type Service struct {
	Name     string `json:"name" yaml:"name"`
	VIP      string `json:"vip" yaml:"vip"`
	Port     int    `json:"port" yaml:"port"`
	Replicas int    `json:"replicas" yaml:"replicas"`
	// Ready counts the replicas running and ready on alive nodes (the
	// endpoints the proxies use); Updated those of them running the tip's
	// spec.
	Ready     int      `json:"ready" yaml:"ready"`
	Updated   int      `json:"updated" yaml:"updated"`
	Endpoints []string `json:"endpoints" yaml:"endpoints"`
	// Paused names the replicas that paused the Service's rollout (not
	// ready within its progressDeadline); empty unless it is paused.
	Paused []string `json:"paused,omitempty" yaml:"paused,omitempty"`
}

// Instance is an instance that is not running as the tip says: one still
// to start, replace or move, failing, crash-looping, or unschedulable.
type Instance struct {
	Name    string `json:"name" yaml:"name"`
	Service string `json:"service,omitempty" yaml:"service,omitempty"`
	Node    string `json:"node,omitempty" yaml:"node,omitempty"`
	// Action is what the node still does (planner's pending actions:
	// create, replace, restart, update, move, failing, wait, ...) or
	// "unschedulable".
	Action string `json:"action" yaml:"action"`
	// State is what the node reports (empty when it lists no such
	// instance); Restarts and Error come from the same report.
	State    report.State `json:"state,omitempty" yaml:"state,omitempty"`
	Restarts int          `json:"restarts,omitempty" yaml:"restarts,omitempty"`
	Error    string       `json:"error,omitempty" yaml:"error,omitempty"`
	Reason   string       `json:"reason" yaml:"reason"`
}

// Ingress is one Ingress host.
type Ingress struct {
	Host     string   `json:"host" yaml:"host"`
	Paths    []string `json:"paths" yaml:"paths"`
	Services []string `json:"services" yaml:"services"`
	TLS      bool     `json:"tls" yaml:"tls"`
	// Owner is the node that orders the certificate; Serving the alive
	// nodes that serve the host with a valid certificate (every ingress
	// node, for a host without TLS).
	Owner   string   `json:"owner,omitempty" yaml:"owner,omitempty"`
	Serving []string `json:"serving" yaml:"serving"`
	// Expires is the soonest expiry among the serving nodes'
	// certificates; Expiring is true within CertificateWarning of it.
	Expires  *time.Time `json:"expires,omitempty" yaml:"expires,omitempty"`
	Expiring bool       `json:"expiring" yaml:"expiring"`
	Issuer   string     `json:"issuer,omitempty" yaml:"issuer,omitempty"`
	// Error is the newest error a node reports for the host's certificate.
	Error string `json:"error,omitempty" yaml:"error,omitempty"`
}

// Volume is a volume a node holds.
type Volume struct {
	Name string `json:"name" yaml:"name"`
	Node string `json:"node" yaml:"node"`
	// User is the instance whose spec mounts it; empty for a volume no
	// instance at the tip uses (kept, never deleted by Keel).
	User string `json:"user" yaml:"user"`
}

// History is how far a recent commit of the branch got.
type History struct {
	Commit
	// Applied counts the nodes that run this commit or a later one;
	// Refused the nodes that refused it.
	Applied int      `json:"applied" yaml:"applied"`
	Nodes   int      `json:"nodes" yaml:"nodes"`
	Refused []string `json:"refused" yaml:"refused"`
}

// Input is what Compute reads.
type Input struct {
	Snapshot *Snapshot
	// Now is the time of the status; report ages and liveness count
	// from it.
	Now time.Time
}

// Compute works out the cluster's status from a snapshot.
func Compute(in Input) *Status {
	snap := in.Snapshot
	s := &Status{SchemaVersion: SchemaVersion, Time: in.Now.UTC(), Branch: snap.Branch, Tip: snap.Tip}
	m := snap.Tree.Model
	if m != nil {
		s.Cluster = m.Cluster.Name
	}
	newest := newestReports(snap.Reports, s.Time)
	if snap.Tree.Invalid || m == nil {
		if m != nil {
			for _, d := range m.Diagnostics.Errors() {
				s.Errors = append(s.Errors, d.String())
			}
		}
		s.Missing = []string{fmt.Sprintf("the specs at %s are invalid (%d errors): the nodes keep the last valid commit; first: %s",
			s.Tip.Short(), len(s.Errors), first(s.Errors))}
		s.leavingNodes(newest, nil, m)
		s.history(snap, newest)
		s.finish()
		return s
	}
	s.Valid = true
	plan := planner.Compute(planner.Input{Model: m, Commit: s.Tip.Hash, Reports: snap.Reports, Now: in.Now})
	s.PlanID = plan.PlanID
	s.Warnings = append(ProblemsAsWarnings(snap.Problems), plan.Warnings...)

	s.nodes(m, plan, newest)
	s.services(m, plan, newest)
	s.attention(m, plan, snap.Reports, newest)
	s.ingresses(m, plan, newest)
	s.volumes(m, newest)
	s.history(snap, newest)
	s.finish()
	return s
}

// newestReports keeps each node's newest report, as the planner does: a
// report dated more than planner.FutureLimit after now is set aside (a
// node may have several report refs, a local and a fetched one), and a
// tie goes the same way whatever the order of the refs.
func newestReports(reports []report.Report, now time.Time) map[string]*report.Report {
	out := map[string]*report.Report{}
	for i := range reports {
		r := &reports[i]
		if r.Time.After(now.Add(planner.FutureLimit)) {
			continue
		}
		if cur, ok := out[r.Node]; !ok || planner.Newer(r, cur) {
			out[r.Node] = r
		}
	}
	return out
}

func (s *Status) nodes(m *render.Model, plan *planner.Plan, newest map[string]*report.Report) {
	assigned := map[string][]planner.Placement{}
	for _, pl := range plan.Placements {
		assigned[pl.Node] = append(assigned[pl.Node], pl)
	}
	// The plan most alive nodes at the tip follow.
	votes := map[string]int{}
	for _, pn := range plan.Nodes {
		if r := newest[pn.Name]; pn.Alive && r != nil && r.Commit == s.Tip.Hash && r.PlanID != "" {
			votes[r.PlanID]++
		}
	}
	majority := ""
	for _, id := range slices.Sorted(maps.Keys(votes)) {
		if votes[id] > votes[majority] {
			majority = id
		}
	}
	var disagree []string
	for _, pn := range plan.Nodes {
		n := Node{Name: pn.Name, Committed: resourcesOf(pn.Committed), Problems: []report.Problem{}, Errors: []string{}, Assigned: len(assigned[pn.Name])}
		if !pn.Unlimited {
			c := resourcesOf(pn.Capacity)
			n.Capacity = &c
		}
		r := newest[pn.Name]
		switch {
		case r == nil:
			n.State = NodeUnreported
			s.Missing = append(s.Missing, fmt.Sprintf("node %s has never reported", pn.Name))
		case !pn.Alive:
			n.State = NodeDead
		case s.Time.Sub(r.Time) > time.Duration(m.Cluster.LivenessTTL)+planner.MaxClockLead(m):
			// The nodes judge liveness against the newest report, so when
			// every agent has stopped they all still look alive: the
			// reader's clock says they are not.
			n.State = NodeDead
		case pn.Settling:
			n.State = NodeSettling
		default:
			n.State = NodeAlive
		}
		if r != nil {
			s.fromReport(&n, r)
			for _, pl := range assigned[pn.Name] {
				if ri := r.Instance(pl.Instance); ri != nil && ri.State == report.StateRunning {
					n.Running++
				}
			}
			n.PlanAgrees = pn.Alive && n.PlanID == majority && majority != ""
			if n.State == NodeDead {
				s.Missing = append(s.Missing, fmt.Sprintf("node %s is dead: its last report is %s old (liveness TTL %s)",
					pn.Name, age(*n.ReportAge), time.Duration(m.Cluster.LivenessTTL)))
			} else {
				switch {
				case n.Refused != nil && n.Refused.Commit == s.Tip.Hash:
					s.Missing = append(s.Missing, fmt.Sprintf("node %s refused %s: %s", pn.Name, short(n.Refused.Commit), n.Refused.Reason))
				case !n.AtTip:
					s.Missing = append(s.Missing, fmt.Sprintf("node %s runs %s, not the tip %s", pn.Name, short(n.Commit), s.Tip.Short()))
				case !n.PlanAgrees:
					disagree = append(disagree, pn.Name)
				}
			}
		}
		if n.State == NodeAlive || n.State == NodeSettling {
			s.Counts.NodesAlive++
		}
		if n.AtTip {
			s.Counts.NodesAtTip++
		}
		s.Counts.Running += n.Running
		s.Nodes = append(s.Nodes, n)
	}
	if len(disagree) > 0 {
		s.Missing = append(s.Missing, fmt.Sprintf("%s %s not yet on the plan the others follow (%s)",
			plural(len(disagree), "node"), isAre(len(disagree)), strings.Join(disagree, ", ")))
	}
	s.Counts.Nodes = len(plan.Nodes)
	s.Counts.Instances = len(plan.Placements)
	s.leavingNodes(newest, plan, m)
}

// fromReport fills n with what r says.
func (s *Status) fromReport(n *Node, r *report.Report) {
	t := r.Time.UTC()
	a := int64(max(0, s.Time.Sub(t)) / time.Second)
	n.ReportTime, n.ReportAge = &t, &a
	n.AgentVersion, n.Commit, n.PlanID, n.Refused = r.AgentVersion, r.Commit, r.PlanID, r.Refused
	n.AtTip = r.Commit == s.Tip.Hash
	n.Problems = append(n.Problems, r.Problems...)
	for _, ri := range r.Instances {
		if ri.Error != "" {
			n.Errors = append(n.Errors, ri.Name+": "+ri.Error)
		}
	}
	n.Report = r
}

// leavingNodes adds the nodes that report but are not in the inventory
// (with no plan, every node that reports).
func (s *Status) leavingNodes(newest map[string]*report.Report, plan *planner.Plan, m *render.Model) {
	for _, name := range slices.Sorted(maps.Keys(newest)) {
		if plan != nil && slices.ContainsFunc(plan.Nodes, func(n planner.Node) bool { return n.Name == name }) {
			continue
		}
		n := Node{Name: name, State: NodeLeaving, Problems: []report.Problem{}, Errors: []string{}}
		s.fromReport(&n, newest[name])
		if plan == nil {
			// The tip is invalid: no inventory to compare with, and no
			// planner to judge liveness; the reader's clock does, with
			// the TTL of the specs as far as they rendered.
			ttl := render.DefaultLivenessTTL
			if m != nil && m.Cluster.LivenessTTL > 0 {
				ttl = m.Cluster.LivenessTTL
			}
			n.State = NodeAlive
			if s.Time.Sub(*n.ReportTime) > time.Duration(ttl)+time.Duration(ttl)/3 {
				n.State = NodeDead
			}
		}
		s.Nodes = append(s.Nodes, n)
	}
}

func (s *Status) services(m *render.Model, plan *planner.Plan, newest map[string]*report.Report) {
	placed := map[string]string{}
	for _, pl := range plan.Placements {
		placed[pl.Instance] = pl.Node
	}
	for _, ps := range plan.Services {
		svc := m.Service(ps.Name)
		row := Service{Name: ps.Name, VIP: ps.VIP.String(), Port: ps.Port, Replicas: svc.Replicas, Ready: len(ps.Endpoints), Endpoints: []string{}}
		for _, ep := range ps.Endpoints {
			row.Endpoints = append(row.Endpoints, fmt.Sprintf("%s:%d", ep.Address, ps.Port))
			inst := m.Instance(ep.Instance)
			if r := newest[ep.Node]; r != nil && inst != nil && placed[ep.Instance] == ep.Node {
				if ri := r.Instance(ep.Instance); ri != nil && ri.SpecHash == inst.SpecHash {
					row.Updated++
				}
			}
		}
		if ro := ps.Rollout; ro != nil && ro.Paused {
			row.Paused = ro.Failed
			s.Missing = append(s.Missing, fmt.Sprintf("service %s: its rollout is paused: %s not ready within its progressDeadline (fix the spec, or git revert)",
				row.Name, strings.Join(ro.Failed, ", ")))
		}
		if row.Ready >= row.Replicas {
			s.Counts.ServicesReady++
		} else {
			s.Missing = append(s.Missing, fmt.Sprintf("service %s has %d of %d replicas ready", row.Name, row.Ready, row.Replicas))
		}
		s.Services = append(s.Services, row)
	}
	s.Counts.Services = len(s.Services)
}

func (s *Status) attention(m *render.Model, plan *planner.Plan, reports []report.Report, newest map[string]*report.Report) {
	for _, c := range planner.Pending(m, plan, reports) {
		row := Instance{Name: c.Instance, Service: c.Service, Node: c.Node, Action: c.Action, Reason: c.Reason}
		if r := newest[c.Node]; r != nil {
			if ri := r.Instance(c.Instance); ri != nil {
				row.State, row.Restarts, row.Error = ri.State, ri.Restarts, ri.Error
			}
		}
		if c.Action == planner.ActionUnschedulable {
			s.Counts.Unschedulable++
		}
		s.Attention = append(s.Attention, row)
		what := cmp.Or(c.Reason, c.Action)
		if row.State == report.StateCrashLoop {
			what = fmt.Sprintf("crash-looping (%d restarts): %s", row.Restarts, cmp.Or(row.Error, c.Reason))
		}
		where := ""
		if c.Node != "" {
			where = " on " + c.Node
		}
		s.Missing = append(s.Missing, fmt.Sprintf("instance %s%s: %s", c.Instance, where, what))
	}
}

func (s *Status) ingresses(m *render.Model, plan *planner.Plan, newest map[string]*report.Report) {
	byHost := map[string]*Ingress{}
	var hosts []string
	for _, pi := range plan.Ingresses {
		ing := byHost[pi.Host]
		if ing == nil {
			ing = &Ingress{Host: pi.Host, Owner: pi.Owner, Serving: []string{}}
			byHost[pi.Host] = ing
			hosts = append(hosts, pi.Host)
		}
		ing.Paths = append(ing.Paths, pi.Path)
		if !slices.Contains(ing.Services, pi.Service) {
			ing.Services = append(ing.Services, pi.Service)
		}
		if spec := findIngress(m, pi.Name); spec != nil && spec.TLS != nil {
			ing.TLS = true
		}
	}
	alive := map[string]bool{}
	for _, n := range s.Nodes {
		alive[n.Name] = n.State == NodeAlive || n.State == NodeSettling
	}
	serves := map[string]bool{}
	for _, n := range m.IngressNodes() {
		serves[n.Name] = true
	}
	slices.Sort(hosts)
	for _, host := range hosts {
		ing := byHost[host]
		var errTime time.Time
		for _, node := range slices.Sorted(maps.Keys(newest)) {
			r := newest[node]
			if !alive[node] || !serves[node] {
				continue
			}
			if !ing.TLS {
				ing.Serving = append(ing.Serving, node)
				continue
			}
			for _, c := range r.Certificates {
				if c.Host != host {
					continue
				}
				if c.Holds(s.Time) {
					ing.Serving = append(ing.Serving, node)
					if ing.Expires == nil || c.Expires.Before(*ing.Expires) {
						e := c.Expires.UTC()
						ing.Expires, ing.Issuer = &e, c.Issuer
					}
				}
				if c.Error != "" && r.Time.After(errTime) {
					ing.Error, errTime = c.Error, r.Time
				}
			}
		}
		if ing.Expires != nil && ing.Expires.Sub(s.Time) < CertificateWarning {
			ing.Expiring = true
			s.Warnings = append(s.Warnings, planner.Warning{Code: "certificate-expiring", Subject: host,
				Message: fmt.Sprintf("the certificate of %s expires in %s (%s)", host, age(int64(ing.Expires.Sub(s.Time)/time.Second)), ing.Expires.Format(time.RFC3339))})
		}
		if ing.TLS && len(ing.Serving) == 0 {
			msg := fmt.Sprintf("ingress host %s has no valid certificate on any alive node", host)
			if ing.Error != "" {
				msg += ": " + ing.Error
			}
			s.Missing = append(s.Missing, msg)
		}
		s.Ingresses = append(s.Ingresses, *ing)
	}
}

func findIngress(m *render.Model, name string) *render.Ingress {
	for i := range m.Ingresses {
		if m.Ingresses[i].Name == name {
			return &m.Ingresses[i]
		}
	}
	return nil
}

func (s *Status) volumes(m *render.Model, newest map[string]*report.Report) {
	user := map[string]string{}
	for _, inst := range m.Instances {
		for _, v := range inst.Spec.Volumes {
			user[v.Name] = inst.Name
		}
	}
	for _, node := range slices.Sorted(maps.Keys(newest)) {
		for _, v := range newest[node].Volumes {
			s.Volumes = append(s.Volumes, Volume{Name: v.Name, Node: node, User: user[v.Name]})
		}
	}
	slices.SortFunc(s.Volumes, func(a, b Volume) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Node, b.Node)) })
}

// history says how far each recent commit got: a node counts for every
// commit from the one it runs back (first parents).
func (s *Status) history(snap *Snapshot, newest map[string]*report.Report) {
	index := map[string]int{}
	for i, c := range snap.History {
		index[c.Hash] = i
	}
	// Only the inventory's nodes count: a leaving node's commit is not
	// the cluster's progress (Applied could pass Nodes).
	member := map[string]bool{}
	for _, n := range s.Nodes {
		if n.State != NodeLeaving {
			member[n.Name] = true
		}
	}
	for i, c := range snap.History {
		h := History{Commit: c, Nodes: len(member), Refused: []string{}}
		for _, node := range slices.Sorted(maps.Keys(newest)) {
			r := newest[node]
			if !member[node] {
				continue
			}
			if at, ok := index[r.Commit]; ok && at <= i {
				h.Applied++
			}
			if r.Refused != nil && r.Refused.Commit == c.Hash {
				h.Refused = append(h.Refused, node)
			}
		}
		s.History = append(s.History, h)
	}
}

// finish sets the headline and makes every list non-nil.
func (s *Status) finish() {
	s.Converged = s.Valid && len(s.Missing) == 0
	switch {
	case s.Converged:
		s.Headline = fmt.Sprintf("converged at %s", s.Tip.Short())
	case len(s.Missing) == 1:
		s.Headline = fmt.Sprintf("not converged at %s: %s", s.Tip.Short(), s.Missing[0])
	default:
		s.Headline = fmt.Sprintf("not converged at %s: %s (and %d more)", s.Tip.Short(), s.Missing[0], len(s.Missing)-1)
	}
	s.Errors = nonNil(s.Errors)
	s.Missing = nonNil(s.Missing)
	s.Nodes = nonNil(s.Nodes)
	s.Services = nonNil(s.Services)
	s.Attention = nonNil(s.Attention)
	s.Ingresses = nonNil(s.Ingresses)
	s.Volumes = nonNil(s.Volumes)
	s.History = nonNil(s.History)
	s.Warnings = nonNil(s.Warnings)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// age writes seconds the way people read them: 42s, 5m10s, 3h5m, 12d3h.
func age(seconds int64) string {
	d := time.Duration(seconds) * time.Second
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", seconds)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", seconds/60, seconds%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", seconds/3600, seconds%3600/60)
	default:
		return fmt.Sprintf("%dd%02dh", seconds/86400, seconds%86400/3600)
	}
}

// Age is age for the views.
func Age(seconds int64) string { return age(seconds) }

const maxSubject = 200

// clip bounds s to n bytes at a UTF-8 boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
