package render_test

import (
	"testing"

	"github.com/keel-dev/keel/internal/deptest"
)

// TestRenderIsPure checks that render cannot run commands, open network
// connections or reach the packages with side effects, even indirectly.
func TestRenderIsPure(t *testing.T) {
	deptest.Forbid(t, "github.com/keel-dev/keel/render",
		"os/exec", "net", "net/http",
		"github.com/keel-dev/keel/sync", "github.com/keel-dev/keel/nodeexec",
		"github.com/keel-dev/keel/providers", "github.com/keel-dev/keel/cli")
}

func TestRenderNeverReadsTheClock(t *testing.T) { deptest.NoClock(t, ".") }
