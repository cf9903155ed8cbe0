package consul

import (
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// While the agent is away, every per-service query fails and waits out
// its backoff. A query waiting holds no goroutine, like a held one: one
// each kept its stack, grown by the answer's path, for the whole outage
// (about 9 KiB apiece). Once the agent is back, every query is held
// again, and a change is seen.
func TestQueriesBackingOffHoldNoGoroutine(t *testing.T) {
	const n = 150 // an agent allows 200 connections per client address
	agent := testenv.Consul(t)
	populateK(t, agent.Client(), n, 1)
	r := startSource(t, agent.Addr(), Config{Watches: n + 16}, model.LocalCatalog)
	r.waitFor("every service", func(s model.Snapshot) bool {
		return s.Local() != nil && s.Local().Len() == n+1 // and the consul service
	})
	r.steady(watching(n + 1))
	held := runtime.NumGoroutine()

	agent.Stop()
	testenv.Eventually(t, wait, "status down", func() bool { return !r.src.Status().Up })
	requests := r.src.Requests()
	// About every query has failed twice by then.
	testenv.Eventually(t, wait, "the queries retried", func() bool { return r.src.Requests() >= requests+2*(n+1) })
	most := 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(time.Second); time.Now().Before(end); <-tick.C {
		most = max(most, runtime.NumGoroutine()-held)
	}
	// Those whose backoff just ended are set up again, up to
	// setUpAtOnce at a time.
	if most > n/4 {
		t.Errorf("%d services' queries backing off held up to %d goroutines more than while held, want at most %d", n+1, most, n/4)
	}

	agent.Start()
	r.steady(watching(n + 1))
	register(t, agent.Client(), "node-3", "10.0.0.4", &api.AgentService{ID: "svc-7-b", Service: "svc-7", Port: 9000})
	r.waitFor("svc-7's new instance", func(s model.Snapshot) bool { return len(instances(s, "svc-7")) == 2 })
}
