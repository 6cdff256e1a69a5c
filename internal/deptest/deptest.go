// Package deptest checks the dependency direction of Keel's packages: pure
// packages (render, planner) must not reach the OS, the network or the
// packages that do. It is used from tests only.
package deptest

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Forbid fails t if pkg imports, directly or through any dependency, one of
// the forbidden import paths.
func Forbid(t *testing.T, pkg string, forbidden ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-test=false", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v%s", pkg, err, stderrOf(err))
	}
	deps := map[string]bool{}
	for _, d := range strings.Fields(string(out)) {
		deps[d] = true
	}
	if !deps[pkg] {
		t.Fatalf("go list -deps %s did not list the package itself", pkg)
	}
	for _, f := range forbidden {
		if deps[f] {
			t.Errorf("%s depends on %s (directly or indirectly); it must not", pkg, f)
		}
	}
}

// stderrOf is what a failed command wrote on stderr, to say why.
func stderrOf(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) && len(exit.Stderr) > 0 {
		return "\n" + string(exit.Stderr)
	}
	return ""
}

// Direct returns the packages that pkg imports directly (not its tests').
func Direct(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v%s", pkg, err, stderrOf(err))
	}
	return strings.Fields(string(out))
}
