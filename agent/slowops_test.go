package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// published reads the node's published report, or returns ok false.
func published(t *testing.T, bare string) (report.Report, bool) {
	t.Helper()
	out, err := exec.Command("git", "-C", bare, "show", "refs/keel/reports/n1:report.yaml").Output()
	if err != nil {
		return report.Report{}, false
	}
	r, err := report.Parse(out, "n1")
	if err != nil {
		t.Fatalf("the published report: %v\n%s", err, out)
	}
	return r, true
}

func countStates(r report.Report) map[report.State]int {
	out := map[report.State]int{}
	for _, ri := range r.Instances {
		out[ri.State]++
	}
	return out
}

func slowJail(name string) string {
	return fmt.Sprintf("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: %s}\nspec: {image: base/x, command: [/bin/%s], resources: {cpu: 100m, memory: 64M}}\n---\n", name, name)
}

// Issue 9 (slow operations): while twenty instances are being created, each
// start stuck in the driver (a jail creation is seconds of commands), the
// node keeps its loop: it publishes its report (the instances starting),
// fetches and applies a new commit, and republishes on time; once the
// starts go through, at most four having run at once, everything runs.
func TestSlowStartsDoNotStallTheLoop(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	work, bare := t.TempDir(), filepath.Join(t.TempDir(), "c.git")
	var apps strings.Builder
	for i := range 20 {
		apps.WriteString(slowJail(fmt.Sprintf("j%02d", i)))
	}
	files := map[string]string{
		"cluster.yaml":  "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {livenessTTL: 3s, reportInterval: 1s}\n",
		"nodes/n1.yaml": "apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1, capacity: {cpu: \"8\", memory: 8G}}\n",
		"apps/a.yaml":   apps.String(),
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
	git(t, work, "commit", "-q", "-m", "twenty jails")
	git(t, work, "init", "-q", "--bare", "-b", "main", bare)
	git(t, work, "push", "-q", bare, "main")
	first := git(t, work, "rev-parse", "HEAD")

	drv := fake.New()
	open := make(chan struct{})
	drv.SetHook(func(ctx context.Context, op fake.Op, name string) error {
		if op != fake.OpStart {
			return nil
		}
		select {
		case <-open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	reg := prometheus.NewRegistry()
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
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	defer stop()

	waitFor(t, "four starts inside the driver", func() bool { now, _ := drv.Busy(); return now == 4 })
	var last report.Report
	defer func() { t.Logf("last report seen: %+v", last) }()
	waitFor(t, "a report of the four instances starting", func() bool {
		r, ok := published(t, bare)
		last = r
		return ok && r.Commit == first && countStates(r)[report.StateStarting] == 4
	})
	seen := last.Time
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP keel_instance_operations Instance operations (volumes, start, stop, destroy, limits) running, off the loop, when the last reconcile pass ended.
# TYPE keel_instance_operations gauge
keel_instance_operations 4
`), "keel_instance_operations"); err != nil {
		t.Error(err)
	}

	// A new commit is fetched and applied while the starts are stuck.
	os.WriteFile(filepath.Join(work, "apps/late.yaml"), []byte(slowJail("late")), 0o644)
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", "one more")
	git(t, work, "push", "-q", bare, "main")
	second := git(t, work, "rev-parse", "HEAD")
	waitFor(t, "the new commit in the published report", func() bool {
		r, ok := published(t, bare)
		last = r
		return ok && r.Commit == second
	})
	// And the report keeps being republished, newer than the first one
	// seen by two report intervals at least.
	waitFor(t, "a fresh report", func() bool {
		r, ok := published(t, bare)
		last = r
		return ok && r.Time.Sub(seen) >= 2*time.Second
	})
	if now, _ := drv.Busy(); now != 4 || len(drv.Instances()) != 0 {
		t.Fatalf("the starts went through before the gate opened: %d inside, %v", now, drv.Instances())
	}

	close(open)
	waitFor(t, "twenty-one instances running in the report", func() bool {
		r, ok := published(t, bare)
		last = r
		return ok && r.Commit == second && countStates(r)[report.StateRunning] == 21
	})
	if _, most := drv.Busy(); most != 4 {
		t.Errorf("at most %d operations at once, want 4", most)
	}
	if o := drv.Overlaps(); len(o) > 0 {
		t.Errorf("two operations at once on %v", o)
	}
	stop()
	if n := reconcilerGoroutines(); n != 0 {
		t.Errorf("%d reconciler goroutines after Run returned", n)
	}
}

// reconcilerGoroutines counts the goroutines running an instance operation
// of a nodeexec.Reconciler.
func reconcilerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("nodeexec.(*Reconciler).dispatch")) {
			count++
		}
	}
	return count
}
