package dashboard

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/keel-dev/keel/dashboard/headless"
	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// Browser starts a headless Chromium for a test and returns a tab's
// context; the browser ends with the test. Without a browser the test
// skips, unless KEEL_REQUIRE_CHROMIUM is set (CI sets it: there the
// browser is installed, and a skip would hide a broken install).
func Browser(t *testing.T, timeout time.Duration) context.Context {
	path, err := headless.Find()
	if err != nil {
		if os.Getenv("KEEL_REQUIRE_CHROMIUM") != "" {
			t.Fatalf("KEEL_REQUIRE_CHROMIUM is set: %v", err)
		}
		t.Skipf("%v; set KEEL_REQUIRE_CHROMIUM=1 to fail instead", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	bctx, stop := headless.Start(ctx, path, 1280, 900)
	t.Cleanup(stop)
	return bctx
}

// serve serves h on a real TCP port of 127.0.0.1 with the dashboard's
// server settings, until the test ends.
func serve(t *testing.T, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(h, nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}

// consoleLog collects what the browser's console says, from every page.
type consoleLog struct {
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
	stop context.CancelFunc
	done chan struct{}
}

func listenConsole(ctx context.Context) *consoleLog {
	lctx, stop := context.WithCancel(ctx)
	c := &consoleLog{stop: stop, done: make(chan struct{})}
	msgs := chromedp.Console(lctx)
	go func() {
		defer close(c.done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
		}
	}()
	return c
}

// waitFor waits until a message satisfies ok, and returns every message
// received so far.
func (c *consoleLog) waitFor(ctx context.Context, ok func(chromedp.ConsoleMessage) bool) ([]chromedp.ConsoleMessage, error) {
	for {
		c.mu.Lock()
		msgs := append([]chromedp.ConsoleMessage(nil), c.msgs...)
		c.mu.Unlock()
		for _, m := range msgs {
			if ok(m) {
				return msgs, nil
			}
		}
		select {
		case <-ctx.Done():
			return msgs, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *consoleLog) close() {
	c.stop()
	<-c.done
}

// TestBrowser loads the dashboard of the dead-node fixture in a real
// headless Chromium over TCP: the headline and the node rows as a visitor
// sees them, the stylesheet applied under the Content-Security-Policy, a
// node's page, and nothing on the console. It saves a screenshot in the
// test's artifact directory (go test -artifacts keeps it).
func TestBrowser(t *testing.T) {
	ctx := Browser(t, 60*time.Second)
	snap, now := statustest.Snapshot(t, "dead-node")
	st := status.Compute(status.Input{Snapshot: snap, Now: now})
	d := newTest(t, Options{Source: fixed(st), Refresh: time.Hour, Now: func() time.Time { return now }, RepoURL: "https://github.com/acme/cluster.git"})
	url := serve(t, d)

	// A page that breaks the policy, served with the same headers: the
	// violation must reach the console, or a clean console proves nothing.
	control := serve(t, secure(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(`<!DOCTYPE html><title>control</title><script>document.title = "ran"</script>`))
	})))

	console := listenConsole(ctx)
	defer console.close()

	var headline, rows, nodeHeadline, instances, title string
	var bg string
	err := chromedp.Do(ctx,
		chromedp.Navigate(url+"/"),
		chromedp.WaitVisible(chromedp.CSS("#headline")),
	)
	if err != nil {
		t.Fatal(err)
	}
	if headline, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#headline"))); err != nil {
		t.Fatal(err)
	}
	if rows, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#nodes tbody"))); err != nil {
		t.Fatal(err)
	}
	if bg, err = computed(ctx, "#headline-box", "background-color"); err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#nodes a[href="/nodes/n3"]`)),
		chromedp.WaitVisible(chromedp.CSS("#instances")),
	); err != nil {
		t.Fatal(err)
	}
	if nodeHeadline, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#headline"))); err != nil {
		t.Fatal(err)
	}
	if instances, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#instances tbody"))); err != nil {
		t.Fatal(err)
	}
	// Last, the control page: its violation arrives after anything the
	// dashboard's pages said.
	if err := chromedp.Do(ctx, chromedp.Navigate(control+"/")); err != nil {
		t.Fatal(err)
	}
	if title, err = chromedp.Run(ctx, chromedp.Title()); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	msgs, err := console.waitFor(wctx, func(m chromedp.ConsoleMessage) bool {
		return strings.HasPrefix(m.URL, control) && strings.Contains(m.Text, "Content Security Policy")
	})
	cancel()
	if err != nil {
		t.Errorf("the control page's inline script made no CSP violation on the console (%v): %v", err, msgs)
	}
	if title != "control" {
		t.Errorf("the control page's inline script ran (title %q): the policy is not enforced", title)
	}

	if err := os.WriteFile(filepath.Join(t.ArtifactDir(), "dashboard-dead-node.png"), shot, 0o644); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(shot, []byte("\x89PNG")) || len(shot) < 10_000 {
		t.Errorf("the screenshot is not a PNG of the page (%d bytes)", len(shot))
	}

	if want := st.Headline; headline != want || !strings.HasPrefix(want, "not converged at 3f2a9c1e04b7: node n3 is dead") {
		t.Errorf("headline %q, want %q", headline, want)
	}
	if bg != "rgb(207, 34, 46)" {
		t.Errorf("headline background %q, want the red of not converged (is the stylesheet applied?)", bg)
	}
	lines := strings.Split(strings.TrimSpace(rows), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d node rows, want 3:\n%s", len(lines), rows)
	}
	for i, want := range [][]string{
		{"n1", "alive", "3f2a9c1e04b7", "tip", "agrees"},
		{"n2", "alive", "3f2a9c1e04b7", "tip", "agrees"},
		{"n3", "dead", "2m00s ago", "3f2a9c1e04b7"},
	} {
		cells := strings.Split(lines[i], "\t")
		if cells[0] != want[0] || cells[1] != want[1] {
			t.Errorf("node row %d: %q, want node %s %s", i, lines[i], want[0], want[1])
		}
		for _, w := range want[2:] {
			if !strings.Contains(lines[i], w) {
				t.Errorf("node row %d: %q, want %q in it", i, lines[i], w)
			}
		}
	}
	if nodeHeadline != "n3: dead" {
		t.Errorf("node page headline %q, want %q", nodeHeadline, "n3: dead")
	}
	if !strings.Contains(instances, "web-2") || !strings.Contains(instances, "running") {
		t.Errorf("n3's instances as its last report says: %q", instances)
	}
	for _, m := range msgs {
		if !strings.HasPrefix(m.URL, control) && m.Type != chromedp.ConsoleDebug && m.Type != chromedp.ConsoleLog {
			t.Errorf("console: %s (%s)", m, m.URL)
		}
	}
}

// computed returns a CSS property of the first element sel matches, as
// the browser computed it.
func computed(ctx context.Context, sel, property string) (string, error) {
	styles, err := chromedp.Run(ctx, chromedp.ComputedStyle(chromedp.CSS(sel)))
	if err != nil {
		return "", err
	}
	for _, s := range styles {
		if s.Name == property {
			return s.Value, nil
		}
	}
	return "", errors.New("no " + property)
}
