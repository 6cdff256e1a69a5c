//go:build unix

package agent_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/providers/forge"
	"github.com/keel-dev/keel/providers/forge/forgetest"
	"github.com/keel-dev/keel/sync"
)

const forgeToken = "ghp_forgeTestToken0123456789"

// gates holds the starts of the instances it names until opened.
type gates struct {
	mu gosync.Mutex
	ch map[string]chan struct{}
}

func newGates(names ...string) *gates {
	g := &gates{ch: map[string]chan struct{}{}}
	for _, n := range names {
		g.ch[n] = make(chan struct{})
	}
	return g
}

func (g *gates) hook(ctx context.Context, op fake.Op, name string) error {
	if op != fake.OpStart {
		return nil
	}
	g.mu.Lock()
	ch := g.ch[name]
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gates) open(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch := g.ch[name]; ch != nil {
		close(ch)
		delete(g.ch, name)
	}
}

func (g *gates) close(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ch[name] = make(chan struct{})
}

// forgeAgent runs an agent of node n1 on the fake driver whose statuses go
// to srv (success once every instance ran for settle, 300 ms when not
// given); it is stopped when the test ends.
func forgeAgent(t *testing.T, bare string, drv *fake.Driver, srv *forgetest.Server, token string, logs *syncBuffer, settle ...time.Duration) *prometheus.Registry {
	t.Helper()
	c, err := forge.New(forge.Config{Kind: forge.GitHub, URL: srv.URL, Repo: "acme/cluster", Token: token,
		RetryMin: 10 * time.Millisecond, RetryFor: time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a, err := agent.New(agent.Options{
		Node: "n1", StateDir: t.TempDir(), Remote: sync.Remote{URL: bare, Branch: "main"}, Driver: drv,
		Version: "0.1.0", Registry: reg, Poll: 100 * time.Millisecond, Reconcile: 100 * time.Millisecond, DisableWatch: true,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Forge: &agent.ForgeOptions{Poster: c, TargetURL: "https://dash.example.com/", RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
			Settle: append(settle, 300*time.Millisecond)[0]},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return reg
}

// passes counts the agent's reconcile passes.
func passes(reg *prometheus.Registry) uint64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "keel_reconcile_duration_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func pushFile(t *testing.T, work, bare, name, content, msg string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", msg)
	git(t, work, "push", "-q", bare, "main")
	return git(t, work, "rev-parse", "HEAD")
}

// Issue 11, deploy status on the forge: the agent posts pending on the
// commit it applied while its instances start, success once they run,
// failure with the reason on a commit it refuses, and error on a commit
// it left for a newer one before converging; each on change only, never
// once per pass.
func TestForgeStatusFollowsTheDeploy(t *testing.T) {
	bare, work := repo(t)
	first := git(t, work, "rev-parse", "HEAD")
	srv := forgetest.New(t, forgetest.GitHub, forgeToken, "acme/cluster")
	g := newGates("a")
	drv := fake.New()
	drv.SetHook(g.hook)
	var logs syncBuffer
	reg := forgeAgent(t, bare, drv, srv, forgeToken, &logs)
	latest := func(commit string) forgetest.Status {
		st, _ := srv.Latest(commit, "keel/n1")
		return st
	}

	waitFor(t, "pending on the first commit while a starts", func() bool { return latest(first).State == "pending" })
	if st := latest(first); !strings.Contains(st.Description, "a starting") || st.TargetURL != "https://dash.example.com/" {
		t.Errorf("pending status %+v", st)
	}
	g.open("a")
	waitFor(t, "success on the first commit", func() bool { return latest(first).State == "success" })
	if st := latest(first); st.Description != "2 instances run at this commit" {
		t.Errorf("success status %+v", st)
	}
	// Passes go on; nothing changes, so nothing more is posted.
	posts, p := srv.Requests(), passes(reg)
	waitFor(t, "ten more passes", func() bool { return passes(reg) >= p+10 })
	if n := srv.Requests(); n != posts {
		t.Errorf("%d posts during passes that changed nothing", n-posts)
	}
	// A crash after the deploy is the instance's health, not the deploy's:
	// the commit's status stays success.
	starts := drv.Starts("a")
	if err := drv.Crash("a", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a restarted after its crash", func() bool { return drv.Starts("a") > starts })
	p = passes(reg)
	waitFor(t, "more passes", func() bool { return passes(reg) >= p+3 })
	if n := srv.Requests(); n != posts || latest(first).State != "success" {
		t.Errorf("a crash after the deploy posted %d statuses; the forge shows %+v", n-posts, latest(first))
	}

	// A refused commit: failure with the reason, cut for the forge.
	bad := pushFile(t, work, bare, "apps/a.yaml", "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {imgae: base/x}\n", "typo")
	waitFor(t, "failure on the refused commit", func() bool { return latest(bad).State == "failure" })
	if st := latest(bad); !strings.HasPrefix(st.Description, "refused: invalid specs") || !strings.Contains(st.Description, "imgae") || len(st.Description) > 140 {
		t.Errorf("failure status %q", st.Description)
	}
	if latest(first).State != "success" {
		t.Errorf("the applied commit's status changed after a refusal: %+v", latest(first))
	}

	// A commit left for a newer one while it converged: error.
	g.close("c")
	jails := "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: base/x, command: [/bin/a]}\n---\n" +
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: b}\nspec: {image: base/x, command: [/bin/b], volumes: [{name: b-data, mountPath: /d}]}\n---\n" +
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: c}\nspec: {image: base/x, command: [/bin/c]}\n"
	third := pushFile(t, work, bare, "apps/a.yaml", jails, "add c")
	waitFor(t, "pending on the third commit", func() bool { return latest(third).State == "pending" })
	fourth := pushFile(t, work, bare, "apps/a.yaml", strings.Replace(jails, "/bin/c", "/bin/c2", 1), "change c")
	waitFor(t, "the third commit superseded", func() bool { return latest(third).State == "error" })
	if st := latest(third); !strings.Contains(st.Description, "superseded by "+fourth[:12]) {
		t.Errorf("superseded status %q", st.Description)
	}
	waitFor(t, "pending on the fourth commit", func() bool { return latest(fourth).State == "pending" })
	g.open("c")
	waitFor(t, "success on the fourth commit", func() bool { return latest(fourth).State == "success" })
	if st := latest(fourth); st.Description != "3 instances run at this commit" {
		t.Errorf("success status %+v", st)
	}

	// Each status posted once per change: no two in a row alike.
	for _, c := range []string{first, bad, third, fourth} {
		list := srv.Statuses(c)
		for i := 1; i < len(list); i++ {
			if list[i].State == list[i-1].State && list[i].Description == list[i-1].Description {
				t.Errorf("%.12s: posted twice in a row: %+v", c, list[i])
			}
		}
	}
	// The forge keeps a status before its answer reaches the agent.
	waitFor(t, "keel_forge_status_posts_total{result=ok} to count every post", func() bool {
		return int(counterValue(reg, "keel_forge_status_posts_total", map[string]string{"result": "ok"})) == srv.Requests()
	})
	if r := srv.Refused(); len(r) > 0 {
		t.Errorf("the forge refused: %v", r)
	}
	if strings.Contains(logs.String(), forgeToken) {
		t.Error("the token is in the logs")
	}
}

// A forge that hangs delays neither the reconcile passes nor the report;
// a wrong token is logged (without it) and counted, and not retried in a
// loop; 5xx answers are retried until the forge takes the status.
func TestForgeStatusFailuresStayOffTheLoop(t *testing.T) {
	t.Run("hanging forge", func(t *testing.T) {
		bare, work := repo(t)
		first := git(t, work, "rev-parse", "HEAD")
		srv := forgetest.New(t, forgetest.GitHub, forgeToken, "acme/cluster")
		release := srv.Block()
		defer release()
		drv := fake.New()
		var logs syncBuffer
		reg := forgeAgent(t, bare, drv, srv, forgeToken, &logs)
		waitFor(t, "a post under way", func() bool { return srv.Requests() > 0 })
		waitFor(t, "the report published while the forge hangs", func() bool {
			out, err := exec.Command("git", "-C", bare, "show", "refs/keel/reports/n1:report.yaml").Output()
			return err == nil && strings.Contains(string(out), "name: b") && strings.Contains(string(out), first)
		})
		p := passes(reg)
		waitFor(t, "passes while the forge hangs", func() bool { return passes(reg) >= p+5 })
		release()
		waitFor(t, "success once the forge answers", func() bool {
			st, _ := srv.Latest(first, "keel/n1")
			return st.State == "success"
		})
	})
	t.Run("wrong token", func(t *testing.T) {
		bare, work := repo(t)
		first := git(t, work, "rev-parse", "HEAD")
		srv := forgetest.New(t, forgetest.GitHub, forgeToken, "acme/cluster")
		drv := fake.New()
		var logs syncBuffer
		wrong := "ghp_wrongToken_" + forgeToken
		reg := forgeAgent(t, bare, drv, srv, wrong, &logs)
		waitFor(t, "the refusal logged and counted", func() bool {
			return strings.Contains(logs.String(), "posting the commit status on the forge failed") &&
				counterValue(reg, "keel_forge_status_posts_total", map[string]string{"result": "error"}) >= 1
		})
		waitFor(t, "instances running", func() bool { return len(drv.Instances()) == 2 })
		// Refused for good: tried again only when the status changes
		// (pending, then success: at most two), not at every pass.
		p := passes(reg)
		waitFor(t, "ten more passes", func() bool { return passes(reg) >= p+10 })
		if n := srv.Requests(); n > 2 {
			t.Errorf("%d requests with a refused token", n)
		}
		if _, ok := srv.Latest(first, "keel/n1"); ok {
			t.Error("a status was kept")
		}
		if text := logs.String(); strings.Contains(text, wrong) || !strings.Contains(text, "401") {
			t.Errorf("logs:\n%s", text)
		}
	})
	t.Run("5xx", func(t *testing.T) {
		bare, work := repo(t)
		first := git(t, work, "rev-parse", "HEAD")
		srv := forgetest.New(t, forgetest.GitHub, forgeToken, "acme/cluster")
		var fails []forgetest.Failure
		for range 30 {
			fails = append(fails, forgetest.Failure{Code: 503})
		}
		srv.FailNext(fails...)
		drv := fake.New()
		var logs syncBuffer
		forgeAgent(t, bare, drv, srv, forgeToken, &logs)
		waitFor(t, "success once the forge recovers", func() bool {
			st, _ := srv.Latest(first, "keel/n1")
			return st.State == "success"
		})
		if n := srv.Requests(); n <= 30 {
			t.Errorf("%d requests", n)
		}
	})
}

// An instance that crashes soon after each start never makes the node's
// status success: success waits for every instance to have run for the
// settle time; once it stops crashing, it comes.
func TestForgeStatusCrashLoopIsNotSuccess(t *testing.T) {
	bare, work := repo(t)
	first := git(t, work, "rev-parse", "HEAD")
	srv := forgetest.New(t, forgetest.GitHub, forgeToken, "acme/cluster")
	drv := fake.New()
	var logs syncBuffer
	reg := forgeAgent(t, bare, drv, srv, forgeToken, &logs, 2*time.Second)
	stop := make(chan struct{})
	crashed := make(chan struct{})
	go func() {
		defer close(crashed)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = drv.Crash("a", 1) // an error while a is not running
			}
		}
	}()
	waitFor(t, "a started three times", func() bool { return drv.Starts("a") >= 3 })
	p := passes(reg)
	waitFor(t, "more passes", func() bool { return passes(reg) >= p+3 })
	close(stop)
	<-crashed
	for _, st := range srv.Statuses(first) {
		if st.State != "pending" {
			t.Errorf("while a crash-looped the forge was given %+v", st)
		}
	}
	if st, ok := srv.Latest(first, "keel/n1"); !ok || !strings.Contains(st.Description, "a ") {
		t.Errorf("the pending status does not name a: %+v", st)
	}
	waitFor(t, "success once a stays up", func() bool {
		st, _ := srv.Latest(first, "keel/n1")
		return st.State == "success"
	})
}
