package planner_test

import (
	"testing"

	"github.com/keel-dev/keel/internal/deptest"
)

// TestPlannerIsPure checks that the planner cannot run commands, reach the
// network or the packages with side effects, and never reads the clock.
func TestPlannerIsPure(t *testing.T) {
	deptest.Forbid(t, "github.com/keel-dev/keel/planner",
		"os/exec", "net", "net/http",
		"github.com/keel-dev/keel/sync", "github.com/keel-dev/keel/nodeexec",
		"github.com/keel-dev/keel/providers", "github.com/keel-dev/keel/cli")
	deptest.NoClock(t, ".")
}
