package sync_test

import (
	"context"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// TestFetchRetriesNotOurRef: over smart HTTP, a fetch advertises the refs
// in one request and asks for objects in the next; a report ref
// force-updated in between is "not our ref" to a git server at its
// defaults, which refuses the whole fetch. The fetch is tried again with
// a fresh advertisement and gets the new report.
func TestFetchRetriesNotOurRef(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Skipf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	bare, _ := server(t)
	prefix := render.DefaultReportRefPrefix
	publish := func(when time.Time) {
		t.Helper()
		m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "publisher"), sync.Remote{URL: "file://" + bare}, prefix)
		if err != nil {
			t.Fatal(err)
		}
		r := report.Report{Node: "n1", Time: when, AgentVersion: "test"}
		if _, err := m.Publish(ctx, "n1", r.Marshal(), when); err != nil {
			t.Fatal(err)
		}
	}
	publish(time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC))
	cgiHandler := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(bare), "GIT_HTTP_EXPORT_ALL=1",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}}
	var once gosync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
			// Between the advertisement and the wants: n1 publishes again.
			once.Do(func() { publish(time.Date(2026, 11, 29, 14, 0, 10, 0, time.UTC)) })
		}
		cgiHandler.ServeHTTP(w, r)
	}))
	defer srv.Close()

	m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "reader"), sync.Remote{URL: srv.URL + "/" + filepath.Base(bare), Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := m.Fetch(ctx)
	if err != nil {
		t.Fatalf("a report published between advertisement and fetch failed the fetch: %v", err)
	}
	want := git(t, bare, "", "rev-parse", prefix+"n1")
	if got := refs.Reports["n1"].String(); got != want {
		t.Fatalf("n1's report %s, want the newest %s", got, want)
	}
}
