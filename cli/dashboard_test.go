package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// syncBuffer is a bytes.Buffer a command writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// poll calls f until it returns true, failing the test after timeout.
func poll(t *testing.T, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fetch(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(body)
}

// TestDashboardCommand runs keel dashboard over a real repository on a
// real port: it shows what keel status shows, follows a node's death on
// its next read, refuses writes, and stops cleanly on Ctrl-C.
func TestDashboardCommand(t *testing.T) {
	server, tip, m := statusRepo(t)
	reports := statustest.Converged(m, tip, time.Now())
	publish(t, server, reports)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, []string{"dashboard", "--repo", server, "--listen", "127.0.0.1:0", "--refresh", "1s"}, strings.NewReader(""), &stdout, &stderr)
	}()
	serving := regexp.MustCompile(`serving .* on (http://127\.0\.0\.1:[0-9]+/)`)
	var url string
	poll(t, 30*time.Second, "keel dashboard to serve", func() bool {
		select {
		case c := <-code:
			t.Fatalf("keel dashboard exited %d: %s", c, stderr.String())
		default:
		}
		if m := serving.FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	})

	// The same status as keel status.
	_, want, _ := keel(t, "status", "--repo", server, "-o", "json")
	var st, ks status.Status
	poll(t, 30*time.Second, "the first read", func() bool {
		c, body := fetch(t, http.MethodGet, url+"api/status")
		return c == http.StatusOK && json.Unmarshal([]byte(body), &st) == nil
	})
	if err := json.Unmarshal([]byte(want), &ks); err != nil {
		t.Fatal(err)
	}
	if !st.Converged || st.Headline != ks.Headline || st.Headline != "converged at "+tip[:12] || len(st.Nodes) != 3 {
		t.Fatalf("dashboard: %q, keel status: %q", st.Headline, ks.Headline)
	}
	if c, body := fetch(t, http.MethodGet, url); c != http.StatusOK || !strings.Contains(body, "converged at "+tip[:12]) || !strings.Contains(body, "web: &lt;b&gt;LOG_LEVEL&lt;/b&gt;=debug") {
		t.Fatalf("GET /: %d\n%s", c, body)
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		if c, _ := fetch(t, method, url); c != http.StatusMethodNotAllowed {
			t.Errorf("%s /: %d, want 405", method, c)
		}
	}

	// n3 stops reporting: the dashboard reads it at its next refresh.
	reports[2].Time = time.Now().Add(-time.Minute)
	reports[2].Clock = reports[2].Time
	publish(t, server, reports[2:])
	poll(t, 30*time.Second, "the dashboard to show n3 dead", func() bool {
		_, body := fetch(t, http.MethodGet, url)
		return strings.Contains(body, "node n3 is dead")
	})
	if c, body := fetch(t, http.MethodGet, url+"nodes/n3"); c != http.StatusOK || !strings.Contains(body, "n3: dead") {
		t.Errorf("GET /nodes/n3: %d", c)
	}

	cancel()
	select {
	case c := <-code:
		if c != cli.ExitOK {
			t.Errorf("keel dashboard exited %d after Ctrl-C: %s", c, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("keel dashboard did not stop on Ctrl-C")
	}
	if _, err := http.Get(url + "healthz"); err == nil {
		t.Error("the port still answers after keel dashboard stopped")
	}
}

func TestDashboardUsage(t *testing.T) {
	server, _, _ := statusRepo(t)
	for _, args := range [][]string{
		{"dashboard", "--repo", server, "--refresh", "10ms"},
		{"dashboard", "--repo", server, "--listen", "nonsense"},
		{"dashboard", "--repo", t.TempDir()},
		{"dashboard", "--repo", "https://user:secret@example.test/x.git"},
	} {
		code, _, errOut := keel(t, args...)
		if code != cli.ExitUsage || strings.Contains(errOut, "secret") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}
