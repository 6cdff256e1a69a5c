package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/sync"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// repo makes a bare repository with a one-node cluster running two jails,
// and returns it with a work tree to push from.
func repo(t *testing.T) (bare, work string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	work, bare = t.TempDir(), filepath.Join(t.TempDir(), "c.git")
	files := map[string]string{
		"cluster.yaml":  "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n",
		"nodes/n1.yaml": "apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1, capacity: {cpu: \"8\", memory: 8G}}\n",
		"apps/a.yaml":   "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: base/x, command: [/bin/a]}\n---\napiVersion: keel/v1\nkind: Jail\nmetadata: {name: b}\nspec: {image: base/x, command: [/bin/b], volumes: [{name: b-data, mountPath: /d}]}\n",
	}
	for name, content := range files {
		p := filepath.Join(work, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, work, "init", "-q", "-b", "main")
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", "init")
	git(t, work, "init", "-q", "--bare", "-b", "main", bare)
	git(t, work, "push", "-q", bare, "main")
	return bare, work
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAgentAppliesRefusesAndExposesMetrics(t *testing.T) {
	bare, work := repo(t)
	reg := prometheus.NewRegistry()
	drv := fake.New()
	a, err := agent.New(agent.Options{
		Node: "n1", StateDir: t.TempDir(), Remote: sync.Remote{URL: bare, Branch: "main"}, Driver: drv,
		Version: "0.1.0", Registry: reg, Poll: 100 * time.Millisecond, Reconcile: 100 * time.Millisecond, DisableWatch: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	first := git(t, work, "rev-parse", "HEAD")

	waitFor(t, "two instances running", func() bool { return len(drv.Instances()) == 2 })
	waitFor(t, "readiness", func() bool {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", path, err, resp)
		}
		resp.Body.Close()
	}
	waitFor(t, "metrics of the applied commit", func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP keel_commit_info The spec commit applied (value 1).
# TYPE keel_commit_info gauge
keel_commit_info{commit="`+first+`"} 1
# HELP keel_instances Instances this node holds, by state.
# TYPE keel_instances gauge
keel_instances{state="crashloop"} 0
keel_instances{state="failed"} 0
keel_instances{state="running"} 2
keel_instances{state="starting"} 0
keel_instances{state="stopped"} 0
# HELP keel_nodes_alive Nodes alive in this node's plan.
# TYPE keel_nodes_alive gauge
keel_nodes_alive 1
`), "keel_commit_info", "keel_instances", "keel_nodes_alive") == nil
	})
	if n, err := testutil.GatherAndCount(reg, "keel_plan_info", "keel_instance_info", "keel_sync_duration_seconds", "keel_reconcile_duration_seconds"); err != nil || n < 5 {
		t.Errorf("gathered %d series: %v", n, err)
	}
	// The report was published on the node's ref.
	waitFor(t, "the report ref", func() bool {
		out, err := exec.Command("git", "-C", bare, "show", "refs/keel/reports/n1:report.yaml").Output()
		return err == nil && strings.Contains(string(out), "name: b")
	})

	// An invalid commit is refused; the node stays on the first one.
	os.WriteFile(filepath.Join(work, "apps/a.yaml"), []byte("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {imgae: base/x}\n"), 0o644)
	git(t, work, "commit", "-q", "-am", "typo")
	git(t, work, "push", "-q", bare, "main")
	bad := git(t, work, "rev-parse", "HEAD")
	waitFor(t, "the refusal metric", func() bool {
		n, _ := testutil.GatherAndCount(reg, "keel_commit_refused_info")
		return n == 1
	})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP keel_commit_info The spec commit applied (value 1).
# TYPE keel_commit_info gauge
keel_commit_info{commit="`+first+`"} 1
`), "keel_commit_info"); err != nil {
		t.Errorf("applied commit changed after a refusal: %v", err)
	}
	var last string
	defer func() { t.Log(last) }()
	waitFor(t, "the refusal in the published report", func() bool {
		out, err := exec.Command("git", "-C", bare, "show", "refs/keel/reports/n1:report.yaml").Output()
		last = string(out)
		return err == nil && strings.Contains(string(out), bad) && strings.Contains(string(out), "imgae")
	})
	if len(drv.Instances()) != 2 {
		t.Errorf("instances after a refused commit: %v", drv.Instances())
	}
}
