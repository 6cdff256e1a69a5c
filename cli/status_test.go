package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// statusRepo makes a bare "server" repository holding the fixture cluster
// on main (two commits) and returns it with the tip's hash and model.
func statusRepo(t *testing.T) (server, tip string, m *render.Model) {
	t.Helper()
	src := t.TempDir()
	git(t, src, "init", "-q", "-b", "main")
	for name, f := range statustest.Specs {
		path := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, src, "add", "-A")
	git(t, src, "commit", "-q", "-m", "first cluster")
	git(t, src, "commit", "-q", "--allow-empty", "-m", "web: <b>LOG_LEVEL</b>=debug\n\nthe body is not shown")
	tip = git(t, src, "rev-parse", "HEAD")
	server = filepath.Join(t.TempDir(), "cluster.git")
	git(t, src, "clone", "-q", "--bare", src, server)
	m, err := render.Render(statustest.Specs)
	if err != nil {
		t.Fatal(err)
	}
	return server, tip, m
}

// publish puts each report on its node's report ref, as agents do.
func publish(t *testing.T, server string, reports []report.Report) {
	t.Helper()
	for _, r := range reports {
		file := filepath.Join(t.TempDir(), "report.yaml")
		if err := os.WriteFile(file, r.Marshal(), 0o644); err != nil {
			t.Fatal(err)
		}
		blob := git(t, server, "hash-object", "-w", file)
		tree := strings.TrimSpace(pipeGit(t, server, "100644 blob "+blob+"\treport.yaml\n", "mktree"))
		commit := git(t, server, "commit-tree", tree, "-m", "report of "+r.Node)
		git(t, server, "update-ref", "refs/keel/reports/"+r.Node, commit)
	}
}

// TestStatusCheck reads a real repository, locally and through a file://
// URL mirrored into a cache directory: --check exits 0 when every node
// reports the tip's plan running, 3 when a node is dead, and the JSON
// document says the same.
func TestStatusCheck(t *testing.T) {
	server, tip, m := statusRepo(t)
	code, out, errOut := keel(t, "status", "--repo", server, "--check")
	if code != cli.ExitNotConverged || !strings.Contains(out, "node n1 has never reported") {
		t.Fatalf("no reports: want exit 3 and the missing node, got %d %s %s", code, out, errOut)
	}
	reports := statustest.Converged(m, tip, time.Now())
	publish(t, server, reports)
	code, out, errOut = keel(t, "status", "--repo", server, "--check")
	if code != cli.ExitOK || strings.TrimSpace(out) != "converged at "+tip[:12] {
		t.Fatalf("converged: want exit 0, got %d %q %s", code, out, errOut)
	}
	cache := t.TempDir()
	code, out, errOut = keel(t, "status", "--repo", "file://"+server, "--cache-dir", cache, "-o", "json")
	if code != cli.ExitOK {
		t.Fatalf("file:// URL: exit %d %s", code, errOut)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if !st.Converged || st.Tip.Hash != tip || st.Tip.Subject != "web: <b>LOG_LEVEL</b>=debug" || len(st.History) != 2 || len(st.Nodes) != 3 {
		t.Fatalf("file:// URL: %+v", st)
	}

	// n3 stops reporting: dead once its report is older than the TTL.
	reports[2].Time = time.Now().Add(-time.Minute)
	reports[2].Clock = reports[2].Time
	publish(t, server, reports[2:])
	code, out, errOut = keel(t, "status", "--repo", "file://"+server, "--cache-dir", cache, "--check", "--timeout", "300ms", "--interval", "100ms")
	if code != cli.ExitNotConverged || !strings.Contains(out, "node n3 is dead") {
		t.Fatalf("dead node: want exit 3, got %d %s %s", code, out, errOut)
	}
	code, out, _ = keel(t, "status", "--repo", server, "--width", "100")
	if code != cli.ExitOK || !strings.Contains(out, "n3    dead") {
		t.Fatalf("table: exit %d\n%s", code, out)
	}
}

// TestStatusUsage: bad flags are usage errors, not a status.
func TestStatusUsage(t *testing.T) {
	server, _, _ := statusRepo(t)
	for _, args := range [][]string{
		{"status", "--repo", server, "-o", "xml"},
		{"status", "--repo", server, "--check", "--watch"},
		{"status", "--repo", server, "--branch", "nope"},
		{"status", "--repo", "https://user:secret@example.test/x.git"},
	} {
		code, _, errOut := keel(t, args...)
		if code != cli.ExitUsage || strings.Contains(errOut, "secret") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// TestStatusHostileServer: a git server's error text (an ERR line) is
// quoted in keel's error; its escape sequences and carriage returns reach
// stderr escaped.
func TestStatusHostileServer(t *testing.T) {
	msg := "ERR evil\x1b]0;pwned\x07\rgone\x9b2J\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		fmt.Fprintf(w, "%04x%s", len(msg)+4, msg)
	}))
	defer srv.Close()
	code, _, errOut := keel(t, "status", "--repo", srv.URL+"/x.git", "--cache-dir", t.TempDir())
	if code != cli.ExitUsage || !strings.Contains(errOut, `evil\x1b]0;pwned\x07\x0dgone\x9b2J`) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if strings.ContainsAny(errOut, "\x1b\x07\r") || !utf8.ValidString(errOut) {
		t.Errorf("control characters reach stderr: %q", errOut)
	}
}

// TestStatusWatch: --watch writes a new status at every interval, sees a
// report published after it started, and Ctrl-C ends it with exit 0 and
// no error.
func TestStatusWatch(t *testing.T) {
	server, tip, m := statusRepo(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int)
	go func() {
		done <- cli.Run(ctx, []string{"status", "--repo", server, "--watch", "--interval", "50ms", "-o", "json"}, strings.NewReader(""), &out, &errOut)
	}()
	waitOutput := func(what string) {
		t.Helper()
		poll(t, 30*time.Second, "--watch writing "+what, func() bool { return strings.Contains(out.String(), what) })
	}
	waitOutput(`"converged": false`)
	publish(t, server, statustest.Converged(m, tip, time.Now()))
	waitOutput(`"converged": true`)
	cancel()
	select {
	case code := <-done:
		if code != cli.ExitOK || errOut.String() != "" {
			t.Fatalf("Ctrl-C: exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("--watch did not stop on Ctrl-C")
	}
	if strings.Contains(out.String(), "context canceled") {
		t.Fatalf("Ctrl-C printed an error:\n%s", out.String())
	}
}
