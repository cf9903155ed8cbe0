package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

const (
	// probeEvery is how often the agent is asked for its leader while
	// every query answers: one small request, so that the source knows
	// within seconds that its agent lost the servers, even while a
	// blocking query in flight waits out its minute.
	probeEvery = 5 * time.Second
	// probeFast is how often while a query is backed off: the agent's
	// return wakes them all within about this long.
	probeFast = time.Second
	// probeTimeout bounds one probe; an agent that takes longer to name
	// its leader is not serving reads either. Once it is down, a probe
	// is bounded by probeFast instead: one that hangs in an agent cut
	// off a moment ago must not delay the next, which may see it back.
	probeTimeout = 3 * time.Second
)

// agentProbe asks the agent the source reads from (the current one, with
// several) for its cluster's leader: a cheap request that a client agent
// can only answer through its servers. While it fails, the source is
// stale (its answers, if any, cannot be newer than the cut). When it
// answers with a leader again, every query backed off after a failure
// is woken: the fleet converges within about probeFast of the agent's
// return, not within the longest backoff. The backoffs themselves stay
// as they are, so an outage costs each query no more retries. If the
// agent could not reach its servers at all (not merely an election, which
// Consul's blocking queries and streams survive), every blocking query
// in flight is also read afresh: it may hang on a connection, or wait on
// a stream, that the cut broke.
type agentProbe struct {
	ask         func(ctx context.Context) error
	log         *slog.Logger
	every, fast time.Duration
	kick        chan struct{} // a query backed off: probe soon

	mu        sync.Mutex
	backedOff int
	down      string    // why the agent cannot serve reads now; "" when it can or while unknown
	downSince time.Time // when down became non-empty
	off       bool      // the agent does not serve the probe's endpoint: probe no more
	// recovered ends at the agent's next return (down to up), and is then
	// replaced; reconnected too, but only after an outage in which the
	// agent could not reach its servers: severed counts the probes that
	// failed so (two at least: one slow answer is no cut).
	recovered   context.Context
	recover     context.CancelFunc
	reconnected context.Context
	reconnect   context.CancelFunc
	severed     int
	// waits are the backoffThen waits that recovered ends: ended from
	// here, by one goroutine, rather than by a callback each on the
	// context (a goroutine each, thousands at once).
	waits map[*backoffWait]struct{}
	// reheld are the held queries that the end of reconnected cuts
	// short (cutAtReconnection).
	reheld map[*heldHealth]struct{}
}

func newAgentProbe(ask func(context.Context) error, log *slog.Logger) *agentProbe {
	p := &agentProbe{ask: ask, log: log, every: probeEvery, fast: probeFast, kick: make(chan struct{}, 1)}
	p.recovered, p.recover = context.WithCancel(context.Background())
	p.reconnected, p.reconnect = context.WithCancel(context.Background())
	return p
}

// recovery returns a context that ends when the agent next comes back.
// Take it before a request: a return during the request then ends it too.
func (p *agentProbe) recovery() context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.recovered
}

// reconnection returns a context that ends when the agent next comes back
// from an outage in which it could not reach its servers: a blocking
// query in flight then reads afresh. Take it before the request.
func (p *agentProbe) reconnection() context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reconnected
}

// backoff waits d after a failure, or less when the agent comes back
// (recovery, taken before the failed request, ends); it reports whether
// ctx is still alive.
func (p *agentProbe) backoff(ctx, recovery context.Context, d time.Duration) bool {
	done := make(chan bool, 1)
	p.backoffThen(ctx, recovery, d, func(goOn bool) { done <- goOn })
	return <-done
}

// backoffThen is backoff with no goroutine waiting: then runs with true
// once the wait is over and with false if ctx ends first, never on the
// caller's goroutine; at the agent's return one goroutine runs every
// wait's then in turn, so then must not block. In an outage every per-service query backs off at
// once, and a goroutine each would hold its stack for as long.
func (p *agentProbe) backoffThen(ctx, recovery context.Context, d time.Duration, then func(goOn bool)) {
	b := &backoffWait{p: p, then: then}
	p.mu.Lock()
	if d <= 0 || recovery.Err() != nil { // no wait, or the agent is back since the request
		p.mu.Unlock()
		go then(ctx.Err() == nil)
		return
	}
	p.backedOff++
	if p.waits == nil {
		p.waits = map[*backoffWait]struct{}{}
	}
	p.waits[b] = struct{}{}
	b.mu.Lock() // until set up: end waits for it
	p.mu.Unlock()
	defer b.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	b.t = time.AfterFunc(d, func() { b.end(true) })
	b.stopC = context.AfterFunc(ctx, func() { b.end(false) })
}

// backoffWait is one backoffThen's wait.
type backoffWait struct {
	p     *agentProbe
	then  func(goOn bool)
	mu    sync.Mutex
	over  bool
	t     *time.Timer
	stopC func() bool
}

// end ends the wait, once: the first caller runs then.
func (b *backoffWait) end(goOn bool) {
	b.mu.Lock()
	if b.over {
		b.mu.Unlock()
		return
	}
	b.over = true
	b.mu.Unlock()
	b.t.Stop()
	b.stopC()
	b.p.mu.Lock()
	delete(b.p.waits, b)
	b.p.backedOff--
	b.p.mu.Unlock()
	b.then(goOn)
}

// stale says why the agent cannot serve reads, and since when; "" while
// it can (or that is not known).
func (p *agentProbe) stale() (string, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down, p.downSince
}

// run probes until ctx ends: every p.every, every p.fast while a query is
// backed off, and at once (at most every p.fast) when one backs off.
func (p *agentProbe) run(ctx context.Context) {
	var last time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		p.mu.Lock()
		every, timeout, off := p.every, probeTimeout, p.off
		if p.backedOff > 0 || p.down != "" {
			every = p.fast
		}
		if p.down != "" {
			timeout = p.fast
		}
		p.mu.Unlock()
		if off {
			return
		}
		t.Reset(max(every-time.Since(last), 0))
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
			t.Stop()
			continue // probe now if the last was long enough ago
		case <-t.C:
		}
		last = time.Now()
		actx, cancel := context.WithTimeout(ctx, timeout)
		err := p.ask(actx)
		cancel()
		p.observe(ctx, err)
	}
}

// observe takes a probe's outcome.
func (p *agentProbe) observe(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var ns notServed
	switch {
	case errors.As(err, &ns):
		p.off, p.down = true, ""
		p.log.Info("the Consul agent does not serve /v1/status/leader (a proxy in front of it?): backed-off queries wait out their backoff, "+
			"and a frozen or cut-off agent is noticed by the queries alone, once their wait (SEAMLESS_CONSUL_QUERY_WAIT) and a margin have passed", "err", err)
	case err != nil:
		if p.down == "" {
			p.downSince = time.Now()
			p.log.Warn("the Consul agent cannot serve reads; the last good data keeps serving", "err", err)
		}
		p.down = err.Error()
		if !errors.As(err, new(noLeader)) {
			p.severed++
		}
	case p.down != "":
		p.log.Info("the Consul agent knows its leader again: retrying every failed query now",
			"was_down", time.Since(p.downSince).Round(100*time.Millisecond), "reread_in_flight", p.severed >= 2)
		p.down = ""
		p.recover()
		p.recovered, p.recover = context.WithCancel(context.Background())
		if waits := p.waits; len(waits) > 0 {
			p.waits = nil
			go func() {
				for b := range waits {
					b.end(true)
				}
			}()
		}
		if p.severed >= 2 {
			p.reconnect()
			p.reconnected, p.reconnect = context.WithCancel(context.Background())
			if held := p.reheld; len(held) > 0 {
				p.reheld = nil
				go cutAll(held)
			}
		}
		p.severed = 0
	}
}

// noLeader: the agent answered, and knows no leader: an election, or
// servers without quorum; its connections to them may be fine.
type noLeader struct{ err error }

func (e noLeader) Error() string { return e.err.Error() }

// notServed: the agent answered the probe, but not as Consul does.
type notServed struct{ err error }

func (e notServed) Error() string { return e.err.Error() }
func (e notServed) Unwrap() error { return e.err }

// askLeader is the probe's question, through client (which must not
// count it with the watches' requests): the leader of the datacenter the
// local catalog reads. ctx bounds it.
func (s *Source) askLeader(client *api.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		leader, err := client.Status().LeaderWithQueryOptions((&api.QueryOptions{Datacenter: s.cfg.Datacenter}).WithContext(ctx))
		var se api.StatusError
		switch {
		case errors.As(err, &se) && (se.Code == http.StatusNotFound || se.Code == http.StatusForbidden || se.Code == http.StatusMethodNotAllowed):
			return notServed{fmt.Errorf("asking %s for its leader: %w", s.addr(), err)}
		case errors.As(err, new(*json.UnmarshalTypeError)) || errors.As(err, new(*json.SyntaxError)):
			return notServed{fmt.Errorf("asking %s for its leader: %w", s.addr(), err)}
		case err != nil:
			return fmt.Errorf("the agent at %s (%s) does not name its leader (/v1/status/leader): %w", s.addr(), s.addrHint, err)
		case leader == "":
			return noLeader{fmt.Errorf("the agent at %s knows no leader (/v1/status/leader): it is cut off from its servers, or they have none", s.addr())}
		}
		return nil
	}
}
