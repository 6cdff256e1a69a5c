package dashboard

import (
	"bytes"
	"context"
	"errors"
	"html"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// routes are a request to each of the dashboard's routes, and to a path
// it does not serve.
var routes = []string{"/", "/nodes/n1", "/nodes/nope", "/api/status", "/healthz", "/static/style.css", "/static/favicon.svg", "/static/", "/nowhere"}

func TestOnlyGetAndHead(t *testing.T) {
	d := newTest(t, Options{Source: fixed(handStatus())})
	for _, path := range routes {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions, http.MethodTrace, http.MethodConnect, "PROPFIND"} {
			t.Run(method+path, func(t *testing.T) {
				res, _ := get(t, d, method, path)
				if res.StatusCode != http.StatusMethodNotAllowed {
					t.Errorf("%s %s: status %d, want 405", method, path, res.StatusCode)
				}
				if got := res.Header.Get("Allow"); got != "GET, HEAD" {
					t.Errorf("%s %s: Allow %q, want %q", method, path, got, "GET, HEAD")
				}
			})
		}
	}
	for path, want := range map[string]int{"/": 200, "/nodes/n1": 200, "/nodes/nope": 404, "/api/status": 200, "/healthz": 200,
		"/static/style.css": 200, "/static/favicon.svg": 200, "/static/": 404, "/nowhere": 404} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			if res, _ := get(t, d, method, path); res.StatusCode != want {
				t.Errorf("%s %s: status %d, want %d", method, path, res.StatusCode, want)
			}
		}
	}
}

func TestSecurityHeaders(t *testing.T) {
	d := newTest(t, Options{Source: fixed(handStatus())})
	want := map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"X-Frame-Options":         "DENY",
	}
	for _, path := range routes {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			res, _ := get(t, d, method, path)
			for k, v := range want {
				if got := res.Header.Get(k); got != v {
					t.Errorf("%s %s: %s = %q, want %q", method, path, k, got, v)
				}
			}
		}
	}
}

// TestEscapesReportsAndCommits: what a report or a commit says is shown as
// text, never as markup.
func TestEscapesReportsAndCommits(t *testing.T) {
	d := newTest(t, Options{Source: fixed(handStatus()), RepoURL: "https://github.com/acme/cluster.git"})
	for _, path := range []string{"/", "/nodes/n1", "/nodes/n2"} {
		res, body := get(t, d, http.MethodGet, path)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, res.StatusCode)
		}
		for _, bad := range []string{"<script", "<img"} {
			if strings.Contains(body, bad) {
				t.Errorf("GET %s: the page contains %q unescaped", path, bad)
			}
		}
	}
	_, overview := get(t, d, http.MethodGet, "/")
	for _, want := range []string{
		"scale web &lt;img src=x onerror=alert(1)&gt;",            // the tip's subject
		"Ann &lt;script&gt;alert(1)&lt;/script&gt;",               // its author
		"exited 1: &lt;script&gt;alert(1)&lt;/script&gt;",         // an instance's error
		"unsigned &lt;img src=x onerror=alert(1)&gt;",             // a refusal
		"renewal: &lt;img src=x onerror=alert(1)&gt;",             // a certificate error
		"expires soon &lt;script&gt;alert(1)&lt;/script&gt;",      // a warning
		`href="https://github.com/acme/cluster/commit/` + tipHash, // the forge link
	} {
		if !strings.Contains(overview, want) {
			t.Errorf("GET /: want %q in the page", want)
		}
	}
	_, node := get(t, d, http.MethodGet, "/nodes/n1")
	for _, want := range []string{"pf is off &lt;script&gt;alert(1)&lt;/script&gt;", "web-0", "10.0.0.3", "crashloop", "www.example.com", "data"} {
		if !strings.Contains(node, want) {
			t.Errorf("GET /nodes/n1: want %q in the page", want)
		}
	}
}

func TestNodePageNotFound(t *testing.T) {
	d := newTest(t, Options{Source: fixed(handStatus())})
	for _, path := range []string{"/nodes/n4", "/nodes/N1", "/nodes/-n1", "/nodes/n1%2Fx", "/nodes/%3Cscript%3E", "/nodes/" + strings.Repeat("a", 64), "/nodes/", "/nodes/n1/x"} {
		res, body := get(t, d, http.MethodGet, path)
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", path, res.StatusCode)
		}
		if strings.Contains(body, "<script") {
			t.Errorf("GET %s: the name came back unescaped: %q", path, body)
		}
	}
	if res, body := get(t, d, http.MethodGet, "/nodes/n3"); res.StatusCode != 200 || !strings.Contains(body, "n3: dead") {
		t.Errorf("GET /nodes/n3: %d, want the dead node's page", res.StatusCode)
	}
}

func TestAPIStatusIsTheStatusDocument(t *testing.T) {
	st := handStatus()
	d := newTest(t, Options{Source: fixed(st)})
	res, body := get(t, d, http.MethodGet, "/api/status")
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var want bytes.Buffer
	if err := WriteJSON(&want, st); err != nil {
		t.Fatal(err)
	}
	if body != want.String() {
		t.Errorf("/api/status is not the status document:\n%s", body)
	}
	if strings.Contains(body, `"Report"`) || !strings.Contains(body, `"schemaVersion": 1`) {
		t.Errorf("/api/status: unexpected document:\n%s", body)
	}
}

// TestReadsInTheBackground: a burst of requests reads the repository no
// more often than the refresh interval says.
func TestReadsInTheBackground(t *testing.T) {
	var reads atomic.Int32
	st := handStatus()
	d := newTest(t, Options{Refresh: time.Hour, Source: func(context.Context) (*status.Status, error) {
		reads.Add(1)
		return st, nil
	}})
	var wg sync.WaitGroup
	for range 50 {
		for _, path := range []string{"/", "/api/status", "/nodes/n1"} {
			wg.Go(func() {
				if res, _ := get(t, d, http.MethodGet, path); res.StatusCode != http.StatusOK {
					t.Errorf("GET %s: %d", path, res.StatusCode)
				}
			})
		}
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Errorf("150 requests made %d reads, want the one at start", n)
	}
}

// script is a Source that returns its results in turn, then blocks until
// its context ends.
type script struct {
	mu      sync.Mutex
	results []func() (*status.Status, error)
	calls   int
	blocked chan struct{} // closed when the script has run out
}

func (s *script) read(ctx context.Context) (*status.Status, error) {
	s.mu.Lock()
	s.calls++
	if len(s.results) > 0 {
		r := s.results[0]
		s.results = s.results[1:]
		s.mu.Unlock()
		return r()
	}
	s.mu.Unlock()
	close(s.blocked)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestKeepsTheLastGoodStatus: when a read fails, the page shows the last
// status read, its age, and the error.
func TestKeepsTheLastGoodStatus(t *testing.T) {
	st := handStatus()
	now := testNow
	var clock sync.Mutex
	sc := &script{blocked: make(chan struct{}), results: []func() (*status.Status, error){
		func() (*status.Status, error) { return st, nil },
		func() (*status.Status, error) {
			clock.Lock()
			now = now.Add(2 * time.Minute)
			clock.Unlock()
			return nil, errors.New("fetch https://git.example.com/ops/cluster.git: connection refused")
		},
	}}
	d := newTest(t, Options{Refresh: time.Millisecond, Source: sc.read, Now: func() time.Time {
		clock.Lock()
		defer clock.Unlock()
		return now
	}})
	select {
	case <-sc.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the dashboard did not read again")
	}
	res, body := get(t, d, http.MethodGet, "/")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d", res.StatusCode)
	}
	for _, want := range []string{
		"Cannot read the repository (0s ago): fetch https://git.example.com/ops/cluster.git: connection refused. Showing the status read 2m00s ago.",
		`class="headline warn"`, // stale: older than a minute
		"node n3 is dead",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /: want %q in\n%s", want, body)
		}
	}
	if res, _ := get(t, d, http.MethodGet, "/api/status"); res.StatusCode != http.StatusOK {
		t.Errorf("/api/status after a failed read: %d, want the last status", res.StatusCode)
	}
	// Close ends the read in progress and waits for it.
	d.Close()
	sc.mu.Lock()
	calls := sc.calls
	sc.mu.Unlock()
	if calls != 3 {
		t.Errorf("%d reads, want 3", calls)
	}
}

func TestNothingReadYet(t *testing.T) {
	d := newTest(t, Options{Source: func(context.Context) (*status.Status, error) {
		return nil, errors.New("repository not found")
	}})
	res, body := get(t, d, http.MethodGet, "/api/status")
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "repository not found") {
		t.Errorf("/api/status: %d %q, want 503 with the error", res.StatusCode, body)
	}
	res, body = get(t, d, http.MethodGet, "/")
	if res.StatusCode != http.StatusOK || !strings.Contains(body, "No status: cannot read the repository") || !strings.Contains(body, `class="headline unknown"`) {
		t.Errorf("GET /: %d\n%s", res.StatusCode, body)
	}
	if res, _ := get(t, d, http.MethodGet, "/nodes/n1"); res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nodes/n1 with no status: %d, want 404", res.StatusCode)
	}
}

func TestHeadlineColour(t *testing.T) {
	converged := handStatus()
	converged.Converged = true
	for _, tc := range []struct {
		name string
		p    page
		want string
	}{
		{"converged", page{St: converged, Refresh: 10, Now: testNow, Read: testNow}, "good"},
		{"not converged", page{St: handStatus(), Refresh: 10, Now: testNow, Read: testNow}, "bad"},
		{"a failed read, recent status", page{St: converged, Refresh: 10, Now: testNow, Read: testNow.Add(-30 * time.Second), Err: errors.New("x")}, "good"},
		{"reads failing for long", page{St: converged, Refresh: 10, Now: testNow, Read: testNow.Add(-2 * time.Minute), Err: errors.New("x")}, "warn"},
		{"nothing read", page{Refresh: 10, Now: testNow}, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Class(); got != tc.want {
				t.Errorf("Class() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a source: no error")
	}
	if _, err := New(Options{Source: fixed(handStatus()), Refresh: -time.Second}); err == nil {
		t.Error("New with a negative refresh: no error")
	}
}

// TestFixtures renders the overview and every node's page of each fixture
// cluster of keel status.
func TestFixtures(t *testing.T) {
	for _, name := range statustest.Names() {
		t.Run(name, func(t *testing.T) {
			snap, now := statustest.Snapshot(t, name)
			st := status.Compute(status.Input{Snapshot: snap, Now: now})
			d := newTest(t, Options{Source: fixed(st), Now: func() time.Time { return now }})
			res, body := get(t, d, http.MethodGet, "/")
			if res.StatusCode != http.StatusOK {
				t.Fatalf("GET /: %d", res.StatusCode)
			}
			class := `class="headline bad"`
			if st.Converged {
				class = `class="headline good"`
			}
			for _, want := range []string{html.EscapeString(st.Headline), class, html.EscapeString(st.Tip.Subject)} {
				if !strings.Contains(body, want) {
					t.Errorf("GET /: want %q in the page", want)
				}
			}
			for _, m := range st.Missing {
				if !strings.Contains(body, "<li>"+html.EscapeString(m)+"</li>") {
					t.Errorf("GET /: missing %q not listed", m)
				}
			}
			for _, n := range st.Nodes {
				if !strings.Contains(body, `<a href="/nodes/`+n.Name+`">`) {
					t.Errorf("GET /: no row for node %s", n.Name)
				}
				res, body := get(t, d, http.MethodGet, "/nodes/"+n.Name)
				if res.StatusCode != http.StatusOK || !strings.Contains(body, n.Name+": "+n.State) {
					t.Errorf("GET /nodes/%s: %d, want its page", n.Name, res.StatusCode)
				}
				for _, ri := range n.Report.Instances {
					if !strings.Contains(body, "<td>"+ri.Name+"</td>") {
						t.Errorf("GET /nodes/%s: instance %s not shown", n.Name, ri.Name)
					}
				}
			}
			for _, a := range st.Attention {
				if !strings.Contains(body, html.EscapeString(a.Reason)) {
					t.Errorf("GET /: attention %s (%s) not shown", a.Name, a.Reason)
				}
			}
		})
	}
}
