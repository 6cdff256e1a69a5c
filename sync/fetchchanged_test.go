package sync_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// gitHTTP is git http-backend serving the bare repositories of one
// directory on 127.0.0.1, at git's default settings (pushes are allowed by
// naming a REMOTE_USER, as a server that authenticated its clients does),
// counting the requests it serves.
type gitHTTP struct {
	URL string
	// adverts counts the ref advertisements of fetches (GET
	// info/refs?service=git-upload-pack); packs the fetches' POSTs to
	// git-upload-pack.
	adverts, packs atomic.Int64
}

func serveGit(t *testing.T, bare string) *gitHTTP {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Skipf("git --exec-path: %v", err)
	}
	backend := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Stderr: io.Discard, // "not our ref" and the like, which the fetches retry
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(bare), "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=keel",
			"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}}
	g := &gitHTTP{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Query().Get("service") == "git-upload-pack":
			g.adverts.Add(1)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack"):
			g.packs.Add(1)
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.URL = srv.URL + "/" + filepath.Base(bare)
	return g
}

// TestFetchChangedFetchesOnlyWhatChanged: FetchChanged lists the remote
// once and fetches only the refs that moved and are wanted; with nothing
// to fetch it sends no upload-pack request at all; a deleted ref
// disappears; a too-large object in one wanted ref does not keep the
// others out (issue 12).
func TestFetchChangedFetchesOnlyWhatChanged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bare, work := server(t)
	prefix := render.DefaultReportRefPrefix
	srv := serveGit(t, bare)
	pub, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "publisher"), sync.Remote{URL: "file://" + bare}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	publish := func(node string, seconds int) string {
		t.Helper()
		when := base.Add(time.Duration(seconds) * time.Second)
		r := report.Report{Node: node, Time: when, AgentVersion: "test"}
		h, err := pub.Publish(ctx, node, r.Marshal(), when)
		if err != nil {
			t.Fatal(err)
		}
		return h.String()
	}
	n1, n2, _ := publish("n1", 0), publish("n2", 0), publish("n3", 0)
	m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "reader"), sync.Remote{URL: srv.URL, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	wantOnly := func(nodes ...string) func(plumbing.ReferenceName, plumbing.Hash) bool {
		asked = nil
		return func(ref plumbing.ReferenceName, _ plumbing.Hash) bool {
			asked = append(asked, ref.String())
			for _, n := range nodes {
				if ref == sync.ReportRef(prefix, n) {
					return true
				}
			}
			return false
		}
	}
	fetch := func(step string, want func(plumbing.ReferenceName, plumbing.Hash) bool, packs int64) sync.Refs {
		t.Helper()
		adverts0, packs0 := srv.adverts.Load(), srv.packs.Load()
		refs, err := m.FetchChanged(ctx, want)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got := srv.packs.Load() - packs0; (packs == 0) != (got == 0) {
			t.Errorf("%s: %d upload-pack requests, want %d", step, got, packs)
		}
		if packs == 0 {
			if got := srv.adverts.Load() - adverts0; got != 1 {
				t.Errorf("%s: %d advertisements, want 1", step, got)
			}
		}
		if tip := git(t, work, "", "rev-parse", "HEAD"); refs.Tip.String() != tip {
			t.Errorf("%s: tip %s, want %s", step, refs.Tip, tip)
		}
		return refs
	}
	refs := fetch("first", nil, 1)
	if len(refs.Reports) != 3 || refs.Reports["n1"].String() != n1 {
		t.Fatalf("first fetch: reports %v", refs.Reports)
	}
	fetch("nothing changed", nil, 0)

	// n1 and n2 moved; only n1 is wanted, and only the moved refs are asked about.
	n1, _ = publish("n1", 10), publish("n2", 10)
	refs = fetch("n1 wanted", wantOnly("n1"), 1)
	if refs.Reports["n1"].String() != n1 || refs.Reports["n2"].String() != n2 {
		t.Errorf("reports %v: want n1 at %.12s and n2 kept at %.12s", refs.Reports, n1, n2)
	}
	slices.Sort(asked)
	if want := []string{prefix + "n1", prefix + "n2"}; !slices.Equal(asked, want) {
		t.Errorf("want asked about %v, want only the moved %v", asked, want)
	}
	fetch("n2 not wanted again", wantOnly(), 0)

	// A deleted ref disappears without a fetch.
	git(t, bare, "", "update-ref", "-d", prefix+"n3")
	refs = fetch("n3 deleted", wantOnly(), 0)
	if _, ok := refs.Reports["n3"]; ok || len(refs.Reports) != 2 {
		t.Errorf("after n3's ref was deleted: reports %v", refs.Reports)
	}

	// n2 holds an object past MaxObjectSize; n1 moved too: n1 arrives, n2 is left out.
	tree := git(t, bare, "100644 blob "+hashObject(t, bare, sync.MaxObjectSize+1)+"\treport.yaml\n", "mktree")
	git(t, bare, "", "update-ref", prefix+"n2", git(t, bare, "", "commit-tree", tree, "-m", "bomb"))
	n1 = publish("n1", 20)
	refs = fetch("n2 too large", nil, 1)
	if refs.Reports["n1"].String() != n1 {
		t.Errorf("n1 %s, want %.12s fetched around n2", refs.Reports["n1"], n1)
	}
	if _, ok := refs.Reports["n2"]; ok || len(refs.Skipped) != 1 || !strings.Contains(refs.Skipped[0], prefix+"n2") {
		t.Errorf("reports %v skipped %q: want n2 left out and said so", refs.Reports, refs.Skipped)
	}
	// Still too large: not asked for again; fixed: fetched.
	fetch("n2 still too large", nil, 0)
	n2 = publish("n2", 30)
	refs = fetch("n2 fixed", nil, 1)
	if refs.Reports["n2"].String() != n2 || len(refs.Skipped) != 0 {
		t.Errorf("after n2's fix: reports %v skipped %q", refs.Reports, refs.Skipped)
	}
	// The branch moves whatever want says.
	git(t, work, "", "commit", "-q", "--allow-empty", "-m", "c2")
	git(t, work, "", "push", "-q", "server", "main")
	fetch("branch moved", wantOnly(), 1)
}
