//go:build linux

package e2e

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestSlowFetchKeepsNodeAlive: a node whose fetches are slow (a large
// commit takes tens of seconds to fetch) keeps publishing its report, so
// its peers never take its work over: every instance keeps running once,
// where it ran. The repository is served over HTTP by git http-backend;
// n2 reaches it under /slow/, where every fetch (upload-pack) is held for
// longer than the liveness TTL, while pushes (receive-pack) go through.
func TestSlowFetchKeepsNodeAlive(t *testing.T) {
	t.Parallel()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	dir := t.TempDir()
	h := gitHTTPBackend(t, dir)
	delay := 3 * ttl // each of n2's fetches takes this long
	var slow atomic.Bool
	var held atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/slow"); ok {
			r.URL.Path = rest
			if slow.Load() && r.Method == http.MethodPost && strings.HasSuffix(rest, "/git-upload-pack") {
				held.Add(1)
				select {
				case <-time.After(delay): // what a large fetch costs
				case <-r.Context().Done():
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { slow.Store(false) })

	c := newCluster(t, 4*time.Minute, localcluster.Options{
		Dir:      dir,
		RepoURL:  srv.URL + "/cluster.git",
		NodeArgs: map[string][]string{"n2": {"--repo", srv.URL + "/slow/cluster.git"}},
		Files: map[string]string{
			"apps/web.yaml": webService(6, "base/demo", "hello"),
		},
	})
	c.converge("first commit")
	c.waitAllAlive()
	m := c.model()
	c.waitFor("each instance runs once", func() (bool, string) {
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			if ps := procs[inst.Name]; len(ps) != 1 {
				return false, fmt.Sprintf("%s runs as %v", inst.Name, ps)
			}
		}
		return true, ""
	})
	before := c.checkOneEach(m)
	onN2 := 0
	for _, p := range before {
		if p.Node == "n2" {
			onN2++
		}
	}
	if onN2 == 0 {
		t.Fatalf("n2 runs no replica: %v", before)
	}

	slow.Store(true)
	start := time.Now()
	// Two and a half slow fetches of n2: with report pushes queued behind
	// them, n2 would look dead for most of each.
	for time.Since(start) < delay*5/2 {
		now := c.checkOneEach(m)
		if t.Failed() {
			t.FailNow()
		}
		if !maps.Equal(now, before) {
			t.Fatalf("%s after n2's fetches turned slow, instances moved: %v, then %v", time.Since(start).Round(time.Second), before, now)
		}
		for _, n := range []string{"n1", "n3"} {
			if alive, err := c.metric(n, "keel_nodes_alive"); err == nil && alive != 3 {
				t.Fatalf("%s after n2's fetches turned slow, %s sees %v nodes alive", time.Since(start).Round(time.Second), n, alive)
			}
		}
		time.Sleep(200 * time.Millisecond) // a sampling period
	}
	if n := held.Load(); n < 2 {
		t.Fatalf("only %d of n2's fetches were slowed: the test did not test", n)
	}
	t.Logf("%d fetches of n2 held %s each; nothing moved", held.Load(), delay)
	slow.Store(false)
}
