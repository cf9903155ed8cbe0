package consul

import (
	"context"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/backoff"
)

const (
	// minInterval is the shortest time between two requests of one watch
	// after a success: a burst of changes is read once, not once each.
	minInterval = 100 * time.Millisecond
	// pacedBurst is how many answers in a row a per-service catalog
	// passes on at once before its pace applies. One write to Consul
	// answers several of its queries a few milliseconds apart (the
	// service's health, the service list at its new index): with no room
	// for them, the answer that carried the change waited out the pause
	// that the first, empty one started (+100 ms on half the changes).
	pacedBurst = 4
	// queryBurst is how many answers in a row a service's health query
	// takes at once before minInterval paces it. A pause after every
	// answer held a service's second change within minInterval until the
	// pause ran out: 6 changes in 100 at 100 × 10 under 50 changes a
	// second, p99 90 ms. consul-template pauses only between answers that
	// carry no change. The service list keeps a pause after every answer:
	// every registration moves its index, mostly with the same names (a
	// burst there read it 1.2× as often as consul-template does).
	queryBurst = 4
	// perInstancePace is the per-service catalog's pace per instance it
	// holds. The steps after the source skip the services a catalog hands
	// on unchanged, but the configuration's text and file are still made
	// whole, in proportion to the instances (about 0.1 s of CPU a catalog
	// at 10,000 × 10; 2 µs there cost 1.65× the CPU per change for a p99
	// 3 % lower). At 4 µs a small catalog is not held to minInterval: at 100 ×
	// 10 that held 50 changes a second 71-85 ms apart at p50. At 1,000 ×
	// 10, 10 µs (100 ms) gave a change → file p50 of 69-75 ms, 4 µs 32-46
	// ms and 2 µs 31-36 ms, at 5, 8.5 and 12.5 ms of CPU per change.
	perInstancePace = 4 * time.Microsecond
	// maxCatalogPace bounds the pace of a very large catalog. Bounded at
	// minInterval instead, from 25,000 instances on the steps after the
	// source cost more than the eighth of a core: at 10,000 × 10 under
	// 50 changes a second, 99-104 ms of CPU per change against 67-75 at
	// 400 ms, with the same delays (p50 629-669 / 574-590 ms).
	maxCatalogPace = time.Second
)

// catalogPace is the shortest time, on average, between two catalogs of
// instances that the per-service catalog passes on.
func catalogPace(instances int) time.Duration {
	return min(time.Duration(max(instances, 0))*perInstancePace, maxCatalogPace)
}

// pacer spaces a watch's requests interval apart on average, letting
// burst of them through at once (a generic cell rate: tat is when the
// next request would be due if every earlier one had kept the pace).
type pacer struct {
	burst    int
	interval time.Duration
	tat      time.Time
}

// answered notes a success at now.
func (p *pacer) answered(now time.Time) {
	p.tat = maxTime(p.tat, now).Add(p.interval)
}

// wait returns when the next request may go, or false once ctx ends.
func (p *pacer) wait(ctx context.Context) bool {
	return sleep(ctx, time.Until(p.tat.Add(-time.Duration(p.burst-1)*p.interval)))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// selfPaced is a fetcher whose queries pace and retry on their own (the
// per-service catalog's sub-watches), while it serves: its failures are
// not backed off again, and its answers are passed on a burst at a time
// at the pace it says.
type selfPaced interface {
	pace() (time.Duration, bool)
}

// selfPace is f's own pace, and whether it paces itself now.
func selfPace(f fetcher) (time.Duration, bool) {
	if p, ok := f.(selfPaced); ok {
		return p.pace()
	}
	return 0, false
}

// watch answers one query for as long as it is wanted.
type watch struct {
	q      model.Query
	cancel context.CancelFunc
	f      fetcher
	// answered is when the query last succeeded (or the watch started);
	// stale, that it is overdue and was logged so. Both under Source.mu.
	answered time.Time
	stale    bool
	// staleAnswer says why the latest answer was refused as too stale
	// (SEAMLESS_CONSUL_MAX_STALE), or is "". Under Source.mu.
	staleAnswer string
}

// fetcher reads one query. Its first fetch answers at once; every later one
// returns when the answer may have changed (a blocking query returned, a
// poll interval passed). A fetcher keeps its own index and is used by one
// goroutine only.
type fetcher interface {
	fetch(ctx context.Context) (model.Result, error)
}

// newFetcher returns the fetcher for q.
func (s *Source) newFetcher(q model.Query) fetcher {
	dc := q.Datacenter
	if dc == "" {
		dc = s.cfg.Datacenter
	}
	switch q.Kind {
	case model.QueryCatalog:
		return &catalogFetcher{s: s, dc: dc, budget: s.cfg.Watches, set: newWatchSet(s, dc)}
	case model.QueryKey, model.QueryPrefix:
		return &kvFetcher{s: s, dc: dc, key: q.Key, prefix: q.Kind == model.QueryPrefix}
	default: // model.QueryDatacenters; Want lets no other kind through
		return &dcFetcher{s: s}
	}
}

// runWatch fetches w's query until ctx ends, retrying failures with
// backoff; answers and errors go to s.
func (s *Source) runWatch(ctx context.Context, w *watch) {
	if c, ok := w.f.(interface{ close() }); ok {
		defer c.close() // its own goroutines end with the watch
	}
	bo := s.newBackoff()
	var pace pacer
	for {
		recovery := s.probe.recovery()
		r, err := w.f.fetch(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d := bo.Next()
			if _, self := selfPace(w.f); self {
				d = 0 // its queries back off on their own; twice would add up
			}
			s.failed(w, err, d, staleness(w.f, err))
			if !s.probe.backoff(ctx, recovery, d) {
				return
			}
			continue
		}
		bo.Reset()
		s.succeeded(w, r, staleness(w.f, nil))
		pace.burst, pace.interval = 1, minInterval
		if d, self := selfPace(w.f); self { // it switches to and from the node dump
			pace.burst, pace.interval = pacedBurst, d
		}
		pace.answered(time.Now())
		if !pace.wait(ctx) {
			return
		}
	}
}

// sleep waits d, or less if ctx ends first; it reports whether ctx is
// still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Failed requests are retried after a backoff from retryMin up to
// retryMax, per query.
const (
	retryMin = 250 * time.Millisecond
	retryMax = 10 * time.Second
)

func (s *Source) newBackoff() *backoff.Backoff {
	if s.cfg.retry > 0 {
		return backoff.New(s.cfg.retry, s.cfg.retry)
	}
	return backoff.New(retryMin, retryMax)
}

// queryOptions are the options of every read: the datacenter, stale reads,
// and for a blocking query (index > 0) the index and wait. The context
// bounds the request, so a silent network cannot hold a watch forever.
func (s *Source) queryOptions(ctx context.Context, dc string, index uint64) (*api.QueryOptions, context.CancelFunc) {
	timeout := s.cfg.Margin
	q := &api.QueryOptions{Datacenter: dc, AllowStale: s.cfg.Stale}
	if index > 0 {
		q.WaitIndex, q.WaitTime = index, s.cfg.WaitTime
		timeout += s.maxWait()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return q.WithContext(ctx), cancel
}

// maxWait is the longest a blocking query may take to answer: its wait
// and Consul's jitter of up to wait/16.
func (s *Source) maxWait() time.Duration { return s.cfg.WaitTime + s.cfg.WaitTime/16 }

// staleAfter is how long q may go without an answer before the source is
// stale: the longest wait of its requests (a poll's period for the list
// of datacenters) plus the margin.
func (s *Source) staleAfter(q model.Query) time.Duration {
	if q.Kind == model.QueryDatacenters {
		return s.dcPoll + s.cfg.Margin
	}
	return s.maxWait() + s.cfg.Margin
}

// nextIndex is the index to wait on after an answer with index got to a
// query that waited on prev, as Consul advises: start over when the index
// went backwards, and never wait on 0, which would return at once forever.
func nextIndex(prev, got uint64) uint64 {
	switch {
	case got < prev:
		return 0
	case got == 0:
		return 1
	}
	return got
}

// cursor is where a blocking query stands, kept by Consul's rules for
// blocking queries: after a failure read afresh (index 0), since a Consul
// that restarted with less data may never reach the old index again and
// would hold the query until its wait ran out; when an answer's index went
// backwards, start over.
type cursor struct {
	index  uint64 // to wait on; 0 reads at once
	seen   uint64 // the index of the last answer; 0 before the first
	reread bool   // the last request failed
}

// wait is the index the next request waits on.
func (c *cursor) wait() uint64 {
	if c.reread {
		return 0
	}
	return c.index
}

// failed: the next request reads afresh.
func (c *cursor) failed() { c.reread = true }

// answered takes the index of an answer. It reports whether the answer
// can differ from the previous one, and logs an index that went backwards
// (unless s is nil).
func (c *cursor) answered(got uint64, s *Source, what string) (changed bool) {
	changed = c.seen == 0 || got != c.seen
	if c.seen != 0 && got < c.seen && s != nil {
		s.noteReset()
		s.log.Warn("Consul's index went backwards (restarted with less data, or another server answered): starting the query over",
			"query", what, "consul", s.addr(), "from", c.seen, "to", got)
	}
	prev := c.wait()
	if c.seen == 0 {
		// The first answer: to a query seeded with another query's
		// index (seed.go) a lower index is this query's own, not a reset.
		prev = 0
	}
	c.index = nextIndex(prev, got)
	c.seen, c.reread = got, false
	return changed
}
