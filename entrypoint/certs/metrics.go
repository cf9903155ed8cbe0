package certs

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the certificates' own metrics, registered by the caller.
type Metrics struct {
	expiry *prometheus.GaugeVec
}

// NewMetrics returns the metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "seamless_certificate_expiry_seconds",
		Help: "When each certificate HAProxy serves ends (notAfter), as a Unix time: alert on seamless_certificate_expiry_seconds - time() < 30 * 86400.",
	}, []string{"name", "source"})}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.expiry.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.expiry.Collect(ch) }

func (m *Metrics) set(e *Entry) {
	m.expiry.WithLabelValues(e.Name, e.Source).Set(float64(e.NotAfter.Unix()))
}

func (m *Metrics) drop(e *Entry) { m.expiry.DeleteLabelValues(e.Name, e.Source) }
