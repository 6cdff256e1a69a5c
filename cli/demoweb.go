package cli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/spf13/cobra"
)

// Bounds of demo-web's behaviour on shutdown and of the delays it can be
// asked for.
const (
	// demoWebShutdownGrace is how long requests in flight at SIGTERM get
	// to finish: a little under the default terminationGracePeriod (10 s),
	// so that demo-web exits by itself rather than being killed.
	demoWebShutdownGrace = 5 * time.Second
	// demoWebMaxDelay bounds the ?delay= of a request.
	demoWebMaxDelay = 30 * time.Second
)

// demoWebCommand is the small HTTP service the demo cluster runs, so that
// nothing but keel itself must be installed. It answers on
// $KEEL_ADDRESS:--port with who it is; with --data it counts requests in a
// file of that directory (a volume), so that the count survives restarts.
//
// It behaves as a well-written service should on SIGTERM (see agent.md,
// "Stopping an instance"): it stops accepting connections, closes its idle
// keep-alive connections, lets the requests in flight finish (at most
// demoWebShutdownGrace), then exits 0.
//
// For the tests, it can also play a badly behaved service: --bind-delay
// makes it listen only some time after it starts, HEALTHZ=fail in its
// environment makes /healthz answer 503 (a version that never becomes
// ready under an http readiness check), and GET /?delay=DURATION sends its
// headers at once and its body only after that long (a request in flight
// at SIGTERM).
func (e *env) demoWebCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "demo-web",
		Short:  "The demo's HTTP service (an instance of the demo cluster runs it)",
		Hidden: true,
		Args:   cobra.NoArgs,
	}
	port := cmd.Flags().Int("port", 8080, "TCP port to listen on, at $KEEL_ADDRESS")
	data := cmd.Flags().String("data", "", "a directory (volume) where the request count is kept")
	bindDelay := cmd.Flags().Duration("bind-delay", 0, "wait this long after starting before listening (a service slow to start)")
	versionFile := cmd.Flags().String("version-file", "", "answer GET /version with this file's content (relative to the instance's root: a file of its image)")
	greetingFile := cmd.Flags().String("greeting-file", "", "read the greeting from this file (relative to the instance's root: a file of its image) rather than $GREETING")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		addr := os.Getenv("KEEL_ADDRESS")
		if addr == "" {
			addr = "127.0.0.1"
		}
		var mu gosync.Mutex
		hits := 0
		countFile := ""
		if *data != "" {
			countFile = filepath.Join(*data, "hits")
			if b, err := os.ReadFile(countFile); err == nil {
				hits, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
		}
		greeting := os.Getenv("GREETING")
		if *greetingFile != "" {
			b, err := os.ReadFile(*greetingFile)
			if err != nil {
				return err
			}
			greeting = strings.TrimSpace(string(b))
		}
		version := ""
		if *versionFile != "" {
			b, err := os.ReadFile(*versionFile)
			if err != nil {
				return err
			}
			version = strings.TrimSpace(string(b))
		}
		healthy := os.Getenv("HEALTHZ") != "fail"
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if d := r.URL.Query().Get("delay"); d != "" {
				delay, err := time.ParseDuration(d)
				if err != nil || delay < 0 || delay > demoWebMaxDelay {
					http.Error(w, fmt.Sprintf("delay: a duration from 0 to %s", demoWebMaxDelay), http.StatusBadRequest)
					return
				}
				// The status and headers at once, the body after the
				// delay: the client knows its request is in flight.
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusOK)
				http.NewResponseController(w).Flush()
				t := time.NewTimer(delay)
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return
				}
			}
			mu.Lock()
			hits++
			n := hits
			if countFile != "" {
				_ = os.WriteFile(countFile, []byte(strconv.Itoa(n)+"\n"), 0o600)
			}
			mu.Unlock()
			msg := greeting
			if msg == "" {
				msg = "hello"
			}
			fmt.Fprintf(w, "%s from %s on node %s (request %d)\n", msg, os.Getenv("KEEL_INSTANCE"), os.Getenv("KEEL_NODE"), n)
		})
		mux.HandleFunc("/version", func(w http.ResponseWriter, r *http.Request) {
			if version == "" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, "%s from %s on node %s\n", version, os.Getenv("KEEL_INSTANCE"), os.Getenv("KEEL_NODE"))
		})
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if !healthy {
				http.Error(w, "unhealthy (HEALTHZ=fail)", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		})
		if *bindDelay > 0 {
			t := time.NewTimer(*bindDelay)
			select {
			case <-t.C:
			case <-e.ctx.Done():
				t.Stop()
				return nil // stopped before it ever listened
			}
		}
		l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(*port)))
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		select {
		case err := <-served:
			return err // never http.ErrServerClosed: only Shutdown and Close return that
		case <-e.ctx.Done():
		}
		// Shutdown closes the listener and the idle connections (a client
		// that reuses one sees it closed before it sent anything, and
		// retries elsewhere), and waits for the requests in flight, whose
		// answers say "Connection: close".
		ctx, cancel := context.WithTimeout(context.Background(), demoWebShutdownGrace)
		defer cancel()
		err = srv.Shutdown(ctx)
		if err != nil {
			_ = srv.Close()
		}
		<-served
		if err != nil {
			return fmt.Errorf("requests still in flight after %s: %w", demoWebShutdownGrace, err)
		}
		return nil
	}
	return cmd
}
