package agent

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

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
