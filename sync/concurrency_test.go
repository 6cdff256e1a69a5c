package sync_test

import (
	"context"
	"fmt"
	"path/filepath"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// TestFiftyNodesAtGitDefaults: 50 simulated nodes, each with its own
// publishing mirror and fetching mirror, publish their reports and fetch
// everything at once, for a few rounds, over smart HTTP from git
// http-backend at git's default settings (no uploadpack.allow*SHA1InWant).
// A report force-pushed between another node's advertisement and its
// wants made that fetch fail with "not our ref" (97 % of fetches at 50
// nodes, issue 12): no fetch and no publication may fail.
func TestFiftyNodesAtGitDefaults(t *testing.T) {
	const nodes, rounds = 50, 3
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bare, _ := server(t)
	srv := serveGit(t, bare)
	prefix := render.DefaultReportRefPrefix
	type node struct {
		name       string
		pub, fetch *sync.Mirror
	}
	all := make([]node, nodes)
	for i := range all {
		n := node{name: fmt.Sprintf("n%02d", i)}
		var err error
		dir := t.TempDir()
		if n.pub, err = sync.OpenMirror(ctx, filepath.Join(dir, "publisher"), sync.Remote{URL: srv.URL}, prefix); err != nil {
			t.Fatal(err)
		}
		if n.fetch, err = sync.OpenMirror(ctx, filepath.Join(dir, "repo"), sync.Remote{URL: srv.URL, Branch: "main"}, prefix); err != nil {
			t.Fatal(err)
		}
		all[i] = n
	}
	base := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	var mu gosync.Mutex
	var failed []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, fmt.Sprintf(format, args...))
	}
	for round := range rounds {
		var wg gosync.WaitGroup
		for _, n := range all {
			wg.Go(func() {
				when := base.Add(time.Duration(round) * 10 * time.Second)
				r := report.Report{Node: n.name, Time: when, AgentVersion: "test"}
				if _, err := n.pub.Publish(ctx, n.name, r.Marshal(), when); err != nil {
					fail("round %d: %s publish: %v", round, n.name, err)
				}
				refs, err := n.fetch.Fetch(ctx)
				if err != nil {
					fail("round %d: %s fetch: %v", round, n.name, err)
					return
				}
				if _, ok := refs.Reports[n.name]; !ok {
					fail("round %d: %s does not see its own report", round, n.name)
				}
			})
		}
		wg.Wait()
	}
	t.Logf("%d advertisements, %d upload-pack requests for %d fetches", srv.adverts.Load(), srv.packs.Load(), nodes*rounds)
	if len(failed) > 0 {
		t.Fatalf("%d of %d fetches and publications failed, first: %s", len(failed), 2*nodes*rounds, failed[0])
	}
	// Every node converges on every report.
	for _, n := range all[:3] {
		refs, err := n.fetch.Fetch(ctx)
		if err != nil || len(refs.Reports) != nodes {
			t.Errorf("%s at the end: %d reports, %v", n.name, len(refs.Reports), err)
		}
	}
}
