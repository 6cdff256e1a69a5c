package proxy

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the proxy's Prometheus metrics, labelled by service, for one
// Manager.
type Metrics struct {
	connections *prometheus.CounterVec
	dialErrors  *prometheus.CounterVec
	rejected    *prometheus.CounterVec
	active      *prometheus.GaugeVec
	endpoints   *prometheus.GaugeVec
}

// NewMetrics creates the proxy's metrics and registers them on reg. It
// panics if they are registered there already, as MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := newMetrics()
	reg.MustRegister(m.connections, m.dialErrors, m.rejected, m.active, m.endpoints)
	return m
}

func newMetrics() *Metrics {
	label := []string{"service"}
	return &Metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_proxy_connections_total",
			Help: "Client connections accepted by the service proxy.",
		}, label),
		dialErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_proxy_dial_errors_total",
			Help: "Failed connection attempts from the service proxy to an endpoint.",
		}, label),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_proxy_rejected_total",
			Help: "Client connections the service proxy reset because every service together held the connection limit.",
		}, label),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_proxy_active_connections",
			Help: "Client connections the service proxy holds open now.",
		}, label),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_proxy_endpoints",
			Help: "Endpoints of a service the proxy listens for.",
		}, label),
	}
}

// serviceMetrics are one service's children, looked up once per listener
// rather than once per connection.
type serviceMetrics struct {
	connections, dialErrors, rejected prometheus.Counter
	active, endpoints                 prometheus.Gauge
}

func (m *Metrics) forService(name string) serviceMetrics {
	return serviceMetrics{
		connections: m.connections.WithLabelValues(name),
		dialErrors:  m.dialErrors.WithLabelValues(name),
		rejected:    m.rejected.WithLabelValues(name),
		active:      m.active.WithLabelValues(name),
		endpoints:   m.endpoints.WithLabelValues(name),
	}
}

// forget drops the endpoints gauge of a service no longer proxied. The
// counters stay (a counter that vanishes and comes back reads as a reset),
// and so does the active gauge, which falls to zero as the service's
// remaining connections end.
func (m *Metrics) forget(name string) {
	m.endpoints.DeleteLabelValues(name)
}
