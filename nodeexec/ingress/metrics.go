package ingress

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ingress's Prometheus metrics for one Server. The host
// label only takes the hosts of the route table, and "" for every other
// Host a client sends, so clients cannot grow the number of series.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	active   prometheus.Gauge
}

// NewMetrics creates the ingress's metrics and registers them on reg. It
// panics if they are registered there already, as MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := newMetrics()
	reg.MustRegister(m.requests, m.duration, m.active)
	return m
}

func newMetrics() *Metrics {
	return &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_ingress_requests_total",
			Help: "Requests the ingress answered, by host (\"\" for hosts not routed) and status code.",
		}, []string{"host", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keel_ingress_request_duration_seconds",
			Help:    "Time from a request's headers read to its answer's end, by host (\"\" for hosts not routed).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"host"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_ingress_active_connections",
			Help: "Client connections the ingress holds open now, HTTP and HTTPS listeners together.",
		}),
	}
}

// codeLabels are the code label values of the valid status codes, made
// once rather than per request.
var codeLabels = func() (l [600]string) {
	for c := 100; c < 600; c++ {
		l[c] = strconv.Itoa(c)
	}
	return l
}()

// hostMetrics are one host's children, kept across route table swaps while
// the host stays, and dropped with its series when it goes.
type hostMetrics struct {
	m        *Metrics
	host     string
	duration prometheus.Observer

	mu    sync.Mutex
	gone  bool
	codes sync.Map // int -> prometheus.Counter
}

func (m *Metrics) forHost(host string) *hostMetrics {
	return &hostMetrics{m: m, host: host, duration: m.duration.WithLabelValues(host)}
}

// observe records one answered request. Code 0 (nothing written) is what
// net/http sends then: 200.
func (h *hostMetrics) observe(code int, d time.Duration) {
	if code == 0 {
		code = 200
	}
	h.duration.Observe(d.Seconds())
	h.counter(code).Inc()
}

func (h *hostMetrics) counter(code int) prometheus.Counter {
	if c, ok := h.codes.Load(code); ok {
		return c.(prometheus.Counter)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone {
		// A request that was in flight when its host left the table:
		// counted nowhere rather than bringing the series back.
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered"})
	}
	label := "other"
	if code >= 100 && code < 600 {
		label = codeLabels[code]
	}
	c := h.m.requests.WithLabelValues(h.host, label)
	h.codes.Store(code, c)
	return c
}

// forget deletes the host's series, once it has left the route table.
func (h *hostMetrics) forget() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = true
	h.m.requests.DeletePartialMatch(prometheus.Labels{"host": h.host})
	h.m.duration.DeleteLabelValues(h.host)
}
