package consul

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Name is the source's name in snapshots and status.
const Name = "consul"

const (
	// DefaultWaitTime is how long a blocking query waits for a change:
	// Consul's own default. Every watched service's query is answered
	// and sent again once per wait while nothing changes, which at a
	// minute (consul-template's) was most of the requests an agent
	// served seamless at 100 services × 10 instances, one change every
	// 1.5 s. The probe, not the wait, notices a frozen or cut-off agent
	// within seconds.
	DefaultWaitTime = 5 * time.Minute
	// DefaultMargin is how much longer than its wait a request may take.
	DefaultMargin = 15 * time.Second
	// maxWaitTime is Consul's own limit: it caps longer waits silently.
	maxWaitTime = 10 * time.Minute
)

// Config is the Consul source's configuration. Where Consul reads its own
// environment variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN,
// CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT, CONSUL_HTTP_SSL, ...), they apply.
type Config struct {
	// TagFilter: report only instances that carry this tag; "" reports
	// every instance.
	TagFilter string
	// Wanted, when set, says which services of a catalog are used, from
	// the service's name and the union of its instances' tags (what
	// /v1/catalog/services lists): the others get no query, are left out
	// of the catalog, and do not count against Watches. It is asked again
	// whenever the list changes (a tag added or removed moves it), so it
	// must depend on nothing else. nil: every service.
	Wanted func(name string, tags []string) bool
	// Datacenter replaces the agent's own datacenter for every query that
	// names none (the local catalog, KV); "" keeps the agent's.
	Datacenter string
	// Stale lets any Consul server answer, not only the leader: for many
	// load-balancer replicas, at the price of data a little behind.
	Stale bool
	// WaitTime is how long a blocking query waits for a change before it
	// is issued again; 0 means DefaultWaitTime. Consul caps it at 10m.
	WaitTime time.Duration
	// Margin is how much longer than its wait (and Consul's jitter of up
	// to wait/16) a request may take: its deadline, and past it without an
	// answer the source is stale. 0 means DefaultMargin; tests shorten it.
	Margin time.Duration
	// Watches is the budget of blocking queries (HTTP connections) the
	// catalog of one datacenter may hold: one per watched service plus
	// two. A catalog with more services to watch is read with one query
	// on the node dump.
	// 0 means DefaultWatches.
	Watches int
	// MaxStale bounds how far behind its leader the server answering may
	// be (Consul's X-Consul-LastContact), and refuses answers from a
	// server that knows no leader: such an answer is not used, the source
	// is stale, and the query is retried. 0: no bound.
	MaxStale time.Duration
	// Agents lists the Consul agents to use, in order of preference,
	// "host:port" or "http(s)://host:port": requests go to the first that
	// can be reached, and back to the first once it answers again. Empty:
	// the one agent of API (CONSUL_HTTP_ADDR).
	Agents []string
	// probe is how often the preferred agent is probed while another
	// serves; 0 means DefaultProbe. Tests shorten it.
	probe time.Duration
	// Serving, when set, holds the per-service queries of a seeded start
	// until it is closed (once HAProxy serves its first configuration):
	// HAProxy's first start then has the machine to itself, not shared
	// with the agent setting up a view per service (at 10,000 services
	// that start took 8 s, against 2.2 alone). Nothing is lost: the
	// queries wait on the seed's index, which any change since passes.
	Serving <-chan struct{}
	// seedAt is how many watched services make a per-service catalog
	// take its first answer from one read of the node dump (seed.go); 0
	// means defaultSeedAt, negative never. Tests set it.
	seedAt int
	// seeded, when set, is called with the dump's index once the seed's
	// read returned and before the per-service queries start. Tests set
	// it.
	seeded func(index uint64)
	// retry, when set, is every retry's backoff (with jitter: half to
	// all of it) instead of retryMin growing to retryMax. Tests set it.
	retry time.Duration
	// API is the base of the client's configuration; nil means
	// api.DefaultConfig(), which reads Consul's environment variables.
	// It is copied, not changed.
	API *api.Config
}

// Source is the Consul source. Create it with New; Want and Status may be
// called at any time, from any goroutine.
type Source struct {
	cfg    Config
	log    *slog.Logger
	client *api.Client
	// request is what the client adds to a request, and conns its
	// transport for plain HTTP (nil otherwise): held health queries
	// (held.go) are written without the client.
	request *agentRequest
	http    *http.Client // the client's: counted, failed over, fresh
	// plainDump: the node dump is asked for without gzip (onThisMachine).
	plainDump bool
	conns     *connTransport
	addr0     string // scheme://host:port of the one agent, for messages
	// agents moves requests between several agents; nil with one.
	agents *failoverTransport
	// holdsAll: conns serves every agent (none is reached through a
	// proxy), so that a held query may move between them; learnt once.
	holdsAll     bool
	holdsAllOnce sync.Once
	// probe asks the agent for its leader, and wakes backed-off queries
	// when it is back.
	probe *agentProbe
	// addrHint says where addr came from, for messages.
	addrHint string

	// started counts requests sent, finished those answered (or failed),
	// received the bytes of the answers' bodies.
	started, finished, received atomic.Uint64
	// viewChecks counts the checks of agents' views against the servers,
	// by outcome (viewcheck.go).
	viewChecks [len(ViewCheckOutcomes)]atomic.Uint64

	// changed wakes Run when an answer or the wanted set changed.
	changed chan struct{}

	// dcPoll is how often the datacenter list is read.
	dcPoll time.Duration

	mu      sync.Mutex
	want    map[model.Query]bool
	watches map[model.Query]*watch
	results map[model.Query]model.Result
	// tried: queries whose watch has made its first attempt, so the first
	// snapshot waits for every query to be answered or to fail once.
	tried   map[model.Query]bool
	failing map[model.Query]bool
	// version counts the changes to results, so Run sees a change without
	// comparing catalogs.
	version uint64
	status  model.SourceStatus
	// resetAt is when a query last saw Consul's index go backwards
	// (model.Snapshot.Reset).
	resetAt time.Time
	runCtx  context.Context // nil unless Run is running
	wg      sync.WaitGroup  // the watches Run started
}

var (
	_ model.Source   = (*Source)(nil)
	_ model.Wanter   = (*Source)(nil)
	_ model.Reporter = (*Source)(nil)
)

// New returns a Consul source. Configuration errors (an invalid wait time,
// CONSUL_HTTP_ADDR with an unknown scheme, unreadable TLS files) are
// returned here; Run retries everything else. log may be nil.
func New(cfg Config, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "discovery", "source", Name)
	switch {
	case cfg.WaitTime < 0:
		return nil, fmt.Errorf("consul: wait time %s is negative", cfg.WaitTime)
	case cfg.WaitTime > maxWaitTime:
		return nil, fmt.Errorf("consul: wait time %s is longer than Consul's limit of %s", cfg.WaitTime, maxWaitTime)
	case cfg.WaitTime == 0:
		cfg.WaitTime = DefaultWaitTime
	}
	switch {
	case cfg.Margin < 0:
		return nil, fmt.Errorf("consul: margin %s is negative", cfg.Margin)
	case cfg.Margin == 0:
		cfg.Margin = DefaultMargin
	}

	switch {
	case cfg.Watches < 0:
		return nil, fmt.Errorf("consul: budget of %d watches is negative", cfg.Watches)
	case cfg.Watches == 0:
		cfg.Watches = DefaultWatches
	}

	if cfg.MaxStale < 0 {
		return nil, fmt.Errorf("consul: maximum staleness %s is negative", cfg.MaxStale)
	}
	if cfg.probe <= 0 {
		cfg.probe = DefaultProbe
	}

	var ac api.Config
	if cfg.API != nil {
		ac = *cfg.API
	} else {
		ac = *api.DefaultConfig()
	}
	var hosts []string
	if len(cfg.Agents) > 0 {
		var scheme string
		var err error
		if hosts, scheme, err = parseAgents(cfg.Agents); err != nil {
			return nil, err
		}
		// Two ways to name the agent that disagree: say so rather than
		// pick one silently.
		if env := os.Getenv(api.HTTPAddrEnvName); env != "" && cfg.API == nil &&
			strings.TrimPrefix(strings.TrimPrefix(env, "http://"), "https://") != hosts[0] {
			return nil, fmt.Errorf("consul: %s=%q and the list of agents %q disagree on the preferred agent: unset %s, or list it first",
				api.HTTPAddrEnvName, env, strings.Join(cfg.Agents, ","), api.HTTPAddrEnvName)
		}
		ac.Address, ac.Scheme = hosts[0], scheme
	}
	if ac.HttpClient != nil {
		hc := *ac.HttpClient // counting must not change the caller's client
		ac.HttpClient = &hc
	}
	client, err := api.NewClient(&ac)
	if err != nil {
		return nil, fmt.Errorf("consul: client for %s: %w", ac.Address, err)
	}
	s := &Source{
		cfg:     cfg,
		log:     log,
		client:  client,
		addr0:   ac.Scheme + "://" + ac.Address,
		changed: make(chan struct{}, 1),
		dcPoll:  30 * time.Second,
		want:    map[model.Query]bool{},
		watches: map[model.Query]*watch{},
		results: map[model.Query]model.Result{},
		tried:   map[model.Query]bool{},
		failing: map[model.Query]bool{},
		status:  model.SourceStatus{Name: Name},
	}
	switch env := os.Getenv(api.HTTPAddrEnvName); {
	case len(hosts) > 1:
		s.addrHint = "the current one of the agents " + strings.Join(hosts, ", ")
	case cfg.API != nil && cfg.API.Address != env:
		s.addrHint = "as configured"
	case env != "":
		s.addrHint = "from " + api.HTTPAddrEnvName
	default:
		s.addrHint = "the default; set " + api.HTTPAddrEnvName + " to change it"
	}
	// NewClient has set ac.HttpClient (its own, or one for a unix socket);
	// the client uses that very *http.Client, so counting wraps it here.
	next := ac.HttpClient.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	// Every blocking query that returns is issued again at once: with
	// fewer idle connections kept than queries held (Go's default is 2,
	// the client's pooled transport GOMAXPROCS+1), each would open a new
	// TCP connection. connTransport holds each query on its caller's
	// goroutine alone; the http.Transport serves what it does not
	// (requests through a proxy).
	if t, ok := next.(*http.Transport); ok {
		t = holdingTransport(t, cfg.Watches+16) // and the KV watches
		if len(hosts) > 1 {
			t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
		}
		s.conns = newConnTransport(t, cfg.Watches+16)
		next = s.conns
	}
	if len(hosts) > 1 {
		s.agents = &failoverTransport{next: next, scheme: ac.Scheme, hosts: hosts, probe: cfg.probe, log: log}
		next = s.agents
	}
	// The probe's requests are not the watches': not counted with them,
	// nor refused as stale (a leader is all it asks for).
	pc := ac
	pc.HttpClient = &http.Client{Transport: next}
	probeClient, err := api.NewClient(&pc)
	if err != nil {
		return nil, fmt.Errorf("consul: client for %s: %w", ac.Address, err)
	}
	s.probe = newAgentProbe(s.askLeader(probeClient), log)
	next = &freshnessTransport{next: next, bound: cfg.MaxStale}
	ac.HttpClient.Transport = &countingTransport{next: next, started: &s.started, finished: &s.finished, received: &s.received}
	s.request = newAgentRequest(&ac)
	s.http = ac.HttpClient
	s.plainDump = onThisMachine([]string{ac.Address})
	if s.agents != nil {
		s.plainDump = onThisMachine(s.agents.hosts)
	}
	return s, nil
}

// addr is the agent requests go to now, scheme://host:port, for messages.
func (s *Source) addr() string {
	if s.agents != nil {
		return s.agents.current()
	}
	return s.addr0
}

// Name is "consul".
func (s *Source) Name() string { return Name }

// Want replaces the set of queries the source answers: watches start for
// new queries and stop for the ones no longer wanted, whose answers leave
// the next snapshot. It does not block. Queries of an unknown kind are
// ignored (and logged).
func (s *Source) Want(queries []model.Query) {
	want := make(map[model.Query]bool, len(queries))
	for _, q := range queries {
		switch q.Kind {
		case model.QueryCatalog, model.QueryKey, model.QueryPrefix, model.QueryDatacenters:
			want[q] = true
		default:
			s.log.Warn("ignoring a query of an unknown kind", "query", q.String())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want = want
	for q := range s.results {
		if !want[q] {
			delete(s.results, q)
			s.version++
		}
	}
	if s.runCtx != nil {
		s.syncWatchesLocked()
	}
	s.signal()
}

// syncWatchesLocked starts a watch for each wanted query without one and
// stops those no longer wanted. s.mu is held and Run is running.
func (s *Source) syncWatchesLocked() {
	for q, w := range s.watches {
		if !s.want[q] {
			w.cancel()
			delete(s.watches, q)
			delete(s.tried, q)
			delete(s.failing, q)
		}
	}
	for q := range s.want {
		if s.watches[q] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(s.runCtx)
		w := &watch{q: q, cancel: cancel, f: s.newFetcher(q), answered: time.Now()}
		s.watches[q] = w
		s.wg.Go(func() { s.runWatch(ctx, w) })
	}
}

// signal wakes Run without ever blocking.
func (s *Source) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Run answers the wanted queries until ctx ends, following the contract of
// model.Source: the first snapshot once every wanted query has been
// answered or has failed once, then one per change, only the newest when
// out is slow. It must not run twice at the same time.
func (s *Source) Run(ctx context.Context, out chan<- model.Snapshot) {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		s.log.Error("Run called while already running; ignoring the second call")
		return
	}
	s.runCtx = ctx
	s.syncWatchesLocked()
	if s.agents != nil {
		s.wg.Go(func() { s.agents.run(ctx) })
	}
	s.wg.Go(func() { s.probe.run(ctx) })
	s.mu.Unlock()
	defer s.stop()
	s.signal()

	var (
		sent     bool
		last     uint64 // the version last sent
		pending  model.Snapshot
		pendingV uint64
		outc     chan<- model.Snapshot // out while pending waits, else nil
	)
	tick := time.NewTicker(min(max(s.cfg.Margin/4, 50*time.Millisecond), 5*time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.checkStale(time.Now())
		case <-s.changed:
			snap, v, ready := s.snapshot(sent)
			if !ready {
				continue
			}
			if sent && v == last {
				pending, outc = model.Snapshot{}, nil // back to what out has
				continue
			}
			pending, pendingV, outc = snap, v, out
		case outc <- pending:
			last, sent = pendingV, true
			pending, outc = model.Snapshot{}, nil
		}
	}
}

// stop ends every watch and waits for them.
func (s *Source) stop() {
	s.mu.Lock()
	for q, w := range s.watches {
		w.cancel()
		delete(s.watches, q)
	}
	clear(s.tried)
	clear(s.failing)
	s.runCtx = nil
	s.mu.Unlock()
	s.wg.Wait()
}

// noteReset records that Consul started over with less data, for the
// snapshots that follow (model.Snapshot.Reset). It is called before the
// answer that showed it is stored, so no snapshot carries the new data
// without it.
func (s *Source) noteReset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetAt = time.Now()
}

// snapshot copies the current answers, with their version. Before the
// first send it is ready only once every wanted query has been tried.
func (s *Source) snapshot(sent bool) (model.Snapshot, uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sent {
		for q := range s.want {
			if !s.tried[q] {
				return model.Snapshot{}, 0, false
			}
		}
	}
	res := make(map[model.Query]model.Result, len(s.results))
	for q, r := range s.results {
		res[q] = r
	}
	return model.Snapshot{Source: Name, Results: res, Reset: s.resetAt}, s.version, true
}
