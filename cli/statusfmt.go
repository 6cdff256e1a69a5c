package cli

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
)

// tableOptions say how keel status draws its tables.
type tableOptions struct {
	width int  // columns; the widest column is cut to fit
	color bool // ANSI colours (on a terminal, without NO_COLOR)
}

const (
	colorRed    = "31"
	colorGreen  = "32"
	colorYellow = "33"
	colorBold   = "1"
)

func (o tableOptions) paint(s, color string) string {
	if !o.color || s == "" {
		return s
	}
	return "\x1b[" + color + "m" + s + "\x1b[0m"
}

// table is rows of cells drawn in aligned columns. A cell's colour is
// given apart so that it does not count in the width.
type table struct {
	header []string
	rows   [][]string
	colors [][]string
}

func (t *table) add(color []string, cells ...string) {
	t.rows = append(t.rows, cells)
	t.colors = append(t.colors, color)
}

// draw writes the table in at most width columns: when too wide, the
// widest column is cut (with "…") until it fits or is 12 wide.
func (t *table) draw(b *strings.Builder, o tableOptions) {
	widths := make([]int, len(t.header))
	for i, h := range t.header {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	total := func() int {
		n := 2 * (len(widths) - 1)
		for _, w := range widths {
			n += w
		}
		return n
	}
	for total() > o.width {
		widest := 0
		for i, w := range widths {
			if w > widths[widest] {
				widest = i
			}
		}
		if widths[widest] <= 12 {
			break
		}
		widths[widest] -= min(widths[widest]-12, total()-o.width)
	}
	line := func(cells, colors []string) {
		for i, c := range cells {
			c = fit(c, widths[i])
			pad := widths[i] - utf8.RuneCountInString(c)
			if i < len(colors) && colors[i] != "" {
				c = o.paint(c, colors[i])
			}
			b.WriteString(c)
			if i < len(cells)-1 {
				b.WriteString(strings.Repeat(" ", pad+2))
			}
		}
		b.WriteString("\n")
	}
	line(t.header, nil)
	for i, r := range t.rows {
		line(r, t.colors[i])
	}
}

// fit cuts s to n runes, marking the cut.
func fit(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// statusTable is keel status's table output.
func statusTable(st *status.Status, o tableOptions) string {
	var b strings.Builder
	tip := st.Tip
	fmt.Fprintf(&b, "cluster %s · branch %s · tip %s %q (%s, %s ago)\n", st.Cluster, st.Branch, tip.Short(), tip.Subject, tip.Author,
		status.Age(int64(max(0, st.Time.Sub(tip.Time).Seconds()))))
	if st.Converged {
		b.WriteString(o.paint("✔ "+st.Headline, colorGreen) + "\n")
	} else {
		b.WriteString(o.paint("✘ "+st.Headline, colorRed) + "\n")
		if len(st.Missing) > 1 {
			for _, m := range st.Missing {
				b.WriteString("  - " + fit(m, max(20, o.width-4)) + "\n")
			}
		}
	}
	c := st.Counts
	fmt.Fprintf(&b, "%d/%d nodes alive, %d at the tip · %d/%d instances running, %d unschedulable · %d/%d services ready\n",
		c.NodesAlive, c.Nodes, c.NodesAtTip, c.Running, c.Instances, c.Unschedulable, c.ServicesReady, c.Services)
	if len(st.Errors) > 0 {
		section(&b, o, "ERRORS AT THE TIP")
		for _, e := range st.Errors {
			b.WriteString(e + "\n")
		}
	}
	if len(st.Nodes) > 0 {
		section(&b, o, "NODES")
		t := &table{header: []string{"NODE", "STATE", "REPORT", "COMMIT", "PLAN", "INSTANCES", "CPU", "MEMORY", "PROBLEMS"}}
		for _, n := range st.Nodes {
			rep, commit, plan := "never", "-", "-"
			if n.ReportAge != nil {
				rep = status.Age(*n.ReportAge) + " ago"
				commit = short12(n.Commit)
				switch {
				case n.State != status.NodeAlive && n.State != status.NodeSettling:
				case n.PlanAgrees:
					plan = "agrees"
				default:
					plan = "differs"
				}
			}
			if n.Refused != nil {
				commit += " (refused " + short12(n.Refused.Commit) + ")"
			}
			cpu, mem := resources(n.Committed, n.Capacity)
			var problems []string
			for _, p := range n.Problems {
				problems = append(problems, p.Check)
			}
			if len(n.Errors) > 0 {
				problems = append(problems, plural(len(n.Errors), "error"))
			}
			t.add([]string{"", stateColor(n.State), "", atTipColor(n), ""},
				n.Name, n.State, rep, commit, plan, fmt.Sprintf("%d/%d", n.Running, n.Assigned), cpu, mem, dash(strings.Join(problems, ", ")))
		}
		t.draw(&b, o)
	}
	if len(st.Services) > 0 {
		section(&b, o, "SERVICES")
		t := &table{header: []string{"SERVICE", "VIP", "READY", "UPDATED", "ENDPOINTS"}}
		for _, s := range st.Services {
			color := colorGreen
			if s.Ready < s.Replicas {
				color = colorRed
			}
			t.add([]string{"", "", color}, s.Name, fmt.Sprintf("%s:%d", s.VIP, s.Port), fmt.Sprintf("%d/%d", s.Ready, s.Replicas),
				fmt.Sprintf("%d/%d", s.Updated, s.Replicas), dash(strings.Join(s.Endpoints, " ")))
		}
		t.draw(&b, o)
	}
	if len(st.Attention) > 0 {
		section(&b, o, "NEEDS ATTENTION")
		t := &table{header: []string{"INSTANCE", "NODE", "ACTION", "STATE", "RESTARTS", "REASON"}}
		for _, a := range st.Attention {
			reason := a.Reason
			if a.Error != "" && !strings.Contains(reason, a.Error) {
				reason += ": " + a.Error
			}
			color := colorYellow
			if a.Action == "unschedulable" || a.State == report.StateCrashLoop || a.State == report.StateFailed {
				color = colorRed
			}
			t.add([]string{"", "", color, color}, a.Name, dash(a.Node), a.Action, dash(string(a.State)), fmt.Sprint(a.Restarts), reason)
		}
		t.draw(&b, o)
	}
	if len(st.Ingresses) > 0 {
		section(&b, o, "INGRESS")
		t := &table{header: []string{"HOST", "SERVICES", "TLS", "SERVING", "EXPIRES", "ERROR"}}
		for _, in := range st.Ingresses {
			expires, color := "-", ""
			if in.Expires != nil {
				expires = "in " + status.Age(int64(max(0, in.Expires.Sub(st.Time).Seconds())))
				if in.Expiring {
					color = colorRed
				}
			}
			tls := "no"
			if in.TLS {
				tls = "yes"
			}
			t.add([]string{"", "", "", "", color}, in.Host, strings.Join(in.Services, ","), tls, dash(strings.Join(in.Serving, ",")), expires, dash(in.Error))
		}
		t.draw(&b, o)
	}
	if len(st.Volumes) > 0 {
		section(&b, o, "VOLUMES")
		t := &table{header: []string{"VOLUME", "NODE", "USER"}}
		for _, v := range st.Volumes {
			t.add(nil, v.Name, v.Node, dash(v.User))
		}
		t.draw(&b, o)
	}
	if len(st.Warnings) > 0 {
		section(&b, o, "WARNINGS")
		for _, w := range st.Warnings {
			b.WriteString(fit(w.Message, max(20, o.width)) + "\n")
		}
	}
	return b.String()
}

func section(b *strings.Builder, o tableOptions, title string) {
	b.WriteString("\n" + o.paint(title, colorBold) + "\n")
}

func stateColor(state string) string {
	switch state {
	case status.NodeAlive:
		return colorGreen
	case status.NodeSettling, status.NodeLeaving:
		return colorYellow
	}
	return colorRed
}

func atTipColor(n status.Node) string {
	if n.ReportAge == nil || n.AtTip {
		return ""
	}
	return colorYellow
}

// resources writes committed/capacity for CPU and memory.
func resources(committed status.Resources, capacity *status.Resources) (cpu, mem string) {
	cpu, mem = render.CPU(committed.CPUMillicores).String()+"/", render.Bytes(committed.MemoryBytes).String()+"/"
	if capacity == nil {
		return cpu + "-", mem + "-"
	}
	return cpu + render.CPU(capacity.CPUMillicores).String(), mem + render.Bytes(capacity.MemoryBytes).String()
}

func short12(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return dash(commit)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
