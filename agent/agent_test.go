package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	sync2 "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/report"
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
keel_instances{state="pulling"} 0
keel_instances{state="running"} 2
keel_instances{state="starting"} 0
keel_instances{state="stopped"} 0
# HELP keel_nodes_alive Nodes alive in this node's plan.
# TYPE keel_nodes_alive gauge
keel_nodes_alive 1
# HELP keel_nodes_settling Nodes alive but settling in this node's plan: they take no instance from another node yet.
# TYPE keel_nodes_settling gauge
keel_nodes_settling 1
`), "keel_commit_info", "keel_instances", "keel_nodes_alive", "keel_nodes_settling") == nil
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

// syncBuffer is a log destination safe for the agent's goroutines.
type syncBuffer struct {
	mu sync2.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Issue 9: the driver's host problems reach the node's published report
// and keel_node_problem, each logged once when it appears and once when
// it clears; a check run that fails keeps them; and with racct off no
// instance (all have limits) ever runs on the node.
func TestHostProblemsReportedAndCleared(t *testing.T) {
	bare, _ := repo(t)
	reg := prometheus.NewRegistry()
	drv := fake.New()
	racct := nodeexec.HostProblem{Check: "racct", Problem: "resource accounting is off: instances with limits are refused", Fix: "echo kern.racct.enable=1 >> /boot/loader.conf, then reboot"}
	pf := nodeexec.HostProblem{Check: "pf", Problem: "pf is not enabled", Fix: "service pf start"}
	odd := nodeexec.HostProblem{Check: "kernel", Problem: "a check the report format does not know"}
	drv.SetProblems([]nodeexec.HostProblem{pf, racct, odd})
	var logs syncBuffer
	a, err := agent.New(agent.Options{
		Node: "n1", StateDir: t.TempDir(), Remote: sync.Remote{URL: bare, Branch: "main"}, Driver: drv,
		Version: "0.1.0", Registry: reg, Poll: 100 * time.Millisecond, Reconcile: 100 * time.Millisecond, DisableWatch: true,
		CheckInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
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
	published := func() report.Report {
		out, err := exec.Command("git", "-C", bare, "show", "refs/keel/reports/n1:report.yaml").Output()
		if err != nil {
			return report.Report{}
		}
		r, err := report.Parse(out, "n1")
		if err != nil {
			t.Fatalf("the published report does not parse: %v\n%s", err, out)
		}
		return r
	}
	metrics := func(racct, pf int) string {
		return fmt.Sprintf(`
# HELP keel_node_problem Host prerequisites that do not hold on this node, by check (0: the check passes).
# TYPE keel_node_problem gauge
keel_node_problem{check="datasets"} 0
keel_node_problem{check="forwarding"} 0
keel_node_problem{check="pf"} %d
keel_node_problem{check="racct"} %d
keel_node_problem{check="vnet"} 0
`, pf, racct)
	}
	var last report.Report
	waitFor(t, "both problems in the published report, in the canonical order", func() bool {
		last = published()
		return slices.Equal(last.Problems, []report.Problem{report.Problem(racct), report.Problem(pf)})
	})
	if !last.LimitsOff() {
		t.Error("the report does not say limits are off")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metrics(1, 1)), "keel_node_problem"); err != nil {
		t.Error(err)
	}
	// A pass ran with the applied commit: the planner placed neither
	// instance on n1 (unschedulable), and had it, the driver would have
	// refused them.
	waitFor(t, "a report of a pass with the commit applied", func() bool {
		last = published()
		return last.Commit != "" && last.PlanID != ""
	})
	if n := drv.Starts("a") + drv.Starts("b"); n != 0 || len(drv.Instances()) != 0 {
		t.Errorf("with racct off, instances with limits started %d times: %v", n, drv.Instances())
	}

	// A failing run keeps what the last one found.
	boom := errors.New("sysctl: cannot run")
	drv.FailChecks(boom)
	drv.SetProblems(nil)
	n := drv.Checks()
	waitFor(t, "two more failed runs", func() bool { return drv.Checks() >= n+2 })
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metrics(1, 1)), "keel_node_problem"); err != nil {
		t.Errorf("a failed run changed the metric: %v", err)
	}

	drv.FailChecks(nil)
	waitFor(t, "the problems cleared from the published report", func() bool {
		last = published()
		return len(last.Problems) == 0 && len(last.Instances) == 2
	})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metrics(0, 0)), "keel_node_problem"); err != nil {
		t.Error(err)
	}
	waitFor(t, "both instances running once limits can be enforced", func() bool { return len(drv.Instances()) == 2 })
	n = drv.Checks()
	waitFor(t, "two more runs", func() bool { return drv.Checks() >= n+2 })

	text := logs.String()
	for _, want := range []struct {
		line  string
		count int
	}{
		{`msg="host problem" node=n1 check=racct`, 1},
		{`msg="host problem" node=n1 check=pf`, 1},
		{`msg="host problem" node=n1 check=kernel`, 1},
		{`msg="host problems left out of the report`, 1},
		{`msg="host checks failed; keeping the problems last found"`, 1},
		{`msg="host checks work again"`, 1},
		{`msg="host problem cleared" node=n1 check=racct`, 1},
		{`msg="host problem cleared" node=n1 check=pf`, 1},
	} {
		if got := strings.Count(text, want.line); got != want.count {
			t.Errorf("%q logged %d times, want %d", want.line, got, want.count)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}
