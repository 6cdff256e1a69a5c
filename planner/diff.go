package planner

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// Actions a change can take.
const (
	ActionCreate        = "create"
	ActionRemove        = "remove"
	ActionReplace       = "replace"
	ActionRestart       = "restart"
	ActionUpdate        = "update" // live change: resources or restartPolicy
	ActionMove          = "move"
	ActionScale         = "scale"
	ActionPort          = "port" // a Service's port: proxies only
	ActionUnschedulable = "unschedulable"
	ActionFailing       = "failing" // pending: not running on its node
	ActionWait          = "wait"    // pending: outdated, held back by the rollout
	// ActionStop (pending): a node that is not in the inventory reports the
	// instance not stopped; its agent stops it (decommission).
	ActionStop = "stop"
)

// Change is one thing that a plan does differently from another, or from
// what the nodes report.
type Change struct {
	Instance string `json:"instance"`
	Service  string `json:"service,omitempty"`
	Action   string `json:"action"`
	// Node is where the change happens (the new node for a move).
	Node string `json:"node,omitempty"`
	// From is the node an instance moves from.
	From string `json:"from,omitempty"`
	// Fields lists the spec fields that differ, for replace/restart/update,
	// and Details what each became, old → new, in the same order
	// (render.FieldChange.Detail: secret-looking env values masked).
	Fields  []string `json:"fields,omitempty"`
	Details []string `json:"details,omitempty"`
	Reason  string   `json:"reason,omitempty"`
}

// Allocation is a subnet, VIP or pin that a change adds, drops or changes.
type Allocation struct {
	Kind   string `json:"kind"` // subnet, vip or pin
	Name   string `json:"name"`
	Action string `json:"action"` // added, removed or changed
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
}

// Diff compares the plan of a base commit with the plan of a head commit,
// made from the same reports: what the change itself does.
func Diff(baseModel *render.Model, base *Plan, headModel *render.Model, head *Plan) []Change {
	var out []Change
	basePl, headPl := placementsByName(base), placementsByName(head)
	baseUn, headUn := unschedulableByName(base), unschedulableByName(head)
	for _, inst := range headModel.Instances {
		if inst.Surge {
			continue // runs only during a rollout: Pending shows it
		}
		old := baseModel.Instance(inst.Name)
		hp, hasHead := headPl[inst.Name]
		node := ""
		if hasHead {
			node = hp.Node
		}
		if reason, ok := headUn[inst.Name]; ok {
			if _, was := baseUn[inst.Name]; !was || old == nil {
				out = append(out, Change{Instance: inst.Name, Service: inst.Service, Action: ActionUnschedulable, Reason: reason})
			}
			if old == nil {
				continue
			}
		}
		if old == nil {
			out = append(out, Change{Instance: inst.Name, Service: inst.Service, Action: ActionCreate, Node: node, Reason: newReason(baseModel, &inst)})
			continue
		}
		bp, hasBase := basePl[inst.Name]
		if hasBase && hasHead && bp.Node != hp.Node {
			out = append(out, Change{Instance: inst.Name, Service: inst.Service, Action: ActionMove, Node: hp.Node, From: bp.Node, Reason: moveReason(baseModel, headModel, old, &inst, bp.Node)})
		} else if !hasBase && hasHead {
			out = append(out, Change{Instance: inst.Name, Service: inst.Service, Action: ActionCreate, Node: node, Reason: "it can be placed now"})
		}
		if fc := render.CompareSpecs(old.Spec, inst.Spec); len(fc) > 0 {
			out = append(out, specChange(headModel, &inst, node, fc))
		}
	}
	for _, inst := range baseModel.Instances {
		if !inst.Surge && headModel.Instance(inst.Name) == nil {
			node := ""
			if bp, ok := basePl[inst.Name]; ok {
				node = bp.Node
			}
			reason := "deleted from the specs"
			if inst.Service != "" && headModel.Service(inst.Service) != nil {
				reason = "scaled down"
			}
			out = append(out, Change{Instance: inst.Name, Service: inst.Service, Action: ActionRemove, Node: node, Reason: reason})
		}
	}
	for _, svc := range headModel.Services {
		old := baseModel.Service(svc.Name)
		if old == nil {
			continue
		}
		if old.Replicas != svc.Replicas {
			out = append(out, Change{Instance: svc.Name, Service: svc.Name, Action: ActionScale, Reason: fmt.Sprintf("replicas %d → %d", old.Replicas, svc.Replicas)})
		}
		if old.Port != svc.Port {
			out = append(out, Change{Instance: svc.Name, Service: svc.Name, Action: ActionPort, Reason: fmt.Sprintf("port %d → %d (proxies only)", old.Port, svc.Port)})
		}
	}
	sortChanges(out)
	return out
}

func newReason(base *render.Model, inst *render.Instance) string {
	if inst.Service != "" && base.Service(inst.Service) == nil {
		return "new Service " + inst.Service
	}
	if inst.Service != "" {
		return "scaled up"
	}
	return "new Jail"
}

func moveReason(baseModel, headModel *render.Model, old, cur *render.Instance, from string) string {
	oldNode, newNode := baseModel.Node(from), headModel.Node(from)
	switch {
	case newNode == nil:
		return fmt.Sprintf("node %s left the inventory", from)
	case oldNode != nil && oldNode.Schedulable && !newNode.Schedulable && !cur.Stateful:
		return fmt.Sprintf("node %s is drained (schedulable: false)", from)
	case old.Node != cur.Node:
		return fmt.Sprintf("spec.node changed (%q → %q)", old.Node, cur.Node)
	case !maps.Equal(old.NodeSelector, cur.NodeSelector):
		return "spec.nodeSelector changed"
	case oldNode != nil && !maps.Equal(oldNode.Labels, newNode.Labels):
		return fmt.Sprintf("node %s's labels changed", from)
	case old.Spec.Resources != cur.Spec.Resources:
		return "resources changed and no longer fit"
	default:
		return "placement changed (capacity or other instances moved)"
	}
}

// specChange turns the fields that differ into one change, named after the
// most disruptive class among them.
func specChange(m *render.Model, inst *render.Instance, node string, fc []render.FieldChange) Change {
	action := ActionUpdate
	var fields, details []string
	for _, f := range fc {
		fields = append(fields, f.Field)
		details = append(details, f.Detail)
		switch {
		case f.Class == render.ChangeReplace:
			action = ActionReplace
		case f.Class == render.ChangeRestart && action != ActionReplace:
			action = ActionRestart
		}
	}
	reason := ""
	if svc := m.Service(inst.Service); action != ActionUpdate && svc != nil {
		reason = pacingText(svc)
	}
	return Change{Instance: inst.Name, Service: inst.Service, Action: action, Node: node, Fields: fields, Details: details, Reason: reason}
}

// pacingText says how a Service's rollout is paced, for a change's reason.
func pacingText(svc *render.Service) string {
	st := strategyOf(svc)
	if st.MaxSurge == 0 && st.MaxUnavailable == 1 {
		return "one replica at a time"
	}
	text := fmt.Sprintf("at most %d of %d replicas unavailable", st.MaxUnavailable, svc.Replicas)
	if st.MaxSurge > 0 {
		text += fmt.Sprintf(", %d surge", st.MaxSurge)
	}
	return text
}

// Pending compares a plan with what the reports show: what the agents will
// still do whatever the change under review.
func Pending(m *render.Model, plan *Plan, reports []report.Report) []Change {
	byNode := map[string]*report.Report{}
	for i := range reports {
		r := &reports[i]
		if cur, ok := byNode[r.Node]; !ok || Newer(r, cur) {
			byNode[r.Node] = r
		}
	}
	alive := map[string]bool{}
	for _, n := range plan.Nodes {
		alive[n.Name] = n.Alive
	}
	// The nodes whose newest report lists each instance, in name order;
	// a name listed twice in one report counts once.
	nodes := slices.Sorted(maps.Keys(byNode))
	listedOn := map[string][]string{}
	for _, n := range nodes {
		for _, ri := range byNode[n].Instances {
			if on := listedOn[ri.Name]; len(on) == 0 || on[len(on)-1] != n {
				listedOn[ri.Name] = append(on, n)
			}
		}
	}
	var out []Change
	placed := placementsByName(plan)
	for _, pl := range plan.Placements {
		inst := m.Instance(pl.Instance)
		r := byNode[pl.Node]
		if inst != nil && inst.Surge && (r == nil || r.Instance(pl.Instance) == nil) {
			out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionCreate, Node: pl.Node, Reason: "surge instance, while the rollout is under way"})
			continue
		}
		var ri *report.Instance
		if r != nil {
			ri = r.Instance(pl.Instance)
		}
		switch {
		case ri == nil:
			// The node it runs on now: an alive one first, else a dead one.
			from := ""
			for _, n := range listedOn[pl.Instance] {
				if n != pl.Node && (from == "" || alive[n] && !alive[from]) {
					from = n
				}
			}
			if from != "" {
				reason := "stopped on " + from + " once it runs on " + pl.Node
				switch {
				case m.Node(from) == nil && inst != nil && inst.Stateful:
					reason = "started on " + pl.Node + " once " + from + " reports it stopped: node " + from + " is not in the inventory (decommission)"
				case m.Node(from) == nil:
					reason += ": node " + from + " is not in the inventory (decommission)"
				case !alive[from]:
					reason = "node " + from + " is dead"
				case inst != nil && byNode[from].LimitsOff() && limited(inst):
					reason += ": node " + from + " cannot enforce its resource limits (racct)"
				case inst != nil && inst.Stateful:
					reason = "started on " + pl.Node + " once " + from + " reports it stopped"
				}
				out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionMove, Node: pl.Node, From: from, Reason: reason})
			} else if !alive[pl.Node] {
				out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionCreate, Node: pl.Node, Reason: "waits for node " + pl.Node + ", which is dead"})
			} else {
				out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionCreate, Node: pl.Node})
			}
		case pl.Outdated != "":
			action := ActionReplace
			if pl.Outdated == render.ChangeRestart {
				action = ActionRestart
			}
			reason := "released"
			if !pl.Released {
				action, reason = ActionWait, fmt.Sprintf("%s held back by the rollout", pl.Outdated)
			} else if ri.Pull != nil && ri.Pull.Error != "" {
				reason = fmt.Sprintf("released; pulling %s: %s (%d failures)", ri.Pull.Image, ri.Pull.Error, ri.Pull.Failures)
			} else if ri.Pull != nil {
				reason = "released; pulling " + ri.Pull.Image
			}
			out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: action, Node: pl.Node, Reason: reason})
		case ri.State == report.StatePulling && ri.Pull != nil && ri.Pull.Error != "":
			out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionFailing, Node: pl.Node,
				Reason: fmt.Sprintf("pulling %s: %s (%d failures)", ri.Pull.Image, ri.Pull.Error, ri.Pull.Failures)})
		case ri.State != report.StateRunning && ri.State != report.StateStarting && ri.State != report.StatePulling:
			reason := string(ri.State)
			if ri.Restarts > 0 {
				reason += fmt.Sprintf(", %d restarts", ri.Restarts)
			}
			if ri.Error != "" {
				reason += ": " + ri.Error
			}
			out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionFailing, Node: pl.Node, Reason: reason})
		case inst != nil && ri.SpecHash != inst.SpecHash:
			out = append(out, Change{Instance: pl.Instance, Service: pl.Service, Action: ActionUpdate, Node: pl.Node, Reason: "resources or restartPolicy applied live"})
		}
	}
	for _, u := range plan.Unschedulable {
		out = append(out, Change{Instance: u.Instance, Service: u.Service, Action: ActionUnschedulable, Reason: u.Reason})
	}
	moving := map[[2]string]bool{} // instance, from
	for _, c := range out {
		if c.Action == ActionMove {
			moving[[2]string{c.Instance, c.From}] = true
		}
	}
	for _, n := range nodes {
		if !alive[n] {
			continue
		}
		listed := map[string]bool{}
		for _, ri := range byNode[n].Instances {
			if listed[ri.Name] {
				continue
			}
			listed[ri.Name] = true
			inst := m.Instance(ri.Name)
			if inst == nil {
				out = append(out, Change{Instance: ri.Name, Action: ActionRemove, Node: n, Reason: "no longer in the specs"})
			} else if _, ok := placed[ri.Name]; !ok && inst.Surge {
				if ri.State != report.StateStopped {
					out = append(out, Change{Instance: ri.Name, Service: inst.Service, Action: ActionRemove, Node: n, Reason: "surge instance, the rollout is over"})
				}
			} else if pl, ok := placed[ri.Name]; !ok {
				continue // unschedulable: listed above
			} else if pl.Node != n && !moving[[2]string{ri.Name, n}] {
				out = append(out, Change{Instance: ri.Name, Action: ActionRemove, Node: n, Reason: "runs on " + pl.Node + " now (duplicate)"})
			}
		}
	}
	// A node outside the inventory (deleted from nodes/, or never in it)
	// that still reports instances not stopped: its agent stops them. An
	// instance with a move listed above is not listed twice.
	for _, n := range nodes {
		if m.Node(n) != nil {
			continue
		}
		listed := map[string]bool{}
		for _, ri := range byNode[n].Instances {
			if ri.State == report.StateStopped || listed[ri.Name] || moving[[2]string{ri.Name, n}] {
				continue
			}
			listed[ri.Name] = true
			c := Change{Instance: ri.Name, Action: ActionStop, Node: n, Reason: leftReason(n)}
			if inst := m.Instance(ri.Name); inst != nil {
				c.Service = inst.Service
			}
			out = append(out, c)
		}
	}
	sortChanges(out)
	return out
}

// leftReason says why a node outside the inventory stops what it runs.
func leftReason(node string) string {
	return "node " + node + " is not in the inventory: its agent stops it (decommission)"
}

// DiffAllocations compares two locks (as keel lock would write them).
func DiffAllocations(base, head render.Lock) []Allocation {
	var out []Allocation
	out = append(out, diffAlloc("subnet", base.Subnets, head.Subnets)...)
	out = append(out, diffAlloc("vip", base.VIPs, head.VIPs)...)
	out = append(out, diffAlloc("pin", base.Pins, head.Pins)...)
	return out
}

func diffAlloc[V comparable](kind string, a, b map[string]V) []Allocation {
	var out []Allocation
	keys := slices.Sorted(maps.Keys(a))
	keys = append(keys, slices.Sorted(maps.Keys(b))...)
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		va, ina := a[k]
		vb, inb := b[k]
		switch {
		case ina && !inb:
			out = append(out, Allocation{Kind: kind, Name: k, Action: "removed", From: fmt.Sprint(va)})
		case !ina && inb:
			out = append(out, Allocation{Kind: kind, Name: k, Action: "added", To: fmt.Sprint(vb)})
		case va != vb:
			out = append(out, Allocation{Kind: kind, Name: k, Action: "changed", From: fmt.Sprint(va), To: fmt.Sprint(vb)})
		}
	}
	return out
}

func placementsByName(p *Plan) map[string]Placement {
	out := make(map[string]Placement, len(p.Placements))
	for _, pl := range p.Placements {
		out[pl.Instance] = pl
	}
	return out
}

func unschedulableByName(p *Plan) map[string]string {
	out := map[string]string{}
	for _, u := range p.Unschedulable {
		out[u.Instance] = u.Reason
	}
	return out
}

var actionOrder = []string{ActionUnschedulable, ActionRemove, ActionStop, ActionMove, ActionReplace, ActionRestart, ActionCreate, ActionScale, ActionPort, ActionUpdate, ActionFailing, ActionWait}

func sortChanges(c []Change) {
	slices.SortFunc(c, func(a, b Change) int {
		return cmp.Or(
			strings.Compare(cmp.Or(a.Service, a.Instance), cmp.Or(b.Service, b.Instance)),
			strings.Compare(a.Instance, b.Instance),
			cmp.Compare(slices.Index(actionOrder, a.Action), slices.Index(actionOrder, b.Action)),
			strings.Compare(a.Node, b.Node),
		)
	})
}
