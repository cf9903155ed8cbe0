package consul

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// promptly bounds how long the source may take to see a change after
// Consul came back: far less than a blocking query's wait.
const promptly = 10 * time.Second

// catalogIndex is the catalog's current Raft index.
func catalogIndex(t *testing.T, c *api.Client) uint64 {
	t.Helper()
	_, meta, err := c.Catalog().Services(nil)
	if err != nil {
		t.Fatal(err)
	}
	return meta.LastIndex
}

// A Consul that restarts empty starts its Raft index over. The watch,
// which was blocked on the old index when the connection broke, must read
// afresh rather than wait for the new Consul to reach the old index (the
// field test saw nothing for 46 s; with fewer writes, it is forever).
func TestConsulRestartedEmptyIsSeenPromptly(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	for i := range 30 { // one write each: the index climbs well above a new agent's
		register(t, c, fmt.Sprintf("n%d", i), "10.0.0.1", &api.AgentService{ID: fmt.Sprintf("old-%d", i), Service: "old", Port: 80})
	}
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	r.waitFor("30 old instances", func(s model.Snapshot) bool { return len(instances(s, "old")) == 30 })
	r.steady(watching(2)) // old and consul
	before := catalogIndex(t, c)

	agent.Stop()
	agent.Wipe()
	agent.Start()
	register(t, c, "n-new", "10.0.0.2", &api.AgentService{ID: "new-1", Service: "new", Port: 80})
	if after := catalogIndex(t, c); after >= before {
		t.Fatalf("the restarted Consul's index %d did not go below %d: the scenario did not happen", after, before)
	}
	start := time.Now()
	testenv.Eventually(t, promptly, "the empty Consul's catalog seen", func() bool {
		s, n := r.last()
		return n > 0 && len(instances(s, "old")) == 0 && len(instances(s, "new")) == 1
	})
	t.Logf("the restarted Consul's catalog seen %s after the registration", time.Since(start).Round(time.Millisecond))
	// The removal guard holds what a source drops just after it started
	// over: the snapshot with the new data must say so.
	if s, _ := r.last(); s.Reset.Before(start.Add(-promptly)) {
		t.Errorf("the snapshot of the restarted Consul has Reset %v, want the restart's time", s.Reset)
	}
	if !strings.Contains(r.logged(), "index went backwards") {
		t.Errorf("no log line says the index went backwards:\n%s", r.logged())
	}
}

// After a failed request the next one reads at once instead of blocking
// on the old index, which a Consul that lost its data may never reach.
func TestAFailedQueryReadsAfresh(t *testing.T) {
	var (
		mu      sync.Mutex
		indexes []string
	)
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/catalog/services" {
			stubCatalog(w, r)
			return
		}
		mu.Lock()
		n := len(indexes)
		idx := r.URL.Query().Get("index")
		indexes = append(indexes, idx)
		mu.Unlock()
		switch {
		case n == 0:
			w.Header().Set("X-Consul-Index", "100")
			fmt.Fprint(w, `{"s": []}`)
		case n == 1:
			http.Error(w, "connection to the server lost", http.StatusInternalServerError)
		case idx == "" || idx == "0":
			w.Header().Set("X-Consul-Index", "5") // a new, empty Consul
			fmt.Fprint(w, `{}`)
		default:
			<-r.Context().Done() // as Consul does: index 5 is below 100, nothing new
		}
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("s on node a", func(s model.Snapshot) bool { return len(instances(s, "s")) == 1 })
	start := time.Now()
	testenv.Eventually(t, promptly, "the empty catalog after the failure", func() bool {
		s, n := r.last()
		return n > 0 && s.Local() != nil && s.Local().Len() == 0
	})
	t.Logf("seen %s after the first answer", time.Since(start).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	if len(indexes) < 3 || indexes[2] != "" {
		t.Errorf("indexes waited on %q, want a fresh read (no index) after the failure", indexes)
	}
	if !strings.Contains(r.logged(), "index went backwards") {
		t.Errorf("no log line says the index went backwards")
	}
}

// A frozen Consul (SIGSTOP) accepts connections and answers nothing. Within
// its wait plus a margin the source says it is stale (status, log), keeps
// its data, and recovers when Consul wakes up.
func TestFrozenConsulIsReportedStale(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "web-1", Service: "web", Port: 80})
	r := startSource(t, agent.Addr(), Config{WaitTime: time.Second, Margin: time.Second}, model.LocalCatalog)
	r.waitFor("web-1", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	testenv.Eventually(t, promptly, "status up", func() bool { return r.src.Status().Up })
	if st := r.src.Status(); st.Stale {
		t.Fatalf("stale before the freeze: %+v", st)
	}
	_, sent := r.last()

	thaw := agent.Freeze()
	frozen := time.Now()
	testenv.Eventually(t, promptly, "stale reported", func() bool { return r.src.Status().Stale })
	t.Logf("stale %s after the freeze", time.Since(frozen).Round(time.Millisecond))
	st := r.src.Status()
	if st.Up || !strings.Contains(st.StaleReason, agent.Addr()) || !strings.Contains(st.StaleReason, "catalog") {
		t.Errorf("status %+v: want down, and a reason naming the query and Consul's address", st)
	}
	testenv.Eventually(t, promptly, "a warning", func() bool { return strings.Contains(r.logged(), "Consul is stale") })
	if s, n := r.last(); n != sent || len(instances(s, "web")) != 1 {
		t.Errorf("%d snapshots after the freeze (%d before), the last with %d instances: the last good data must stay",
			n, sent, len(instances(s, "web")))
	}

	thaw()
	testenv.Eventually(t, promptly, "fresh and up after SIGCONT", func() bool {
		st := r.src.Status()
		return st.Up && !st.Stale
	})
	register(t, c, "n2", "10.0.0.2", &api.AgentService{ID: "web-2", Service: "web", Port: 80})
	r.waitFor("web-2 after the thaw", func(s model.Snapshot) bool { return len(instances(s, "web")) == 2 })
	if !slices.ContainsFunc(strings.Split(r.logged(), "\n"), func(l string) bool { return strings.Contains(l, "answered again") }) {
		t.Errorf("no log line says the query answers again")
	}
}

// A Consul behind a proxy that stopped forwarding: connections open, no
// answer. The source turns stale within its wait plus the margin, not
// when a 5-minute wait runs out.
func TestASilentConsulIsStaleAfterItsWaitAndMargin(t *testing.T) {
	addr := stub(t, stubCatalog) // answers once, then holds every query
	r := startSource(t, addr, Config{WaitTime: time.Second, Margin: 500 * time.Millisecond}, model.LocalCatalog)
	r.waitFor("s", func(s model.Snapshot) bool { return len(instances(s, "s")) == 1 })
	answered := time.Now()
	testenv.Eventually(t, promptly, "stale", func() bool { return r.src.Status().Stale })
	if d := time.Since(answered); d < time.Second {
		t.Errorf("stale %s after the last answer, before its wait could have ended", d)
	}
	if reason := r.src.Status().StaleReason; !strings.Contains(reason, addr) || !strings.Contains(reason, "catalog") {
		t.Errorf("reason %q does not name the query and Consul's address", reason)
	}
	testenv.Eventually(t, promptly, "a warning", func() bool { return strings.Contains(r.logged(), "Consul is stale") })
	if s, _ := r.last(); len(instances(s, "s")) != 1 {
		t.Error("the last good data is gone")
	}
}

// Unless told otherwise, every blocking query waits Consul's default of
// 5 minutes: at rest, a watched service costs the agent one answer per
// wait, and at a minute those answers were most of what an agent served
// seamless (100 services, one change every 1.5 s). The longer wait hides
// no outage: a frozen agent is reported stale by the probe within
// seconds, the query in flight notwithstanding.
func TestBlockingQueriesWaitConsulsDefault(t *testing.T) {
	agent := testenv.Consul(t)
	register(t, agent.Client(), "n1", "10.0.0.1", &api.AgentService{ID: "web-1", Service: "web", Port: 80})
	proxy := recordPaths(t, agent.Addr(), "")
	r := startSource(t, proxy.url, Config{}, model.LocalCatalog)
	r.waitFor("web-1", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	r.steady(watching(2)) // web and consul

	// A query counts as in flight before its request reaches the proxy.
	paths := []string{"/v1/catalog/services", "/v1/catalog/nodes", "/v1/health/service/web", "/v1/health/service/consul"}
	testenv.Eventually(t, promptly, "a blocking query on each of "+strings.Join(paths, ", "), func() bool {
		proxy.mu.Lock()
		defer proxy.mu.Unlock()
		return !slices.ContainsFunc(paths, func(p string) bool { return len(proxy.waits[p]) == 0 })
	})
	proxy.mu.Lock()
	for path, ws := range proxy.waits {
		for _, w := range ws {
			if d, err := time.ParseDuration(w); err != nil || d != 5*time.Minute {
				t.Errorf("a blocking query on %s waits %q, want Consul's default of 5m", path, w)
			}
		}
	}
	proxy.mu.Unlock()

	thaw := agent.Freeze()
	frozen := time.Now()
	testenv.Eventually(t, 2*(probeEvery+probeTimeout), "stale reported while the queries wait", func() bool {
		return r.src.Status().Stale
	})
	t.Logf("stale %s after the freeze: %s", time.Since(frozen).Round(100*time.Millisecond), r.src.Status().StaleReason)
	if s, _ := r.last(); len(instances(s, "web")) != 1 {
		t.Error("the last good data is gone")
	}
	thaw()
	testenv.Eventually(t, promptly, "fresh again after SIGCONT", func() bool { return !r.src.Status().Stale })
}
