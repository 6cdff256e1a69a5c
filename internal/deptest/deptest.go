// Package deptest checks the dependency direction of Keel's packages: pure
// packages (render, planner) must not reach the OS, the network or the
// packages that do. It is used from tests only.
package deptest

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Forbid fails t if pkg imports, directly or through any dependency, one of
// the forbidden import paths.
func Forbid(t *testing.T, pkg string, forbidden ...string) {
	t.Helper()
	out := goList(t, "-deps", "-test=false", pkg)
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

// goList runs go list with args and returns its output. In .ci/run, amid
// the other packages' tests, go list has twice exited 1 at once with
// nothing on stderr, and then succeeded when run again: it is tried three
// times, and a failure says all it wrote.
func goList(t *testing.T, args ...string) []byte {
	t.Helper()
	var err error
	for range 3 {
		var out []byte
		if out, err = exec.Command("go", append([]string{"list"}, args...)...).Output(); err == nil {
			return out
		}
		t.Logf("go list %s: %v (stdout %q)%s", strings.Join(args, " "), err, out, stderrOf(err))
		time.Sleep(time.Second)
	}
	t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	return nil
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
	out := goList(t, "-f", `{{join .Imports "\n"}}`, pkg)
	return strings.Fields(string(out))
}
