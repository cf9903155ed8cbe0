package certs

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the certificates' own metrics, registered by the caller.
type Metrics struct {
	expiry *prometheus.GaugeVec
	mu     sync.Mutex
	hosts  map[[2]string][]string // the host series of each {name, source}
}

// NewMetrics returns the metrics, unregistered.
//
// The expiry gauge has one series per DNS name of each certificate
// (host), labelled with the certificate's name too: an alert names the
// host that breaks, and two certificates for one host stay apart. Its
// cardinality is the sum of the served certificates' names, which the
// sources bound (1,000 files, the routed hosts for ACME).
func NewMetrics() *Metrics {
	return &Metrics{expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "seamless_certificate_expiry_seconds",
		Help: "When each certificate HAProxy serves ends (notAfter), as a Unix time, per DNS name (host) it covers: alert on seamless_certificate_expiry_seconds - time() < 30 * 86400.",
	}, []string{"host", "name", "source"}), hosts: map[[2]string][]string{}}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.expiry.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.expiry.Collect(ch) }

// set records e's end for each of its names; a name it no longer has
// (a renewal that dropped one) loses its series.
func (m *Metrics) set(e *Entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{e.Name, e.Source}
	for _, h := range e.Names {
		m.expiry.WithLabelValues(h, e.Name, e.Source).Set(float64(e.NotAfter.Unix()))
	}
	for _, h := range m.hosts[k] {
		if !slices.Contains(e.Names, h) {
			m.expiry.DeleteLabelValues(h, e.Name, e.Source)
		}
	}
	m.hosts[k] = slices.Clone(e.Names)
}

func (m *Metrics) drop(e *Entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{e.Name, e.Source}
	for _, h := range m.hosts[k] {
		m.expiry.DeleteLabelValues(h, e.Name, e.Source)
	}
	delete(m.hosts, k)
}
