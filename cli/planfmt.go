package cli

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/status"
)

// planOutput is keel plan's result; its JSON form is documented in
// docs/cli.md and is stable.
type planOutput struct {
	Base          string                  `json:"base,omitempty"`
	BaseCommit    string                  `json:"baseCommit,omitempty"`
	Head          string                  `json:"head,omitempty"`
	HeadCommit    string                  `json:"headCommit,omitempty"`
	PlanID        string                  `json:"planID"`
	Reports       int                     `json:"reports"`
	AssumedAlive  bool                    `json:"assumedAlive"`
	Compared      bool                    `json:"compared"`
	Nodes         []planNode              `json:"nodes"`
	Placements    []planPlacement         `json:"placements"`
	Unschedulable []planner.Unschedulable `json:"unschedulable"`
	Services      []planService           `json:"services"`
	Ingresses     []planner.Ingress       `json:"ingresses"`
	Changes       []planner.Change        `json:"changes"`
	Allocations   []planner.Allocation    `json:"allocations"`
	Pending       []planner.Change        `json:"pending"`
	Warnings      []planner.Warning       `json:"warnings"`
	Errors        []jsonDiagnostic        `json:"errors"`
}

type planNode struct {
	Name        string `json:"name"`
	Alive       bool   `json:"alive"`
	Schedulable bool   `json:"schedulable"`
	PodCIDR     string `json:"podCIDR"`
	Address     string `json:"address"`
	ReportTime  string `json:"reportTime,omitempty"`
	Refused     bool   `json:"refusedCommit"`
	// LimitsOff: the node reports that it cannot enforce resource limits.
	LimitsOff bool `json:"limitsOff,omitempty"`
	// Capacity is nil when neither the Node file nor a report gives it.
	Capacity  *render.Resources `json:"capacity"`
	Committed render.Resources  `json:"committed"`
	Instances int               `json:"instances"`
}

type planPlacement struct {
	Instance string `json:"instance"`
	Service  string `json:"service"`
	Node     string `json:"node"`
	Address  string `json:"address"`
	Reason   string `json:"reason"`
	Outdated string `json:"outdated,omitempty"`
	Released bool   `json:"released,omitempty"`
}

type planService struct {
	Name      string           `json:"name"`
	VIP       string           `json:"vip"`
	Port      int              `json:"port"`
	Endpoints []string         `json:"endpoints"`
	Rollout   *planner.Rollout `json:"rollout,omitempty"`
}

func (o *planOutput) addErrors(which string, s *status.Side) {
	for _, d := range toJSON(s.Model.Diagnostics.Errors()) {
		if which == "base" {
			d.Text = "base: " + d.Text
		}
		o.Errors = append(o.Errors, d)
	}
}

func (o *planOutput) fill(m *render.Model, p *planner.Plan) {
	o.PlanID = p.PlanID
	o.AssumedAlive = p.AssumedAlive
	count := map[string]int{}
	for _, pl := range p.Placements {
		count[pl.Node]++
		o.Placements = append(o.Placements, planPlacement{Instance: pl.Instance, Service: pl.Service, Node: pl.Node,
			Address: addrString(pl.Address.String()), Reason: pl.Reason, Outdated: string(pl.Outdated), Released: pl.Released})
	}
	for _, n := range p.Nodes {
		pn := planNode{Name: n.Name, Alive: n.Alive, Schedulable: n.Schedulable, PodCIDR: n.PodCIDR.String(), Address: n.Address.String(),
			Refused: n.RefusedCommit, LimitsOff: n.LimitsOff, Committed: n.Committed, Instances: count[n.Name]}
		if !n.ReportTime.IsZero() {
			pn.ReportTime = n.ReportTime.Format("2006-01-02T15:04:05Z07:00")
		}
		if !n.Unlimited {
			c := n.Capacity
			pn.Capacity = &c
		}
		o.Nodes = append(o.Nodes, pn)
	}
	o.Unschedulable = p.Unschedulable
	for _, s := range p.Services {
		ps := planService{Name: s.Name, VIP: s.VIP.String(), Port: s.Port, Endpoints: []string{}, Rollout: s.Rollout}
		for _, ep := range s.Endpoints {
			ps.Endpoints = append(ps.Endpoints, fmt.Sprintf("%s:%d", ep.Address, s.Port))
		}
		o.Services = append(o.Services, ps)
	}
	o.Ingresses = p.Ingresses
	o.Warnings = append(o.Warnings, p.Warnings...)
}

func addrString(s string) string {
	if s == "invalid IP" {
		return ""
	}
	return s
}

func (o *planOutput) normalize() {
	if o.Nodes == nil {
		o.Nodes = []planNode{}
	}
	if o.Placements == nil {
		o.Placements = []planPlacement{}
	}
	if o.Unschedulable == nil {
		o.Unschedulable = []planner.Unschedulable{}
	}
	if o.Services == nil {
		o.Services = []planService{}
	}
	if o.Ingresses == nil {
		o.Ingresses = []planner.Ingress{}
	}
	if o.Changes == nil {
		o.Changes = []planner.Change{}
	}
	if o.Allocations == nil {
		o.Allocations = []planner.Allocation{}
	}
	if o.Pending == nil {
		o.Pending = []planner.Change{}
	}
	if o.Warnings == nil {
		o.Warnings = []planner.Warning{}
	}
	if o.Errors == nil {
		o.Errors = []jsonDiagnostic{}
	}
}

func (o *planOutput) write(w io.Writer, format string) error {
	o.normalize()
	switch format {
	case "json":
		return writeJSON(w, o)
	case "markdown":
		_, err := io.WriteString(w, o.markdown())
		return err
	default:
		_, err := io.WriteString(w, o.text())
		return err
	}
}

// summary is the one-line count of what the change (or, without a base,
// the pending work) does.
func (o *planOutput) summary() string {
	if len(o.Errors) > 0 {
		return fmt.Sprintf("invalid: %s", plural(len(o.Errors), "error"))
	}
	changes := o.Pending
	what := "pending"
	if o.Compared {
		changes, what = o.Changes, "this change"
	}
	counts := map[string]int{}
	for _, c := range changes {
		counts[c.Action]++
	}
	var parts []string
	for _, a := range []string{planner.ActionCreate, planner.ActionRemove, planner.ActionStop, planner.ActionReplace, planner.ActionRestart,
		planner.ActionUpdate, planner.ActionMove, planner.ActionScale, planner.ActionPort, planner.ActionUnschedulable,
		planner.ActionFailing, planner.ActionWait} {
		if counts[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[a], actionWord(a)))
		}
	}
	if o.Compared && len(o.Allocations) > 0 {
		parts = append(parts, plural(len(o.Allocations), "allocation"))
	}
	if len(parts) == 0 {
		parts = append(parts, "no changes")
	}
	out := fmt.Sprintf("%s: %s; %s", what, strings.Join(parts, ", "), plural(len(o.Warnings), "warning"))
	if n := o.troubled(); n > 0 && o.Compared {
		out += fmt.Sprintf("; %s failing or unschedulable in the cluster", plural(n, "instance"))
	}
	return out
}

// troubled counts the instances of the cluster that are failing on their
// node or cannot be placed, whatever the change under review.
func (o *planOutput) troubled() int {
	n := 0
	for _, c := range o.Pending {
		if c.Action == planner.ActionFailing || c.Action == planner.ActionUnschedulable {
			n++
		}
	}
	return n
}

func actionWord(a string) string {
	switch a {
	case planner.ActionCreate:
		return "to create"
	case planner.ActionRemove:
		return "to remove"
	case planner.ActionStop:
		return "to stop (nodes leaving)"
	case planner.ActionReplace:
		return "to replace"
	case planner.ActionRestart:
		return "to restart"
	case planner.ActionUpdate:
		return "to update in place"
	case planner.ActionMove:
		return "to move"
	case planner.ActionScale:
		return "scaled"
	case planner.ActionPort:
		return "port changed"
	case planner.ActionUnschedulable:
		return "unschedulable"
	case planner.ActionFailing:
		return "failing"
	default:
		return "held back by the rollout"
	}
}

func changeDetail(c planner.Change) string {
	var parts []string
	if c.From != "" {
		parts = append(parts, "from "+c.From)
	}
	switch {
	case len(c.Details) > 0:
		parts = append(parts, strings.Join(c.Details, "; "))
	case len(c.Fields) > 0:
		parts = append(parts, strings.Join(c.Fields, ", "))
	}
	if c.Reason != "" {
		parts = append(parts, c.Reason)
	}
	return strings.Join(parts, "; ")
}

func (o *planOutput) revisions() string {
	switch {
	case o.Compared:
		return fmt.Sprintf("%s (%s) → %s (%s)", o.Base, shortSHA(o.BaseCommit), cmp.Or(o.Head, "working tree"), cmp.Or(shortSHA(o.HeadCommit), "uncommitted"))
	case o.Head != "":
		return fmt.Sprintf("%s (%s)", o.Head, shortSHA(o.HeadCommit))
	default:
		return "working tree"
	}
}

func shortSHA(s string) string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

func (o *planOutput) reportLine() string {
	alive := 0
	for _, n := range o.Nodes {
		if n.Alive {
			alive++
		}
	}
	if o.AssumedAlive {
		return fmt.Sprintf("NO REPORTS: planned as if all %d nodes were alive with their declared capacity", len(o.Nodes))
	}
	return fmt.Sprintf("%s read, %d of %d nodes alive", plural(o.Reports, "report"), alive, len(o.Nodes))
}

func (o *planOutput) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "keel plan: %s\n", o.summary())
	fmt.Fprintf(&b, "revision: %s\n", o.revisions())
	if len(o.Errors) > 0 {
		b.WriteString("\nErrors:\n")
		for _, d := range o.Errors {
			fmt.Fprintf(&b, "  %s\n", d.Text)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "plan: %s\nreports: %s\n", o.PlanID, o.reportLine())
	changeTable := func(title string, cs []planner.Change) {
		fmt.Fprintf(&b, "\n%s:\n", title)
		if len(cs) == 0 {
			b.WriteString("  (none)\n")
			return
		}
		for _, c := range cs {
			b.WriteString(strings.TrimRight(fmt.Sprintf("  %-14s %-24s %-10s %s", c.Action, c.Instance, c.Node, changeDetail(c)), " ") + "\n")
		}
	}
	if o.Compared {
		changeTable("This change", o.Changes)
		if len(o.Allocations) > 0 {
			b.WriteString("\nAllocations:\n")
			for _, a := range o.Allocations {
				fmt.Fprintf(&b, "  %-7s %-6s %-24s %s\n", a.Action, a.Kind, a.Name, allocDetail(a))
			}
		}
	}
	changeTable("Pending in the cluster", o.Pending)
	if len(o.Warnings) > 0 {
		b.WriteString("\nWarnings:\n")
		for _, w := range o.Warnings {
			fmt.Fprintf(&b, "  %s\n", w.Message)
		}
	}
	b.WriteString("\nNodes:\n")
	for _, n := range o.Nodes {
		fmt.Fprintf(&b, "  %s  %s  %s  %s, committed %s\n", n.Name, nodeState(n), n.PodCIDR, plural(n.Instances, "instance"), capacityText(n))
		for _, p := range o.Placements {
			if p.Node == n.Name {
				fmt.Fprintf(&b, "    %-24s %-15s %s%s\n", p.Instance, p.Address, p.Reason, outdatedNote(p))
			}
		}
	}
	if len(o.Unschedulable) > 0 {
		b.WriteString("\nUnschedulable:\n")
		for _, u := range o.Unschedulable {
			fmt.Fprintf(&b, "  %-24s %s\n", u.Instance, u.Reason)
		}
	}
	b.WriteString("\nServices:\n")
	for _, s := range o.Services {
		fmt.Fprintf(&b, "  %-16s %s:%d  %s\n", s.Name, s.VIP, s.Port, endpointList(s.Endpoints))
		if s.Rollout != nil {
			fmt.Fprintf(&b, "  %-16s rollout: %s\n", "", rolloutText(s.Rollout))
		}
	}
	if len(o.Ingresses) > 0 {
		b.WriteString("\nIngresses:\n")
		for _, in := range o.Ingresses {
			fmt.Fprintf(&b, "  %-16s %s%s -> %s  served by %s (%s)\n", in.Name, in.Host, in.Path, in.Service, cmp.Or(in.Owner, "nobody"), in.Reason)
		}
	}
	return b.String()
}

func capacityText(n planNode) string {
	s := fmt.Sprintf("%s CPU, %s memory", n.Committed.CPU, n.Committed.Memory)
	if n.Capacity == nil {
		return s + " (capacity unknown)"
	}
	return fmt.Sprintf("%s of %s CPU, %s", s, n.Capacity.CPU, n.Capacity.Memory)
}

func nodeState(n planNode) string {
	s := "dead"
	if n.Alive {
		s = "alive"
	}
	if !n.Schedulable {
		s += ", drained"
	}
	if n.Refused {
		s += ", refused this commit"
	}
	if n.LimitsOff {
		s += ", cannot enforce resource limits (racct off)"
	}
	return s
}

func outdatedNote(p planPlacement) string {
	if p.Outdated == "" {
		return ""
	}
	if p.Released {
		return fmt.Sprintf(" (%s released)", p.Outdated)
	}
	return fmt.Sprintf(" (%s waiting)", p.Outdated)
}

// rolloutText sums up where a Service's rollout stands.
func rolloutText(r *planner.Rollout) string {
	s := fmt.Sprintf("%d of %d replicas updated, %d available (at least %d)", r.Updated, r.Replicas, r.Available, r.MinAvailable)
	if r.Surge > 0 {
		s += fmt.Sprintf(", %d surge", r.Surge)
	}
	switch {
	case r.Paused:
		s += "; PAUSED: " + strings.Join(r.Failed, ", ") + " not ready within the progressDeadline (fix the spec, or git revert)"
	case len(r.Failed) > 0:
		s += "; " + strings.Join(r.Failed, ", ") + " not ready within the progressDeadline (failureAction continue)"
	}
	return s
}

func endpointList(eps []string) string {
	if len(eps) == 0 {
		return "no endpoints running"
	}
	return strings.Join(eps, ", ")
}

func allocDetail(a planner.Allocation) string {
	switch a.Action {
	case "added":
		return a.To
	case "removed":
		return a.From
	default:
		return a.From + " → " + a.To
	}
}

// markdown renders the plan as a pull-request comment: the summary first,
// errors prominent, details in collapsible sections.
func (o *planOutput) markdown() string {
	var b strings.Builder
	// ✅ only when nothing in the cluster is failing: a clean change to
	// a cluster whose work is failing or unschedulable still gets ⚠️.
	icon := "✅"
	switch {
	case len(o.Errors) > 0:
		icon = "❌"
	case len(o.Warnings) > 0 || o.troubled() > 0:
		icon = "⚠️"
	}
	fmt.Fprintf(&b, "### %s keel plan: %s\n\n", icon, o.summary())
	fmt.Fprintf(&b, "<sub>%s", escapeMD(o.revisions()))
	if len(o.Errors) == 0 {
		fmt.Fprintf(&b, " · plan `%s` · %s", shortSHA(o.PlanID), escapeMD(o.reportLine()))
	}
	b.WriteString("</sub>\n\n")
	if len(o.Errors) > 0 {
		b.WriteString("> [!CAUTION]\n> **The specs are invalid; nothing can be planned.** Fix these errors:\n\n```\n")
		for _, d := range o.Errors {
			b.WriteString(d.Text + "\n")
		}
		b.WriteString("```\n")
		return b.String()
	}
	if o.AssumedAlive {
		b.WriteString("> [!WARNING]\n> **No node has reported yet**: this plan assumes every node of the inventory is alive with its declared capacity.\n\n")
	}
	changeTable := func(title string, cs []planner.Change) {
		fmt.Fprintf(&b, "#### %s\n\n", title)
		if len(cs) == 0 {
			b.WriteString("No changes.\n\n")
			return
		}
		b.WriteString("| action | instance | node | details |\n|---|---|---|---|\n")
		for _, c := range cs {
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", c.Action, c.Instance, escapeMD(c.Node), escapeMD(changeDetail(c)))
		}
		b.WriteString("\n")
	}
	if o.Compared {
		changeTable("This change", o.Changes)
		if len(o.Allocations) > 0 {
			b.WriteString("#### Allocations\n\n| | kind | name | value |\n|---|---|---|---|\n")
			for _, a := range o.Allocations {
				fmt.Fprintf(&b, "| %s | %s | `%s` | %s |\n", a.Action, a.Kind, a.Name, escapeMD(allocDetail(a)))
			}
			b.WriteString("\n")
		}
	}
	changeTable("Pending in the cluster", o.Pending)
	if len(o.Warnings) > 0 {
		b.WriteString("#### Warnings\n\n")
		for _, w := range o.Warnings {
			fmt.Fprintf(&b, "- %s\n", escapeMD(w.Message))
		}
		b.WriteString("\n")
	}
	b.WriteString("#### Nodes\n\n")
	for _, n := range o.Nodes {
		fmt.Fprintf(&b, "<details><summary><b>%s</b>: %s · %s · %s</summary>\n\n", n.Name, nodeState(n), n.PodCIDR, plural(n.Instances, "instance"))
		fmt.Fprintf(&b, "Committed %s.\n\n", escapeMD(capacityText(n)))
		rows := slices.DeleteFunc(slices.Clone(o.Placements), func(p planPlacement) bool { return p.Node != n.Name })
		if len(rows) > 0 {
			b.WriteString("| instance | address | reason |\n|---|---|---|\n")
			for _, p := range rows {
				fmt.Fprintf(&b, "| `%s` | %s | %s%s |\n", p.Instance, p.Address, p.Reason, outdatedNote(p))
			}
			b.WriteString("\n")
		}
		b.WriteString("</details>\n")
	}
	b.WriteString("\n")
	if len(o.Unschedulable) > 0 {
		b.WriteString("#### Unschedulable\n\n")
		for _, u := range o.Unschedulable {
			fmt.Fprintf(&b, "- `%s`: %s\n", u.Instance, escapeMD(u.Reason))
		}
		b.WriteString("\n")
	}
	b.WriteString("<details><summary>Services and ingresses</summary>\n\n| service | VIP | endpoints |\n|---|---|---|\n")
	for _, s := range o.Services {
		eps := endpointList(s.Endpoints)
		if s.Rollout != nil {
			eps += "; rollout: " + escapeMD(rolloutText(s.Rollout))
		}
		fmt.Fprintf(&b, "| `%s` | %s:%d | %s |\n", s.Name, s.VIP, s.Port, eps)
	}
	if len(o.Ingresses) > 0 {
		b.WriteString("\n| ingress | route | served by |\n|---|---|---|\n")
		for _, in := range o.Ingresses {
			fmt.Fprintf(&b, "| `%s` | %s%s → %s | %s |\n", in.Name, in.Host, in.Path, in.Service, escapeMD(cmp.Or(in.Owner, "nobody")))
		}
	}
	b.WriteString("\n</details>\n")
	return b.String()
}

var mdEscaper = strings.NewReplacer("|", "\\|", "<", "&lt;", ">", "&gt;", "*", "\\*", "_", "\\_", "`", "\\`")

func escapeMD(s string) string { return mdEscaper.Replace(s) }
