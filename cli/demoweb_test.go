package cli_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/internal/loopnet"
)

// demoWeb runs keel demo-web in-process with args until the returned
// cancel, the SIGTERM of keel's main; it returns the base URL and a
// channel closed once it has exited, with its exit code in *code.
func demoWeb(t *testing.T, env map[string]string, args ...string) (base string, cancel context.CancelFunc, exited *exit) {
	t.Helper()
	t.Setenv("KEEL_ADDRESS", "127.0.0.1")
	t.Setenv("KEEL_INSTANCE", "web-0")
	t.Setenv("KEEL_NODE", "n1")
	for k, v := range env {
		t.Setenv(k, v)
	}
	port, err := loopnet.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &exit{done: make(chan struct{})}
	go func() {
		defer close(e.done)
		e.code = cli.Run(ctx, append([]string{"demo-web", "--port", strconv.Itoa(port)}, args...), strings.NewReader(""), io.Discard, &e.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	return "http://127.0.0.1:" + strconv.Itoa(port), cancel, e
}

// exit is how demo-web ended: code and stderr are set once done is closed.
type exit struct {
	done   chan struct{}
	code   int
	stderr bytes.Buffer
}

// waitServing polls url until it answers.
func waitServing(t *testing.T, client *http.Client, url string) *http.Response {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo-web never answered %s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond) // a polling period
	}
}

// exitCode waits (boundedly) for demo-web to exit.
func exitCode(t *testing.T, e *exit) int {
	t.Helper()
	select {
	case <-e.done:
		if e.code != 0 {
			t.Logf("demo-web's stderr: %s", e.stderr.String())
		}
		return e.code
	case <-time.After(20 * time.Second):
		t.Fatal("demo-web did not exit")
		return -1
	}
}

// TestDemoWebGracefulShutdown: on SIGTERM (the end of its context), a
// request in flight gets its whole answer, the idle keep-alive connection
// is closed rather than reset, new connections are refused, and demo-web
// exits 0.
func TestDemoWebGracefulShutdown(t *testing.T) {
	base, stop, exited := demoWeb(t, nil)
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	resp := waitServing(t, client, base+"/")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(b), "hello from web-0 on node n1") {
		t.Fatalf("demo-web answered %q", b)
	}

	// An idle keep-alive connection, kept by a raw client so that we see
	// what the server does to it.
	idle, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := idle.Read(buf); err != nil || !bytes.Contains(buf[:n], []byte("hello from web-0")) {
		t.Fatalf("keep-alive request: %q, %v", buf[:n], err)
	}

	// A request in flight: its headers come at once, its body in 1 s.
	slow, err := (&http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}).Get(base + "/?delay=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Body.Close()
	stop()
	body, err := io.ReadAll(slow.Body)
	if err != nil || !strings.HasPrefix(string(body), "hello from web-0") {
		t.Errorf("the request in flight at SIGTERM got %q, %v", body, err)
	}
	// The idle connection is closed cleanly (EOF), not reset.
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := idle.Read(buf); !errors.Is(err, io.EOF) {
		t.Errorf("the idle keep-alive connection: read %q, %v; want EOF", buf[:n], err)
	}
	if c := exitCode(t, exited); c != 0 {
		t.Errorf("demo-web exited %d after SIGTERM, want 0", c)
	}
	if _, err := net.Dial("tcp", strings.TrimPrefix(base, "http://")); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a new connection after the shutdown: %v, want refused", err)
	}
}

// TestDemoWebHealthz: /healthz answers 200 by default and 503 with
// HEALTHZ=fail, while / answers either way.
func TestDemoWebHealthz(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
	}{{"", http.StatusOK}, {"fail", http.StatusServiceUnavailable}} {
		t.Run("HEALTHZ="+tc.env, func(t *testing.T) {
			base, _, _ := demoWeb(t, map[string]string{"HEALTHZ": tc.env})
			client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
			resp := waitServing(t, client, base+"/healthz")
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("/healthz answered %s, want %d", resp.Status, tc.want)
			}
			resp, err := client.Get(base + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/ answered %s", resp.Status)
			}
		})
	}
}

// TestDemoWebBindDelay: with --bind-delay the port stays closed, and a
// SIGTERM meanwhile ends demo-web at once with 0; a short delay ends with
// the port open.
func TestDemoWebBindDelay(t *testing.T) {
	t.Run("stopped before it binds", func(t *testing.T) {
		base, stop, exited := demoWeb(t, nil, "--bind-delay", "1h")
		if _, err := net.Dial("tcp", strings.TrimPrefix(base, "http://")); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("a connection during the bind delay: %v, want refused", err)
		}
		stop()
		if c := exitCode(t, exited); c != 0 {
			t.Errorf("demo-web exited %d after SIGTERM during its bind delay, want 0", c)
		}
	})
	t.Run("binds after the delay", func(t *testing.T) {
		base, _, _ := demoWeb(t, nil, "--bind-delay", "200ms")
		client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
		resp := waitServing(t, client, base+"/")
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("/ answered %s", resp.Status)
		}
	})
}

// TestDemoWebDelayBounds: a delay that is not a duration from 0 to 30 s
// is refused.
func TestDemoWebDelayBounds(t *testing.T) {
	base, _, _ := demoWeb(t, nil)
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	waitServing(t, client, base+"/healthz").Body.Close()
	for _, d := range []string{"1h", "-1s", "soon"} {
		resp, err := client.Get(base + "/?delay=" + d)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("delay=%s answered %s, want 400", d, resp.Status)
		}
	}
}
