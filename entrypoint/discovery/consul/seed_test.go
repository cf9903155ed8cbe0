package consul

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// seedReads are the requests a seeded start has answered: the service
// list, the node list and the node dump. Every other query is held.
const seedReads = 3

// answered is how many of the source's requests have answered.
func answered(r *running) uint64 { return r.src.Requests() - r.src.InFlight() }

// A seeded start reads the catalog once (plus the service and node lists)
// and holds one query per service that answers at its service's next
// change, not at once; without the seed, every service's first query
// answers at start.
func TestASeededStartReadsOnceAndHoldsEveryQuery(t *testing.T) {
	const n = 20
	for _, tt := range []struct {
		name   string
		seedAt int
		reads  uint64 // answered at start
	}{{"seeded", 1, seedReads}, {"per service", -1, 2 + n + 1}} {
		t.Run(tt.name, func(t *testing.T) {
			agent := testenv.Consul(t)
			c := agent.Client()
			populate(t, c, n)
			r := startSource(t, agent.Addr(), Config{seedAt: tt.seedAt}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && s.Local().Len() == n+1 // and the consul service
			})
			r.steady(watching(n + 1))
			if got := answered(r); got != tt.reads {
				t.Errorf("%d requests answered at start, want %d", got, tt.reads)
			}
			setCheck(t, c, 3, api.HealthCritical)
			r.waitFor("the change", hasStatus(3, api.HealthCritical))
			r.steady(watching(n + 1))
			if got := answered(r); got != tt.reads+1 {
				t.Errorf("%d requests answered after one change, want %d: the changed service's alone", got, tt.reads+1)
			}
		})
	}
}

// A change made after the seed's read and before the per-service queries
// start is not lost: they wait on the dump's index, which the change's
// index passes.
func TestAChangeBetweenTheSeedAndTheWatchesIsSeen(t *testing.T) {
	const n = 20
	agent := testenv.Consul(t)
	c := agent.Client()
	populate(t, c, n)
	var hookErr atomic.Value
	var seedIndex, changeIndex uint64
	changed := make(chan struct{})
	cfg := Config{seedAt: 1, seeded: func(index uint64) {
		defer close(changed)
		seedIndex = index
		ok, resp, _, err := c.Txn().Txn(api.TxnOps{{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: api.HealthCheck{
			Node: "node-7", CheckID: "svc-7-http", Name: "svc-7-http", Status: api.HealthCritical, ServiceID: "svc-7"}}}}, nil)
		if err != nil || !ok {
			hookErr.Store(fmt.Sprintf("%v %+v", err, resp))
			return
		}
		_, meta, err := c.Health().Service("svc-7", "", false, nil)
		if err != nil {
			hookErr.Store(err.Error())
			return
		}
		changeIndex = meta.LastIndex
	}}
	r := startSource(t, agent.Addr(), cfg, model.LocalCatalog)
	<-changed
	if e := hookErr.Load(); e != nil {
		t.Fatalf("changing svc-7 after the seed: %v", e)
	}
	// The first snapshot may already carry the change (the source passes
	// on only its newest state); the indexes show the seed did not.
	if changeIndex <= seedIndex {
		t.Fatalf("svc-7 changed at index %d, not after the seed's read at %d: the race was not run", changeIndex, seedIndex)
	}
	r.waitFor("the change made between the seed and the watches", hasStatus(7, api.HealthCritical))
	r.steady(watching(n + 1))
	if got := answered(r); got != seedReads+1 {
		t.Errorf("%d requests answered, want %d: the seed and svc-7's query", got, seedReads+1)
	}
}

// A seeded query's first answer may carry an index below the seed's (its
// wait ran out: the service's own index is older than the dump's). That is
// not a reset: the query goes on waiting on its own index rather than
// read afresh, which would make every service answer at once again.
func TestASeededCursorWaitsOnItsServicesIndex(t *testing.T) {
	cur := cursor{index: 100} // seeded from a dump at 100
	if !cur.answered(40, nil, "svc") {
		t.Error("the first answer of a seeded query must be compared with the seed")
	}
	if got := cur.wait(); got != 40 {
		t.Errorf("waits on %d, want 40 (the service's own index)", got)
	}
}

// TestBenchSeededStart measures a catalog's start, seeded from the node
// dump and per service, for SEAMLESS_BENCH_SERVICES (default
// 100,1000,3000) services of 10 instances, each mode on an agent of its
// own: time from start to the whole catalog, requests answered and bytes
// received by then, and requests refused with 429. It runs only with
// SEAMLESS_BENCH=1:
//
//	SEAMLESS_BENCH=1 go test -run TestBenchSeededStart -v ./entrypoint/discovery/consul/
func TestBenchSeededStart(t *testing.T) {
	if os.Getenv("SEAMLESS_BENCH") != "1" {
		t.Skip("a measurement: SEAMLESS_BENCH=1 runs it")
	}
	for _, f := range strings.Split(cmpOr(os.Getenv("SEAMLESS_BENCH_SERVICES"), "100,1000,3000"), ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("SEAMLESS_BENCH_SERVICES: %v", err)
		}
		for _, mode := range []struct {
			name   string
			seedAt int
		}{{"seeded", 1}, {"per service", -1}} {
			t.Run(fmt.Sprintf("%d services × 10, %s", n, mode.name), func(t *testing.T) {
				addr := benchConsul(t)
				populateK(t, benchClient(t, addr), n, 10)
				start := time.Now()
				r := startSource(t, addr, Config{Watches: n + 16, seedAt: mode.seedAt}, model.LocalCatalog)
				for ; ; time.Sleep(time.Millisecond) { // measuring, not synchronising
					if s, m := r.last(); m > 0 && s.Local() != nil && s.Local().Len() == n*10+1 {
						break
					}
					if time.Since(start) > 2*time.Minute {
						t.Fatal("the whole catalog did not arrive")
					}
				}
				took := time.Since(start)
				t.Logf("%d services × 10, %s: whole catalog after %s, %d requests answered, %.0f KiB received, %d refused with 429",
					n, mode.name, took.Round(time.Millisecond), answered(r), float64(r.src.received.Load())/1024,
					strings.Count(r.logged(), "429"))
			})
		}
	}
}

// The seed reads every service of the catalog: it serves a start that
// watches many services, most of those listed.
func TestSeedWhenManyOfTheListedAreWatched(t *testing.T) {
	for _, tt := range []struct {
		name         string
		seedAt       int
		want, listed int
		seed         bool
	}{
		{"a few services", 0, defaultSeedAt - 1, defaultSeedAt - 1, false},
		{"many, all watched", 0, defaultSeedAt, defaultSeedAt, true},
		{"many, half watched", 0, 1000, 2000, true},
		{"many, a few of them watched", 0, 100, 10000, false},
		{"never", -1, 10000, 10000, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &splitCatalog{s: &Source{cfg: Config{seedAt: tt.seedAt}}}
			if got := c.seedWanted(tt.want, tt.listed); got != tt.seed {
				t.Errorf("%d of %d listed: seed %t, want %t", tt.want, tt.listed, got, tt.seed)
			}
		})
	}
}

// The seeded queries' waits run out together, each answering with its
// service's own index, below the dump's: nothing changed since the seed,
// so nothing is converted and no new catalog goes out (at 10,000
// services, a catalog per batch of such answers held every change behind
// a re-render of the whole catalog, 12-25 s).
func TestSeededWaitsRunningOutChangeNothing(t *testing.T) {
	const n = 20
	agent := testenv.Consul(t)
	c := agent.Client()
	populate(t, c, n)
	r := startSource(t, agent.Addr(), Config{seedAt: 1, WaitTime: time.Second}, model.LocalCatalog)
	r.waitFor("every service", func(s model.Snapshot) bool {
		return s.Local() != nil && s.Local().Len() == n+1
	})
	r.steady(watching(n + 1))
	_, sent := r.last()
	testenv.Eventually(t, wait, "every seeded query's wait ran out", func() bool {
		return answered(r) >= seedReads+watching(n+1)
	})
	r.steady(watching(n + 1))
	r.src.mu.Lock()
	split := r.src.watches[model.LocalCatalog].f.(*catalogFetcher).split
	r.src.mu.Unlock()
	if got := split.converted.Load(); got != 0 {
		t.Errorf("%d answers converted, want none: no service changed since the seed", got)
	}
	if got := split.decoded.Load(); got != 0 {
		t.Errorf("%d answers decoded, want none: every one is at or below the seed's index", got)
	}
	if _, now := r.last(); now != sent {
		t.Errorf("%d snapshots after the waits ran out, want %d: nothing changed", now, sent)
	}
}

// With Serving, a seeded start holds its per-service queries until
// HAProxy serves: the seed's answer is passed on, nothing more is asked of
// the agent, and a change made in between is seen once the queries start,
// by its service's query alone.
func TestASeededStartWaitsForHAProxyToServe(t *testing.T) {
	const n = 20
	agent := testenv.Consul(t)
	c := agent.Client()
	populate(t, c, n)
	serving := make(chan struct{})
	r := startSource(t, agent.Addr(), Config{seedAt: 1, Serving: serving}, model.LocalCatalog)
	r.waitFor("every service", func(s model.Snapshot) bool {
		return s.Local() != nil && s.Local().Len() == n+1
	})
	r.steady(watching(0))
	setCheck(t, c, 3, api.HealthCritical)
	// Nothing can show the change until the queries start: the held
	// requests stay those of the service and node lists.
	r.steady(watching(0))
	if snap, _ := r.last(); hasStatus(3, api.HealthCritical)(snap) {
		t.Fatal("the change was seen before HAProxy served")
	}
	if got := answered(r); got != seedReads {
		t.Errorf("%d requests answered before HAProxy served, want the seed's %d", got, seedReads)
	}
	close(serving)
	r.waitFor("the change made while held", hasStatus(3, api.HealthCritical))
	r.steady(watching(n + 1))
	if got := answered(r); got != seedReads+1 {
		t.Errorf("%d requests answered, want %d: the seed's and svc-3's", got, seedReads+1)
	}
}
