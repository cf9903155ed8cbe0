// Package metrics holds seamless's Prometheus collectors, on a registry of
// their own (no global state), so that tests and the status server see the
// same values.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Results of a reload attempt.
const (
	Success = "success"
	Failure = "failure"
)

// Metrics are the collectors.
type Metrics struct {
	Registry *prometheus.Registry

	Reloads                *prometheus.CounterVec
	ReloadDuration         prometheus.Histogram
	ReloadRequests         prometheus.Counter
	ReloadsCoalesced       prometheus.Counter
	ConfigErrors           prometheus.Counter
	SocketTransferFailures prometheus.Counter
	Workers                *prometheus.GaugeVec
	LastReloadSuccess      prometheus.Gauge
	HAProxyUp              prometheus.Gauge
}

// New registers every collector on a new registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamless_reloads_total",
			Help: "HAProxy reloads attempted, by confirmed result; an invalid configuration counts as a failure.",
		}, []string{"result"}),
		ReloadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seamless_reload_duration_seconds",
			Help:    "Time from the start of a reload (validation included) to its confirmed outcome.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		ReloadRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamless_reload_requests_total",
			Help: "Reload requests received (signals and configuration changes).",
		}),
		ReloadsCoalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamless_reload_requests_coalesced_total",
			Help: "Reload requests that arrived while another was pending and were served by it.",
		}),
		ConfigErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamless_config_errors_total",
			Help: "Configurations refused by validation; the previous configuration kept serving.",
		}),
		SocketTransferFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamless_socket_transfer_failures_total",
			Help: "Reloads where HAProxy could not pass its listening sockets to the new worker and rebound them (connections may have been lost).",
		}),
		Workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamless_haproxy_workers",
			Help: "HAProxy worker processes after the last reload, by generation (current, or old and still draining).",
		}, []string{"generation"}),
		LastReloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamless_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful reload (or start-up).",
		}),
		HAProxyUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamless_haproxy_up",
			Help: "1 while the HAProxy master process is running.",
		}),
	}
	m.Reloads.WithLabelValues(Success)
	m.Reloads.WithLabelValues(Failure)
	m.Registry.MustRegister(
		m.Reloads, m.ReloadDuration, m.ReloadRequests, m.ReloadsCoalesced, m.ConfigErrors,
		m.SocketTransferFailures, m.Workers, m.LastReloadSuccess, m.HAProxyUp,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}
