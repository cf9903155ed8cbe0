package consul

import (
	"fmt"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// populate registers n services with one instance each, spread over ten
// nodes, each with a passing check: a few transactions, not n writes.
func populate(t testing.TB, c *api.Client, n int) { populateK(t, c, n, 1) }

// setCheck changes the check of service svc-i (registered by populate),
// and nothing else: one write to the checks table.
func setCheck(t testing.TB, c *api.Client, i int, status string) {
	t.Helper()
	name := fmt.Sprintf("svc-%d", i)
	ok, resp, _, err := c.Txn().Txn(api.TxnOps{{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: api.HealthCheck{
		Node: fmt.Sprintf("node-%d", i%10), CheckID: name + "-http", Name: name + "-http", Status: status, ServiceID: name}}}}, nil)
	if err != nil || !ok {
		t.Fatalf("setting %s's check: %v %+v", name, err, resp)
	}
}

func hasStatus(i int, status string) func(model.Snapshot) bool {
	return func(s model.Snapshot) bool {
		in := instances(s, fmt.Sprintf("svc-%d", i))
		return len(in) == 1 && in[0].Status == status
	}
}

// A change to one instance's check costs the same requests and bytes
// whether the catalog holds 20 services or 100: the changed service's
// health query answers and is issued again; nothing else moves (the node
// dump would send the whole catalog).
func TestACheckChangeCostsTheSameAtAnySize(t *testing.T) {
	type cost struct{ requests, bytes uint64 }
	costs := map[int]cost{}
	for _, n := range []int{20, 100} {
		t.Run(fmt.Sprintf("%d services", n), func(t *testing.T) {
			agent := testenv.Consul(t)
			c := agent.Client()
			populate(t, c, n)
			r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && s.Local().Len() == n+1 // and the consul service
			})
			r.steady(watching(n + 1))
			// The first change to a service moves its query onto the agent's
			// streaming view; measure the ones after.
			setCheck(t, c, 10, api.HealthWarning)
			r.waitFor("the first change", hasStatus(10, api.HealthWarning))
			r.steady(watching(n + 1))
			start, bytes := r.src.Requests(), r.src.received.Load()
			const changes = 4
			for i := range changes {
				status := []string{api.HealthCritical, api.HealthPassing}[i%2]
				setCheck(t, c, 10, status)
				r.waitFor("the changed instance", hasStatus(10, status))
				r.steady(watching(n + 1))
			}
			costs[n] = cost{(r.src.Requests() - start) / changes, (r.src.received.Load() - bytes) / changes}
			t.Logf("%d services: %d requests and %d bytes received per check change", n, costs[n].requests, costs[n].bytes)
		})
	}
	small, large := costs[20], costs[100]
	if small.requests != large.requests || large.requests > 2 {
		t.Errorf("requests per change: %d with 20 services, %d with 100; want the same small constant", small.requests, large.requests)
	}
	if large.bytes > small.bytes+256 || large.bytes > 4096 {
		t.Errorf("bytes per change: %d with 20 services, %d with 100; want the same, one service's health", small.bytes, large.bytes)
	}
}

// BenchmarkChange measures what one change to one instance costs: requests
// and bytes read, per service (under the default budget).
func BenchmarkChange(b *testing.B) {
	for _, n := range []int{20, 100} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			agent := testenv.Consul(b)
			c := agent.Client()
			populate(b, c, n)
			r := startSource(b, agent.Addr(), Config{}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && s.Local().Len() == n+1
			})
			r.steady(watching(n + 1))
			reqs, bytes := r.src.Requests(), r.src.received.Load()
			status := []string{api.HealthCritical, api.HealthPassing}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				setCheck(b, c, n/2, status[i%2])
				r.waitFor("the change", hasStatus(n/2, status[i%2]))
				r.steady(watching(n + 1))
			}
			b.ReportMetric(float64(r.src.Requests()-reqs)/float64(b.N), "requests/change")
			b.ReportMetric(float64(r.src.received.Load()-bytes)/float64(b.N), "bytes/change")
		})
	}
}
