package routes

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusals counts what the built-in configuration refuses, by the reason
// label (the Refused* kinds): seamless_routes_refused_total. A refusal is
// counted when it first appears in a committed rendering (one HAProxy
// runs), not at every render while it lasts, so the counter's rate is the
// rate of new refusals; one that goes away and comes back counts again. Share one between the renderers
// that SIGHUP makes (Options.Refusals) and register it once.
type Refusals struct {
	counter *prometheus.CounterVec
	mu      sync.Mutex
	last    map[Skip]bool // the refusals of the last rendering
}

var _ prometheus.Collector = (*Refusals)(nil)

// NewRefusals returns a counter with every reason at 0.
func NewRefusals() *Refusals {
	r := &Refusals{counter: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seamless_routes_refused_total",
		Help: "Routes, instances and services the built-in configuration left out, by reason: invalid_tag, invalid_instance, invalid_service, conflict (another service registered the route or port first), reserved_port. Counted once when the refusal appears; the details are in the log and in `seamless render`.",
	}, []string{"reason"})}
	for _, k := range []string{RefusedTag, RefusedInstance, RefusedService, RefusedConflict, RefusedReserved} {
		r.counter.WithLabelValues(k)
	}
	return r
}

// observe counts the refusals of a committed rendering that the last one
// did not have.
func (r *Refusals) observe(skips []Skip) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := make(map[Skip]bool, len(skips))
	for _, s := range skips {
		if s.Kind == "" {
			continue
		}
		now[s] = true
		if !r.last[s] {
			r.counter.WithLabelValues(s.Kind).Inc()
		}
	}
	r.last = now
}

// Describe implements prometheus.Collector.
func (r *Refusals) Describe(ch chan<- *prometheus.Desc) { r.counter.Describe(ch) }

// Collect implements prometheus.Collector.
func (r *Refusals) Collect(ch chan<- prometheus.Metric) { r.counter.Collect(ch) }
