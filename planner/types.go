package planner

import (
	"net/netip"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// Input is everything a plan depends on.
type Input struct {
	Model *render.Model
	// Commit is the spec commit being planned (hex), used to tell which
	// nodes refused it; empty for a working tree.
	Commit string
	// Reports are the nodes' reports, in any order. Only the newest of a
	// node counts. Reports of nodes not in the inventory count for break
	// before make only (Placement.WaitsFor) and are warned about
	// (WarnNodeLeaving when they list instances not stopped); Pending lists
	// what such a node still runs (ActionStop).
	Reports []report.Report
	// Now is the reader's clock: reports dated more than FutureLimit ahead
	// of it are ignored, and ClusterTime runs at most MaxClockLead ahead of
	// it.
	Now time.Time
	// AssumeAlive plans, when there is no report at all, as if every node
	// of the inventory were alive with its declared capacity (keel plan in
	// a repository whose agents have not reported yet).
	AssumeAlive bool
	// PresumeAlive names nodes to treat as alive while they have no report
	// at all (an agent's warm-up after it starts: its peers may simply not
	// have reported yet). Nodes with a report are judged by it.
	PresumeAlive []string
	// Gossip is the planning node's view of the gossip ring, when the
	// cluster has one (spec.gossip); nil judges every node by the age of
	// its report. See Liveness.
	Gossip *Gossip
}

// Gossip is one node's view of the gossip ring, dated in the cluster
// clock (Plan.ClusterTime's).
type Gossip struct {
	// Members are the inventory's nodes the ring has seen, by name; nil
	// when the planning node is in no ring now (Seen may still be set).
	Members map[string]Member
	// Seen is when a ring of the planning node, this one or an earlier
	// one (a ring restarted, moved or turned off), last saw each node
	// alive. A node the ring vouches for is not fetched for its
	// heartbeats, so its report may be far older than its last sign of
	// life: a node the current ring does not know is judged by the later
	// of its report's time and Seen.
	Seen map[string]time.Time
}

// Member is one node as the ring sees it.
type Member struct {
	// Alive is set while the node is alive or suspected: the failure
	// detector's suspicion is the hysteresis that keeps a short hiccup
	// from moving anything.
	Alive bool
	// Since is when it last became alive or dead in this view.
	Since time.Time
	// Rejoined is when it last came back after this view had it dead
	// (zero if it never did): it is settling from then (SettlePeriod).
	Rejoined time.Time
}

// Reasons an instance is where it is.
const (
	ReasonPinned = "pinned" // keel.lock pins the stateful instance here
	ReasonHeld   = "held"   // this node's report lists its volumes
	ReasonSticky = "sticky" // this alive node already runs it
	ReasonNew    = "new"    // placed by rendezvous hashing
)

// Plan is the planner's answer. Slices are sorted by name.
type Plan struct {
	Commit string `json:"commit"`
	// PlanID is a hash of the outputs (commit, alive set, placements,
	// ingress owners): two nodes with the same PlanID act on the same plan.
	PlanID string `json:"planID"`
	// PlacementID is a hash of the commit, of where (node and address)
	// the plan puts each instance and of who owns each ingress: the part
	// of the plan that moves work between nodes (PlanID hashes rollout
	// releases and the alive set too). An agent saves the reports a plan
	// came from before it acts on it when this differs from the
	// PlacementID of the plan it made from the reports it saved last.
	PlacementID string `json:"placementID"`
	// ClusterTime is the newest report time, capped at Now + MaxClockLead;
	// liveness is judged from it.
	ClusterTime   time.Time       `json:"clusterTime"`
	AssumedAlive  bool            `json:"assumedAlive"`
	Nodes         []Node          `json:"nodes"`
	Placements    []Placement     `json:"placements"`
	Unschedulable []Unschedulable `json:"unschedulable"`
	Services      []Service       `json:"services"`
	Ingresses     []Ingress       `json:"ingresses"`
	// Routes holds every alive node's subnet via its address; a node
	// installs all of them but its own (RoutesFor).
	Routes   []Route   `json:"routes"`
	Warnings []Warning `json:"warnings"`
}

// RoutesFor returns the routes node must install: every other alive node's
// subnet, via that node's address.
func (p *Plan) RoutesFor(node string) []Route {
	out := make([]Route, 0, len(p.Routes))
	for _, r := range p.Routes {
		if r.Node != node {
			out = append(out, r)
		}
	}
	return out
}

// Node is a node of the inventory as the plan sees it.
type Node struct {
	Name        string       `json:"name"`
	Alive       bool         `json:"alive"`
	Schedulable bool         `json:"schedulable"`
	Address     netip.Addr   `json:"address"`
	PodCIDR     netip.Prefix `json:"podCIDR"`
	// Settling is true for an alive node whose reports have run unbroken
	// for less than SettlePeriod (its report's since): it takes no
	// instance that another node reports.
	Settling bool `json:"settling,omitempty"`
	// ReportTime is the time of the node's report; zero without one.
	ReportTime time.Time `json:"reportTime,omitzero"`
	// RefusedCommit is true when the node refused the planned commit.
	RefusedCommit bool `json:"refusedCommit"`
	// LimitsOff is true when the node's report says it cannot enforce
	// resource limits (a racct problem): no instance with limits is placed
	// there anew or kept there by stickiness.
	LimitsOff bool `json:"limitsOff,omitempty"`
	// Capacity is the node's declared or reported capacity; Unlimited when
	// neither is known.
	Capacity  render.Resources `json:"capacity"`
	Unlimited bool             `json:"unlimited,omitempty"`
	// Committed is the sum of the resources of the instances placed on it.
	Committed render.Resources `json:"committed"`
}

// Route sends a node subnet to the node that holds it.
type Route struct {
	Node string       `json:"node"`
	Dest netip.Prefix `json:"dest"`
	Via  netip.Addr   `json:"via"`
}

// Placement puts an instance on a node at an address.
type Placement struct {
	Instance string     `json:"instance"`
	Service  string     `json:"service,omitempty"`
	Node     string     `json:"node"`
	Address  netip.Addr `json:"address"`
	Reason   string     `json:"reason"`
	// Outdated is the class of change (replace or restart) between what the
	// node reports running and the rendered spec; empty when up to date.
	Outdated render.ChangeClass `json:"outdated,omitempty"`
	// Released is true when the rollout lets the node apply that change now.
	Released bool `json:"released,omitempty"`
	// Generation is the copy's generation: the one its node reports for a
	// copy that exists there, else one more than any reported elsewhere.
	// Of two copies on live nodes, the higher generation keeps the
	// instance, so it never moves back on its own.
	Generation int `json:"generation,omitempty"`
	// WaitsFor names, for a stateful instance, the other nodes whose
	// newest report lists it in any state but stopped, whether or not the
	// node is alive or in the inventory, however old the report: the node
	// must not start it while any is named (break before make). Only a
	// newer report of that node without it, or its report ref deleted by
	// an operator who made sure the host is off, clears the name.
	WaitsFor []string `json:"waitsFor,omitempty"`
}

// Unschedulable is an instance that cannot be placed, with the reason.
type Unschedulable struct {
	Instance string `json:"instance"`
	Service  string `json:"service,omitempty"`
	Reason   string `json:"reason"`
}

// Service is a Service's proxy configuration, the same on every node.
type Service struct {
	Name string     `json:"name"`
	VIP  netip.Addr `json:"vip"`
	Port int        `json:"port"`
	// Endpoints are the replicas reported ready on alive nodes, less
	// those being drained (Draining).
	Endpoints []Endpoint `json:"endpoints"`
	// Rollout is where the Service's rollout stands; nil when no replica
	// is outdated, no surge instance is placed and nothing failed.
	Rollout *Rollout `json:"rollout,omitempty"`
}

// Rollout is a Service's rollout as the plan paces it (step 8).
type Rollout struct {
	// Replicas is how many the Service wants, Updated how many of them
	// run the rendered spec on their node, Available how many members
	// (replicas and surge instances) have been ready for the strategy's
	// minReadySeconds, and MinAvailable how many must stay so.
	Replicas     int `json:"replicas"`
	Updated      int `json:"updated"`
	Available    int `json:"available"`
	MinAvailable int `json:"minAvailable"`
	// Surge is how many surge instances are placed.
	Surge int `json:"surge,omitempty"`
	// Failed names the members started at the rendered spec that were
	// not ready within the strategy's progressDeadline.
	Failed []string `json:"failed,omitempty"`
	// Waiting names the members the rollout waits for while it holds
	// outdated available replicas back: those not available, and those
	// released for their update (the agents holding the replicas held
	// back ask these members' nodes for their reports over the gossip
	// ring).
	Waiting []string `json:"waiting,omitempty"`
	// Paused is true when a member failed and the strategy's
	// failureAction is pause: nothing more is released until the failed
	// members are ready or the spec changes (git revert).
	Paused bool `json:"paused,omitempty"`
}

// Endpoint is a replica that may receive connections.
type Endpoint struct {
	Instance string     `json:"instance"`
	Node     string     `json:"node"`
	Address  netip.Addr `json:"address"`
}

// Ingress is an Ingress with the node that serves it.
type Ingress struct {
	Name    string `json:"name"`
	Host    string `json:"host"`
	Path    string `json:"path"`
	Service string `json:"service"`
	// Owner serves the Ingress and obtains its certificate: a node that
	// can receive shared certificates when any candidate can; empty when
	// no node is alive.
	Owner  string `json:"owner"`
	Reason string `json:"reason"`
}

// Warning is something an operator should know about the plan.
type Warning struct {
	Code    string `json:"code"`
	Subject string `json:"subject,omitempty"`
	Message string `json:"message"`
}

// Warning codes.
const (
	WarnNoReports      = "no-reports"
	WarnReportIgnored  = "report-ignored"
	WarnNodeDead       = "node-dead"
	WarnGossipMinority = "gossip-minority"
	WarnGossipCutOff   = "gossip-cut-off"
	WarnPresumedAlive  = "presumed-alive"
	WarnSettling       = "settling"
	WarnRefused        = "refused"
	WarnPinnedDead     = "pinned-to-dead-node"
	WarnUnpinned       = "stateful-not-pinned"
	WarnUnschedulable  = "unschedulable"
	WarnOverCapacity   = "over-capacity"
	WarnDuplicate      = "duplicate-instance"
	WarnHeldTwice      = "volumes-held-twice"
	WarnIngressNoNode  = "ingress-without-node"
	WarnRolloutWaiting = "rollout-waiting"
	WarnRolloutPaused  = "rollout-paused"
	WarnSpecNodeIgnore = "pin-overrides-constraints"
	WarnNodeLeaving    = "node-leaving"
	WarnHostProblem    = "host-problem"
)
