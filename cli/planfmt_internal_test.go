package cli

import (
	"strings"
	"testing"

	"github.com/keel-dev/keel/planner"
)

// Issue 11: ✅ only when nothing in the cluster is failing: a change that
// alters nothing, reviewed while an instance crash-loops on its node, is
// marked ⚠️ with the count.
func TestPlanMarkdownFailingWork(t *testing.T) {
	clean := &planOutput{Compared: true}
	if h := strings.SplitN(clean.markdown(), "\n", 2)[0]; !strings.HasPrefix(h, "### ✅") {
		t.Fatalf("a clean cluster: %q", h)
	}
	failing := &planOutput{Compared: true, Pending: []planner.Change{{Instance: "web-1", Action: planner.ActionFailing, Node: "n2", Reason: "crash loop"}}}
	h := strings.SplitN(failing.markdown(), "\n", 2)[0]
	if !strings.HasPrefix(h, "### ⚠️") || !strings.Contains(h, "1 instance failing or unschedulable in the cluster") {
		t.Fatalf("a crash-looping instance: %q", h)
	}
}
