//go:build linux

package e2e

import (
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestHTTPBackend runs the cluster with its repository served over HTTP by
// git's own git http-backend on 127.0.0.1: the agents clone, fetch and
// publish their reports over the smart HTTP protocol, and a push deploys.
func TestHTTPBackend(t *testing.T) {
	t.Parallel()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	dir := t.TempDir()
	var requests, pushes atomic.Int64
	h := gitHTTPBackend(t, dir)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if strings.Contains(r.URL.RawQuery, "git-receive-pack") || strings.HasSuffix(r.URL.Path, "git-receive-pack") {
			pushes.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	c := newCluster(t, 3*time.Minute, localcluster.Options{
		Dir:     dir,
		RepoURL: srv.URL + "/cluster.git",
		Files: map[string]string{
			"apps/web.yaml": webService(3, "base/demo", "hello"),
		},
	})
	c.converge("first commit over HTTP")
	c.commit("scale web", map[string]string{"apps/web.yaml": webService(4, "base/demo", "hello")})
	c.converge("a push, fetched over HTTP")
	pub := c.mustPublished()
	if len(pub) != len(c.Nodes) {
		t.Fatalf("reports published over HTTP: %d of %d nodes", len(pub), len(c.Nodes))
	}
	if requests.Load() == 0 || pushes.Load() == 0 {
		t.Fatalf("the HTTP server saw %d requests, %d of them pushes", requests.Load(), pushes.Load())
	}
}

// gitHTTPBackend is git's own git http-backend serving the repositories of
// dir (anonymous pushes allowed, for the reports: a real server would
// authenticate each node). It skips the test when git has no exec path.
func gitHTTPBackend(t *testing.T, dir string) *cgi.Handler {
	t.Helper()
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Skipf("git --exec-path: %v", err)
	}
	return &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"),
		Dir:  dir,
		Env: []string{
			"GIT_PROJECT_ROOT=" + dir, "GIT_HTTP_EXPORT_ALL=1",
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.receivepack", "GIT_CONFIG_VALUE_0=true",
		},
	}
}
