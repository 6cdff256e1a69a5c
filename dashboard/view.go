package dashboard

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
)

// funcs are the templates' helpers. Each returns plain strings: the
// templates escape everything, and none of them returns template.HTML.
var funcs = template.FuncMap{
	"short":      short,
	"age":        age,
	"cpu":        func(n status.Node) string { return usage(cpuOf(&n.Committed), n.Capacity, cpuOf) },
	"memory":     func(n status.Node) string { return usage(memoryOf(&n.Committed), n.Capacity, memoryOf) },
	"nodeClass":  nodeClass,
	"stateClass": stateClass,
	"join":       strings.Join,
	"plural":     plural,
	"sub":        func(a, b int) int { return a - b },
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

// age writes a number of seconds (nil: unknown) the way keel status does.
func age(seconds *int64) string {
	if seconds == nil {
		return "never"
	}
	return status.Age(*seconds)
}

// cpuOf and memoryOf write quantities as the specs do: 500m, 2G.
func cpuOf(r *status.Resources) string    { return render.CPU(r.CPUMillicores).String() }
func memoryOf(r *status.Resources) string { return render.Bytes(r.MemoryBytes).String() }

// usage writes "committed / capacity", with ∞ for a node without limits.
func usage(committed string, capacity *status.Resources, of func(*status.Resources) string) string {
	if capacity == nil {
		return committed + " / ∞"
	}
	return committed + " / " + of(capacity)
}

// nodeClass is the CSS class of a node's state: one of a fixed set, so
// that nothing from a report reaches a class attribute.
func nodeClass(state string) string {
	switch state {
	case status.NodeAlive:
		return "good"
	case status.NodeSettling, status.NodeLeaving:
		return "warn"
	default:
		return "bad"
	}
}

// stateClass is the CSS class of an instance's state.
func stateClass(state report.State) string {
	switch state {
	case report.StateRunning:
		return "good"
	case report.StateStarting, report.StateStopped, "":
		return "warn"
	default:
		return "bad"
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
