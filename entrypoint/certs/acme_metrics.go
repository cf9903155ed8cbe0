package certs

import "github.com/prometheus/client_golang/prometheus"

// Results of an ACME order, the values of seamless_acme_orders_total's
// result label.
const (
	OrderIssued      = "issued"
	OrderFailed      = "failed"
	OrderRateLimited = "rate_limited"
)

// ACMEMetrics are ACME's own metrics, registered by the caller.
type ACMEMetrics struct {
	orders *prometheus.CounterVec
}

// NewACMEMetrics returns the metrics, unregistered, every result at 0.
func NewACMEMetrics() *ACMEMetrics {
	m := &ACMEMetrics{orders: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seamless_acme_orders_total",
		Help: "ACME certificate orders by result: issued, failed (retried with backoff), rate_limited (retried after the CA's Retry-After).",
	}, []string{"result"})}
	for _, r := range []string{OrderIssued, OrderFailed, OrderRateLimited} {
		m.orders.WithLabelValues(r)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *ACMEMetrics) Describe(ch chan<- *prometheus.Desc) { m.orders.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *ACMEMetrics) Collect(ch chan<- prometheus.Metric) { m.orders.Collect(ch) }

func (m *ACMEMetrics) order(result string) {
	if m != nil {
		m.orders.WithLabelValues(result).Inc()
	}
}
