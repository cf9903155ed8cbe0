// Package metrics holds seamless's Prometheus collectors, on a registry of
// their own (no global state), so that tests and the status server see the
// same values.
package metrics

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
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
	ConfigWriteErrors      prometheus.Counter
	SocketTransferFailures prometheus.Counter
	Workers                *prometheus.GaugeVec
	LastReloadSuccess      prometheus.Gauge
	HAProxyUp              prometheus.Gauge

	Applies         *prometheus.CounterVec
	LastApply       prometheus.Gauge
	Discovered      *prometheus.GaugeVec
	ConsulIndex     *prometheus.GaugeVec
	SourceSnapshots *prometheus.CounterVec
	RuntimeUpdates  *prometheus.CounterVec
	// RuntimeConns counts runtime API connections by the way they went.
	RuntimeConns *prometheus.CounterVec
}

// Results of applying a rendered configuration.
const (
	Runtime   = "runtime"   // membership changed over the runtime API, no reload
	Reloaded  = "reloaded"  // written, validated and reloaded
	Unchanged = "unchanged" // the same bytes as what runs
	Refused   = "refused"   // the template or validation failed; nothing changed
	Failed    = "failed"    // HAProxy did not take it (the file was rolled back), or it could not be written (retried)
)

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
		ConfigWriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamless_config_write_errors_total",
			Help: "Rendered configurations that could not be written (disk full, read-only, I/O or permission error); retried with backoff, not counted as configuration errors.",
		}),
		SocketTransferFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamless_socket_transfer_failures_total",
			Help: "Reloads where HAProxy could not pass its listening sockets to the new worker and rebound them (connections may have been lost).",
		}),
		Workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamless_haproxy_workers",
			Help: "HAProxy worker processes by generation (current, or old and still draining), as the master lists them at the scrape (after the last reload when it does not answer).",
		}, []string{"generation"}),
		LastReloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamless_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful reload (or start-up).",
		}),
		HAProxyUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamless_haproxy_up",
			Help: "1 while the HAProxy master process is running.",
		}),
		Applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamless_config_applies_total",
			Help: "Rendered configurations by what became of them: runtime (membership over the runtime API), reloaded, unchanged, refused (template or validation error), failed (HAProxy did not take it, or it could not be written).",
		}, []string{"result"}),
		LastApply: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamless_last_apply_timestamp_seconds",
			Help: "Unix time of the last rendered configuration that was applied or found unchanged.",
		}),
		Discovered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamless_discovered",
			Help: "Services and instances (any health) in the merged local catalog at the last render, by kind.",
		}, []string{"kind"}),
		ConsulIndex: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamless_consul_index",
			Help: "The Consul index of the catalog the running configuration was rendered from, by datacenter: the newest change it reflects. Replicas of a fleet that run the same catalog show the same or close values; one that lags behind lags here.",
		}, []string{"datacenter"}),
		RuntimeUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamless_runtime_updates_total",
			Help: "Membership changes (and a template's moved servers, on HAProxy 3.0+) applied over HAProxy's runtime API without a reload, by result; a failure falls back to a reload.",
		}, []string{"result"}),
		RuntimeConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamless_runtime_connections_total",
			Help: "Connections that carried runtime API commands or state reads, by the way they went: worker (the worker's own stats socket, the fast way) or master (the master CLI: the worker socket is not declared, gone, or held by a process that is not the current worker, e.g. during a reload).",
		}, []string{"via"}),
		SourceSnapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamless_source_snapshots_total",
			Help: "Snapshots received from each discovery source.",
		}, []string{"source"}),
	}
	for _, r := range []string{Runtime, Reloaded, Unchanged, Refused, Failed} {
		m.Applies.WithLabelValues(r)
	}
	m.RuntimeUpdates.WithLabelValues(Success)
	m.RuntimeUpdates.WithLabelValues(Failure)
	m.RuntimeConns.WithLabelValues(haproxy.ViaWorker)
	m.RuntimeConns.WithLabelValues(haproxy.ViaMaster)
	m.Reloads.WithLabelValues(Success)
	m.Reloads.WithLabelValues(Failure)
	m.Registry.MustRegister(
		m.Reloads, m.ReloadDuration, m.ReloadRequests, m.ReloadsCoalesced, m.ConfigErrors, m.ConfigWriteErrors,
		m.SocketTransferFailures, m.Workers, m.LastReloadSuccess, m.HAProxyUp,
		m.Applies, m.LastApply, m.Discovered, m.ConsulIndex, m.SourceSnapshots, m.RuntimeUpdates, m.RuntimeConns,
		collectors.NewGoCollector(),
		withoutNamespaceTotals{collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})},
	)
	return m
}

// WatchSources exports each source's status, read at every scrape.
func (m *Metrics) WatchSources(status func() []model.SourceStatus) {
	m.Registry.MustRegister(sourceCollector(status))
}

var (
	sourceUpDesc = prometheus.NewDesc("seamless_source_up",
		"1 when the last attempt to read the discovery source succeeded.", []string{"source"}, nil)
	sourceSuccessDesc = prometheus.NewDesc("seamless_source_last_success_timestamp_seconds",
		"Unix time of the last successful read of the discovery source.", []string{"source"}, nil)
	sourceErrorDesc = prometheus.NewDesc("seamless_source_last_error_timestamp_seconds",
		"Unix time of the last failed read of the discovery source (the error is on /status and in the log).", []string{"source"}, nil)
	sourceStaleDesc = prometheus.NewDesc("seamless_source_stale",
		"1 when the source has not answered within its wait plus a margin; its last good data keeps serving.", []string{"source"}, nil)
	sourceHeldDesc = prometheus.NewDesc("seamless_source_held_instances",
		"Instances the source no longer reports that are kept until the removal is confirmed (SEAMLESS_REMOVAL_GUARD).", []string{"source"}, nil)
	sourceHoldsDesc = prometheus.NewDesc("seamless_source_removal_holds_total",
		"Snapshots whose removal of too many instances at once was held (SEAMLESS_REMOVAL_GUARD).", []string{"source"}, nil)
	sourceWithheldDesc = prometheus.NewDesc("seamless_source_withheld_instances",
		"Instances the source reports again just after it started over, though it had removed them, kept out until the hold period ends (SEAMLESS_REMOVAL_HOLD).", []string{"source"}, nil)
	sourceWithholdsDesc = prometheus.NewDesc("seamless_source_withholds_total",
		"Snapshots after a reset of the source that brought back instances it had removed (SEAMLESS_REMOVAL_GUARD).", []string{"source"}, nil)
)

type sourceCollector func() []model.SourceStatus

func (c sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sourceUpDesc
	ch <- sourceSuccessDesc
	ch <- sourceErrorDesc
	ch <- sourceStaleDesc
	ch <- sourceHeldDesc
	ch <- sourceHoldsDesc
	ch <- sourceWithheldDesc
	ch <- sourceWithholdsDesc
}

func (c sourceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c() {
		up := 0.0
		if s.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sourceUpDesc, prometheus.GaugeValue, up, s.Name)
		stale := 0.0
		if s.Stale {
			stale = 1
		}
		ch <- prometheus.MustNewConstMetric(sourceStaleDesc, prometheus.GaugeValue, stale, s.Name)
		ch <- prometheus.MustNewConstMetric(sourceHeldDesc, prometheus.GaugeValue, float64(s.Held), s.Name)
		ch <- prometheus.MustNewConstMetric(sourceHoldsDesc, prometheus.CounterValue, float64(s.HoldsTotal), s.Name)
		ch <- prometheus.MustNewConstMetric(sourceWithheldDesc, prometheus.GaugeValue, float64(s.Withheld), s.Name)
		ch <- prometheus.MustNewConstMetric(sourceWithholdsDesc, prometheus.CounterValue, float64(s.WithholdsTotal), s.Name)
		if !s.LastSuccess.IsZero() {
			ch <- prometheus.MustNewConstMetric(sourceSuccessDesc, prometheus.GaugeValue,
				float64(s.LastSuccess.UnixNano())/1e9, s.Name)
		}
		if !s.LastErrorAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(sourceErrorDesc, prometheus.GaugeValue,
				float64(s.LastErrorAt.UnixNano())/1e9, s.Name)
		}
	}
}

var configInfoDesc = prometheus.NewDesc("seamless_config_info",
	"The configuration HAProxy runs: sha256 is the digest of the file, members_sha256 the same with each backend's server lines sorted and their slot names left out (equal on replicas that run the same servers in different slots). Absent while unknown.",
	[]string{"sha256", "members_sha256"}, nil)

// WatchConfig exports seamless_config_info, read at every scrape from
// fingerprint; an empty sha256 exports nothing.
func (m *Metrics) WatchConfig(fingerprint func() (sha256, members string)) {
	m.Registry.MustRegister(configCollector(fingerprint))
}

type configCollector func() (string, string)

func (c configCollector) Describe(ch chan<- *prometheus.Desc) { ch <- configInfoDesc }

func (c configCollector) Collect(ch chan<- prometheus.Metric) {
	if sha, members := c(); sha != "" {
		ch <- prometheus.MustNewConstMetric(configInfoDesc, prometheus.GaugeValue, 1, sha, members)
	}
}

// workersTimeout bounds the master CLI's answer for one scrape.
const workersTimeout = time.Second

// WatchWorkers makes seamless_haproxy_workers current at every scrape:
// an old worker exits when its last connection ends, long after the
// reload that counted it, and nothing else would count again. When count
// fails the values of the last reload stay.
func (m *Metrics) WatchWorkers(count func(ctx context.Context) (current, old int, err error)) {
	m.Registry.Unregister(m.Workers)
	m.Registry.MustRegister(workersCollector{m.Workers, count})
}

type workersCollector struct {
	g     *prometheus.GaugeVec
	count func(ctx context.Context) (current, old int, err error)
}

func (c workersCollector) Describe(ch chan<- *prometheus.Desc) { c.g.Describe(ch) }

func (c workersCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), workersTimeout)
	defer cancel()
	if cur, old, err := c.count(ctx); err == nil {
		c.g.WithLabelValues("current").Set(float64(cur))
		c.g.WithLabelValues("old").Set(float64(old))
	}
	c.g.Collect(ch)
}

// withoutNamespaceTotals drops process_network_*_bytes_total from the
// process collector: they are read from /proc/self/net/dev, the network
// namespace's totals (in a container, HAProxy's traffic too), not
// seamless's own.
type withoutNamespaceTotals struct{ prometheus.Collector }

func namespaceTotal(d *prometheus.Desc) bool {
	return strings.Contains(d.String(), `fqName: "process_network_`)
}

func (c withoutNamespaceTotals) Describe(ch chan<- *prometheus.Desc) {
	all := make(chan *prometheus.Desc)
	go func() { c.Collector.Describe(all); close(all) }()
	for d := range all {
		if !namespaceTotal(d) {
			ch <- d
		}
	}
}

func (c withoutNamespaceTotals) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() { c.Collector.Collect(all); close(all) }()
	for m := range all {
		if !namespaceTotal(m.Desc()) {
			ch <- m
		}
	}
}
