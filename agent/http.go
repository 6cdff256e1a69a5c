package agent

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/keel-dev/keel/internal/netlimit"
)

// SocketLimits are the local API socket's limits (only the agent's user
// can connect to it, but a stuck client must not hold its descriptors).
var SocketLimits = netlimit.HTTP{
	MaxConns:      netlimit.DefaultMaxConns,
	HeaderTimeout: netlimit.DefaultHeaderTimeout,
	IdleTimeout:   netlimit.DefaultIdleTimeout,
}

// ListenFile is where the agent writes the address its listener name
// ("metrics", "webhook") is bound to, so that a listener asked for on port
// 0 can be found: <state>/listen/<name>.
func ListenFile(stateDir, name string) string { return filepath.Join(stateDir, "listen", name) }

// ClearListenFiles removes the addresses a previous run wrote.
func ClearListenFiles(stateDir string) error {
	err := os.RemoveAll(filepath.Join(stateDir, "listen"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// WriteListenFile records addr as the address of listener name, atomically:
// a reader sees the whole address or no file.
func WriteListenFile(stateDir, name, addr string) error {
	path := ListenFile(stateDir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("recording the %s address: %w", name, err)
	}
	return nil
}

// health is what /healthz and /readyz read; the loop updates it.
type health struct {
	lastPass atomic.Int64 // unix nanoseconds of the last loop pass
	ready    atomic.Bool  // a commit is applied and the first pass ran
}

// Handler serves /metrics, /healthz (the loop is alive) and /readyz (the
// agent applied a commit and reconciled it).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.opts.Registry, promhttp.HandlerOpts{Registry: a.opts.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		last := time.Unix(0, a.health.lastPass.Load())
		if time.Since(last) > a.loopStallLimit() {
			http.Error(w, "the agent loop has not run since "+last.Format(time.RFC3339), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !a.health.ready.Load() {
			http.Error(w, "no commit applied yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}
