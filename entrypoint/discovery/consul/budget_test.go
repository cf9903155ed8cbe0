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
func populate(t testing.TB, c *api.Client, n int) {
	t.Helper()
	var ops api.TxnOps
	for i := range min(n, 10) {
		ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet,
			Node: api.Node{Node: fmt.Sprintf("node-%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1)}}})
	}
	for i := range n {
		node, name := fmt.Sprintf("node-%d", i%10), fmt.Sprintf("svc-%d", i)
		ops = append(ops,
			&api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: node,
				Service: api.AgentService{ID: name, Service: name, Port: 8000 + i}}},
			&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: api.HealthCheck{Node: node,
				CheckID: name + "-http", Name: name + "-http", Status: api.HealthPassing, ServiceID: name}}})
	}
	for len(ops) > 0 {
		chunk := ops[:min(len(ops), 64)] // Consul's limit of operations per transaction
		ops = ops[len(chunk):]
		ok, resp, _, err := c.Txn().Txn(chunk, nil)
		if err != nil || !ok {
			t.Fatalf("registering services: %v %+v", err, resp)
		}
	}
}

// setStatus changes the check of service svc-i (registered by populate):
// one write to the catalog.
func setStatus(t testing.TB, c *api.Client, i int, status string) {
	t.Helper()
	register(t, c, fmt.Sprintf("node-%d", i%10), fmt.Sprintf("10.0.0.%d", i%10+1),
		&api.AgentService{ID: fmt.Sprintf("svc-%d", i), Service: fmt.Sprintf("svc-%d", i), Port: 8000 + i},
		check(fmt.Sprintf("svc-%d-http", i), status))
}

func hasStatus(i int, status string) func(model.Snapshot) bool {
	return func(s model.Snapshot) bool {
		in := instances(s, fmt.Sprintf("svc-%d", i))
		return len(in) == 1 && in[0].Status == status
	}
}

// A change to one instance costs the same few requests whether the catalog
// holds 20 services or 200: the one blocking query returns and is issued
// again. Per-service watches would hold 20 or 200 queries open.
func TestRequestBudgetDoesNotGrowWithServices(t *testing.T) {
	cost := map[int]uint64{}
	for _, n := range []int{20, 200} {
		t.Run(fmt.Sprintf("%d services", n), func(t *testing.T) {
			agent := testenv.Consul(t)
			c := agent.Client()
			populate(t, c, n)
			r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && len(s.Local().Instances) == n+1 // and the consul service
			})
			r.steady(1)
			start := r.src.Requests()
			t.Logf("%d requests to read %d services and reach the steady state", start, n)

			setStatus(t, c, n/2, api.HealthCritical)
			r.waitFor("the changed instance", hasStatus(n/2, api.HealthCritical))
			r.steady(1)
			cost[n] = r.src.Requests() - start
			t.Logf("%d services: %d requests for one change", n, cost[n])
		})
	}
	if cost[20] != cost[200] || cost[200] > 2 {
		t.Errorf("requests for one change: %d with 20 services, %d with 200; want the same small constant", cost[20], cost[200])
	}
}

// BenchmarkChange measures what one change to one instance costs: requests
// (constant) and bytes read (the whole catalog: the price of one query).
func BenchmarkChange(b *testing.B) {
	for _, n := range []int{20, 200, 1000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			agent := testenv.Consul(b)
			c := agent.Client()
			populate(b, c, n)
			r := startSource(b, agent.Addr(), Config{}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && len(s.Local().Instances) == n+1
			})
			r.steady(1)
			reqs, bytes := r.src.Requests(), r.src.received.Load()
			status := []string{api.HealthCritical, api.HealthPassing}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				setStatus(b, c, n/2, status[i%2])
				r.waitFor("the change", hasStatus(n/2, status[i%2]))
				r.steady(1)
			}
			b.ReportMetric(float64(r.src.Requests()-reqs)/float64(b.N), "requests/change")
			b.ReportMetric(float64(r.src.received.Load()-bytes)/float64(b.N), "bytes/change")
		})
	}
}
