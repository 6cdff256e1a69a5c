//go:build linux

package e2e

import (
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestWatch: with polling slowed to once in 10 minutes, the file watch on
// the local repository alone carries both new commits and the other
// nodes' reports, which a rolling restart across nodes needs at every
// step: polled, one would take 10 minutes or more; watched, seconds
// (tens of them on a busy machine: the bound is far from both).
func TestWatch(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3*time.Minute, localcluster.Options{Poll: 10 * time.Minute, Files: map[string]string{
		"jails/anchor.yaml": jail("anchor", "n1", 9900, false),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	c.commit("web", map[string]string{"apps/web.yaml": webService(3, "base/demo", "hello")})
	c.converge("web")
	for _, greeting := range []string{"hi", "hey"} {
		start := time.Now()
		c.commit("greet with "+greeting, map[string]string{"apps/web.yaml": webService(3, "base/demo", greeting)})
		c.converge("rolling restart")
		if took := time.Since(start); took > 2*time.Minute {
			t.Errorf("a rolling restart took %s: were the report refs watched?", took)
		}
	}
	c.checkAnswers("web", 3, "hey")
}
