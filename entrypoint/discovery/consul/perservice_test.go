package consul

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// registerVaried registers a catalog with every shape convertDump knows:
// several nodes with meta and tagged addresses, a failing serfHealth-like
// node check, node maintenance, service maintenance, tags, meta, tagged
// addresses, weights, a service without an address, two services on one
// node sharing a node check.
func registerVaried(t *testing.T, c *api.Client) {
	t.Helper()
	regs := []*api.CatalogRegistration{
		{Node: "node-a", Address: "10.0.0.1", NodeMeta: map[string]string{"rack": "r1", "zone": "z1"},
			TaggedAddresses: map[string]string{"wan": "192.0.2.1", "lan": "10.0.0.1"},
			Service: &api.AgentService{ID: "web-1", Service: "web", Port: 8001, Tags: []string{"v1", "lb"},
				Meta: map[string]string{"version": "1"}, Weights: api.AgentWeights{Passing: 10, Warning: 2},
				TaggedAddresses: map[string]api.ServiceAddress{"wan": {Address: "192.0.2.1", Port: 80}, "lan_ipv4": {Address: "10.0.0.1"}}},
			Checks: api.HealthChecks{
				{CheckID: "web-1-http", Name: "http", Status: api.HealthPassing, ServiceID: "web-1", ServiceName: "web", Output: "200 OK"},
				{CheckID: "node-a-disk", Name: "disk", Status: api.HealthWarning, Notes: "80% full"}}},
		{Node: "node-a", Address: "10.0.0.1", NodeMeta: map[string]string{"rack": "r1", "zone": "z1"},
			TaggedAddresses: map[string]string{"wan": "192.0.2.1", "lan": "10.0.0.1"},
			Service:         &api.AgentService{ID: "db-1", Service: "db", Port: 5432, Address: "10.0.0.99", Tags: []string{"primary"}}},
		{Node: "node-b", Address: "10.0.0.2", NodeMeta: map[string]string{"rack": "r2"},
			Service: &api.AgentService{ID: "web-2", Service: "web", Port: 8002, Tags: []string{"v2", "lb"}},
			Checks:  api.HealthChecks{{CheckID: "serfHealth", Name: "Serf Health Status", Status: api.HealthCritical, Output: "Agent not live"}}},
		{Node: "node-c", Address: "10.0.0.3",
			Service: &api.AgentService{ID: "web-3", Service: "web", Port: 8003, Tags: []string{"lb"}},
			Checks:  api.HealthChecks{{CheckID: "_node_maintenance", Name: "Node Maintenance Mode", Status: api.HealthCritical, Notes: "reboot"}}},
		{Node: "node-d", Address: "10.0.0.4",
			Service: &api.AgentService{ID: "api-1", Service: "api", Port: 9000, Weights: api.AgentWeights{Passing: 3, Warning: 1}},
			Checks:  api.HealthChecks{{CheckID: "_service_maintenance:api-1", Name: "Service Maintenance Mode", Status: api.HealthCritical, ServiceID: "api-1", ServiceName: "api"}}},
		{Node: "node-d", Address: "10.0.0.4",
			Service: &api.AgentService{ID: "api-2", Service: "api", Port: 9001, Tags: []string{"lb"}}},
		{Node: "node-e", Address: "10.0.0.5"}, // a node without services
	}
	for _, reg := range regs {
		for _, ch := range reg.Checks {
			ch.Node = reg.Node
		}
		if _, err := c.Catalog().Register(reg, nil); err != nil {
			t.Fatalf("registering %+v: %v", reg, err)
		}
	}
}

// The catalog assembled from the per-service health queries is the node
// dump's, field for field and in the same order, on the same real Consul.
func TestPerServiceCatalogIsTheNodeDump(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	registerVaried(t, c)
	for _, tt := range []struct {
		tag      string
		services int // watched
		seedAt   int
	}{{"", 4, -1}, {"lb", 2, -1}, {"", 4, 1}, {"lb", 2, 1}} {
		tag := tt.tag
		t.Run(fmt.Sprintf("tag filter %q, seeded %t", tag, tt.seedAt > 0), func(t *testing.T) {
			r := startSource(t, agent.Addr(), Config{TagFilter: tag, seedAt: tt.seedAt}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool { return len(instances(s, "web")) == 3 })
			var got, want *model.Catalog
			testenv.Eventually(t, wait, "the same catalog as the node dump", func() bool {
				var dump []*nodeInfo
				if _, err := c.Raw().Query(nodeDumpPath, &dump, nil); err != nil {
					t.Fatal(err)
				}
				want = convertDump(dump, "dc1", tag)
				s, _ := r.last()
				if got = s.Local(); got == nil {
					return false
				}
				return reflect.DeepEqual(flat(got), flat(want)) // the dump's own index is not read here
			})
			if t.Failed() {
				t.Logf("per service:\n%+v\nnode dump:\n%+v", got, want)
			}
			r.steady(watching(tt.services)) // per service, not the dump
			if answered := r.src.Requests() - r.src.InFlight(); tt.seedAt > 0 && answered != seedReads {
				t.Errorf("%d requests answered, want %d: the catalog compared is not the seed's alone", answered, seedReads)
			}
		})
	}
}

// Over the budget of blocking queries the catalog is read with the node
// dump, logged once; back under it (with room to spare), per service again.
// Neither switch drops anything from a snapshot.
func TestTheBudgetSwitchesToTheNodeDumpAndBack(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "s-0", Service: "s-0", Port: 1000})
	r := startSource(t, agent.Addr(), Config{Watches: 5}, model.LocalCatalog)
	r.waitFor("s-0", func(s model.Snapshot) bool { return len(instances(s, "s-0")) == 1 })
	r.steady(watching(2)) // s-0 and consul: 4 of 5

	var ops api.TxnOps // at once, so that the warning sees all of them
	for i := 1; i < 8; i++ {
		ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: "n1",
			Service: api.AgentService{ID: fmt.Sprintf("s-%d", i), Service: fmt.Sprintf("s-%d", i), Port: 1000 + i}}})
	}
	if ok, resp, _, err := c.Txn().Txn(ops, nil); err != nil || !ok {
		t.Fatalf("registering seven services: %v %+v", err, resp)
	}
	r.waitFor("eight services", func(s model.Snapshot) bool { return len(instances(s, "s-7")) == 1 })
	r.steady(1) // the node dump alone
	if n := strings.Count(r.logged(), "more than the budget"); n != 1 {
		t.Errorf("%d warnings about the budget, want 1:\n%s", n, r.logged())
	}
	for _, want := range []string{"9 services", "budget of 5", "SEAMLESS_CONSUL_WATCHES", "http_max_conns_per_client"} {
		if !strings.Contains(r.logged(), want) {
			t.Errorf("the warning does not say %q", want)
		}
	}
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "s-3", Service: "s-3", Port: 2003})
	r.waitFor("a change read from the dump", func(s model.Snapshot) bool {
		in := instances(s, "s-3")
		return len(in) == 1 && in[0].Port == 2003
	})

	for i := 2; i < 8; i++ { // down to 3 services (s-0, s-1, consul): 5 queries, not under 5-1
		deregister(t, c, "n1", fmt.Sprintf("s-%d", i))
	}
	r.waitFor("three services", func(s model.Snapshot) bool { return len(instances(s, "s-7")) == 0 })
	r.steady(1)
	if strings.Contains(r.logged(), "fits the budget") {
		t.Error("switched back at the budget itself: no room to spare")
	}
	deregister(t, c, "n1", "s-1")
	r.waitFor("two services", func(s model.Snapshot) bool { return len(instances(s, "s-1")) == 0 })
	r.steady(watching(2))
	if n := strings.Count(r.logged(), "fits the budget"); n != 1 {
		t.Errorf("%d notes about the switch back, want 1", n)
	}
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "s-0", Service: "s-0", Port: 3000})
	r.waitFor("a change read per service", func(s model.Snapshot) bool {
		in := instances(s, "s-0")
		return len(in) == 1 && in[0].Port == 3000
	})

	for i, s := range r.history() {
		if len(instances(s, "s-0")) != 1 || len(instances(s, "consul")) != 1 {
			t.Errorf("snapshot %d lacks s-0 or consul: a switch dropped data", i)
		}
	}
}

// connsTo counts the TCP connections to port on 127.0.0.1 on this machine
// in state (01 established, 06 time-wait: closed by this side).
func connsTo(t *testing.T, port, state string) int {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	p, _ := strconv.Atoi(port)
	want := fmt.Sprintf("0100007F:%04X", p)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 3 && fs[2] == want && fs[3] == state {
			n++
		}
	}
	return n
}

// Against an agent with its default limit of 200 connections per client
// address, the default budget keeps every request answered: 100 services
// are watched per service, each held query one reused connection; 250 are
// read with the node dump.
func TestADefaultAgentServesTheDefaultBudget(t *testing.T) {
	for _, tt := range []struct {
		services int
		watches  uint64
	}{{100, watching(101)}, {250, 1}} {
		t.Run(fmt.Sprintf("%d services", tt.services), func(t *testing.T) {
			agent := testenv.Consul(t)
			c := agent.Client()
			populate(t, c, tt.services)
			r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && s.Local().Len() == tt.services+1
			})
			r.steady(tt.watches)
			_, port, _ := strings.Cut(agent.Addr(), ":")
			before, closed := connsTo(t, port, "01"), connsTo(t, port, "06")
			for i := range 5 {
				setCheck(t, c, i, []string{api.HealthCritical, api.HealthPassing}[i%2])
				r.waitFor("the change", hasStatus(i, []string{api.HealthCritical, api.HealthPassing}[i%2]))
			}
			// A node check wakes the queries of every service on the node
			// at once: all their connections are idle together.
			ok, resp, _, err := c.Txn().Txn(api.TxnOps{{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: api.HealthCheck{
				Node: "node-1", CheckID: "node-1-disk", Name: "disk", Status: api.HealthWarning}}}}, nil)
			if err != nil || !ok {
				t.Fatalf("node check: %v %+v", err, resp)
			}
			r.waitFor("the node check", func(s model.Snapshot) bool {
				return len(instances(s, "svc-1")) == 1 && instances(s, "svc-1")[0].Status == api.HealthWarning
			})
			r.steady(tt.watches)
			after, reopened := connsTo(t, port, "01"), connsTo(t, port, "06")-closed
			t.Logf("%d services: %d blocking queries, %d connections established to the agent before 6 changes, %d after, %d closed meanwhile",
				tt.services, tt.watches, before, after, reopened)
			if reopened > 0 {
				t.Errorf("%d connections closed by 6 changes: a re-issued query must reuse its connection", reopened)
			}
			// The test's own client keeps a few idle connections too.
			if limit := int(tt.watches) + 8; after > limit {
				t.Errorf("%d connections to the agent for %d queries", after, tt.watches)
			}
			if strings.Contains(r.logged(), "query failed") {
				t.Errorf("requests failed:\n%s", r.logged())
			}
		})
	}
}

// A service that changes again right after a change is read again at
// once, not after a pause: a change written after that second one, to
// another service, does not overtake it. (A pause after every answer held
// the second change up to minInterval while the other service's passed.)
func TestASecondChangeIsNotHeldBehindAnotherService(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "a", Service: "a", Port: 1})
	register(t, c, "n2", "10.0.0.2", &api.AgentService{ID: "b", Service: "b", Port: 1})
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	r.waitFor("a and b", func(s model.Snapshot) bool { return len(instances(s, "a")) == 1 && len(instances(s, "b")) == 1 })
	r.steady(watching(3)) // a, b and consul
	port := func(s model.Snapshot, name string) int {
		if in := instances(s, name); len(in) == 1 {
			return in[0].Port
		}
		return 0
	}
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "a", Service: "a", Port: 2})
	r.waitFor("a's first change", func(s model.Snapshot) bool { return port(s, "a") == 2 })
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "a", Service: "a", Port: 3})
	register(t, c, "n2", "10.0.0.2", &api.AgentService{ID: "b", Service: "b", Port: 3})
	r.waitFor("both changes", func(s model.Snapshot) bool { return port(s, "a") == 3 && port(s, "b") == 3 })
	for _, s := range r.history() {
		if port(s, "b") == 3 {
			if port(s, "a") != 3 {
				t.Errorf("b's change was passed on before a's second change, written first: a at port %d", port(s, "a"))
			}
			break
		}
	}
}

// The service list is paced after every answer, unlike a service's health
// (queryBurst): a burst of new services costs Consul one list query per
// pause, not one per registration. With a burst for the list too,
// seamless moved 1.8 KiB per change at 1000 × 10 against 1.4-1.5.
func TestTheServiceListPausesAfterEveryAnswer(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n0", "10.0.0.1", &api.AgentService{ID: "s0", Service: "s0", Port: 1})
	proxy := recordPaths(t, agent.Addr(), "")
	r := startSource(t, proxy.url, Config{}, model.LocalCatalog)
	r.waitFor("s0", func(s model.Snapshot) bool { return len(instances(s, "s0")) == 1 })
	r.steady(watching(2)) // s0 and consul
	const list = "/v1/catalog/services"
	before := len(proxy.times(list))
	// A burst of changes to the list (s1's tags) longer than two pauses,
	// as fast as the agent takes them: three list requests at least. A
	// dozen new services took less than one on a fast agent.
	n := 0
	for start := time.Now(); time.Since(start) < 3*minInterval && n < 1000; {
		n++
		register(t, c, "n1", "10.0.0.2", &api.AgentService{ID: "s1", Service: "s1", Port: 1, Tags: []string{"v" + strconv.Itoa(n)}})
	}
	last := "v" + strconv.Itoa(n)
	r.waitFor("s1's last tags", func(s model.Snapshot) bool {
		in := instances(s, "s1")
		return len(in) == 1 && slices.Equal(in[0].Tags, []string{last})
	})
	r.steady(watching(3))
	// From the request held when the burst began: the pacer holds each
	// next request at least minInterval after the answer before it.
	at := proxy.times(list)[max(before-1, 0):]
	if len(at) < 3 {
		t.Fatalf("%d service-list requests during %d registrations: the test shows nothing", len(at), n)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < minInterval {
			t.Errorf("service-list request %d came %s after the one before, want at least %s", i, gap, minInterval)
		}
	}
	t.Logf("%d service-list requests for %d changes", len(at)-1, n)
}
