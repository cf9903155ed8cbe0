package consul

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// webPorts are the ports of service web's instances in s.
func webPorts(s model.Snapshot) []int {
	var ports []int
	for _, in := range instances(s, "web") {
		ports = append(ports, in.Port)
	}
	slices.Sort(ports)
	return ports
}

func webAt(port int) func(model.Snapshot) bool {
	return func(s model.Snapshot) bool { return slices.Equal(webPorts(s), []int{port}) }
}

// TestFailoverToTheNextAgent: the first agent listed does not answer, so
// the catalog comes from the second, and the log names both.
func TestFailoverToTheNextAgent(t *testing.T) {
	live := testenv.Consul(t)
	dead := testenv.Addr(testenv.FreePorts(t, 1)[0]) // nothing listens there
	register(t, live.Client(), "n-live", "10.0.0.2", &api.AgentService{ID: "web1", Service: "web", Port: 2001})

	r := startSource(t, dead, Config{Agents: []string{dead, live.Addr()}, probe: 200 * time.Millisecond}, model.LocalCatalog)
	r.waitFor("the catalog of the second agent", webAt(2001))
	if want := "Consul agent " + dead + " does not answer; failing over to " + live.Addr(); !strings.Contains(r.logged(), want) {
		t.Errorf("the log does not say %q:\n%s", want, r.logged())
	}
	if st := r.src.Status(); !st.Up || st.Stale {
		t.Errorf("serving from the second agent, yet status %+v", st)
	}
}

// TestFailoverAndBack: the preferred agent stops mid-run; the source
// moves to the second and follows changes made there; once the preferred
// agent is back, it returns to it. (Two single-server clusters stand in
// for two agents of one cluster, so each has its own catalog: that shows
// which one is read. Their indexes differ; the rules for an index that
// went backwards cover that, as they would a move to another cluster.)
func TestFailoverAndBack(t *testing.T) {
	a, b := testenv.Consul(t), testenv.Consul(t)
	register(t, a.Client(), "n-a", "10.0.0.1", &api.AgentService{ID: "web1", Service: "web", Port: 1001})
	// Two separate Consuls with the same history may reach the same
	// indexes, and an answer at the index a query waits on is taken as
	// unchanged (agents of one cluster share their indexes): b's web
	// moves well past a's first.
	for i := range 20 {
		register(t, b.Client(), "n-b", "10.0.0.2", &api.AgentService{ID: "web1", Service: "web", Port: 2100 + i})
	}
	register(t, b.Client(), "n-b", "10.0.0.2", &api.AgentService{ID: "web1", Service: "web", Port: 2001})

	// Stale reads under the default bound: real answers pass the check.
	cfg := Config{Agents: []string{a.Addr(), "http://" + b.Addr()}, probe: 200 * time.Millisecond,
		WaitTime: 5 * time.Second, Margin: 2 * time.Second, Stale: true, MaxStale: DefaultMaxStale}
	r := startSource(t, a.Addr(), cfg, model.LocalCatalog)
	r.waitFor("the preferred agent's catalog", webAt(1001))

	stopped := time.Now()
	a.Stop()
	r.waitFor("the second agent's catalog", webAt(2001))
	t.Logf("serving the second agent's catalog %s after the preferred agent stopped", time.Since(stopped).Round(time.Millisecond))
	// The move is logged once the request it carried has answered, which
	// can be after that answer reached the snapshot.
	want := "failing over to " + b.Addr()
	testenv.Eventually(t, 5*time.Second, "the log says "+want, func() bool { return strings.Contains(r.logged(), want) })
	register(t, b.Client(), "n-b", "10.0.0.2", &api.AgentService{ID: "web1", Service: "web", Port: 2002})
	r.waitFor("a change made on the second agent", webAt(2002))

	a.Start()
	back := time.Now()
	r.waitFor("the preferred agent's catalog again", webAt(1001))
	t.Logf("serving the preferred agent's catalog %s after it answered again", time.Since(back).Round(time.Millisecond))
	if want := "the preferred Consul agent " + a.Addr() + " answers again; back to it from " + b.Addr(); !strings.Contains(r.logged(), want) {
		t.Errorf("the log does not say %q", want)
	}
	register(t, a.Client(), "n-a", "10.0.0.1", &api.AgentService{ID: "web1", Service: "web", Port: 1002})
	r.waitFor("a change made on the preferred agent", webAt(1002))
	if st := r.src.Status(); st.Stale {
		t.Errorf("real answers refused as stale: %s", st.StaleReason)
	}
}

// The preferred agent is used again only once it knows a leader: one that
// answers but has not joined its cluster yet would fail every query.
func TestFailbackWaitsForALeader(t *testing.T) {
	var (
		mu     sync.Mutex
		leader = `""`
		probes int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/v1/status/leader" {
			probes++
		}
		fmt.Fprint(w, leader)
	}))
	defer srv.Close()
	probed := func() int { mu.Lock(); defer mu.Unlock(); return probes }
	f := &failoverTransport{next: http.DefaultTransport, scheme: "http", hosts: []string{srv.Listener.Addr().String(), "127.0.0.1:1"},
		probe: 10 * time.Millisecond, log: slog.New(slog.DiscardHandler)}
	f.cur.Store(1) // failed over
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx) }()
	defer func() { cancel(); <-done }()

	testenv.Eventually(t, wait, "three probes", func() bool {
		if f.cur.Load() != 1 {
			t.Fatal("back to a preferred agent that knows no leader")
		}
		return probed() >= 3
	})
	mu.Lock()
	leader = `"127.0.0.1:8300"`
	mu.Unlock()
	testenv.Eventually(t, wait, "back to the preferred agent", func() bool { return f.cur.Load() == 0 })
}

func TestParseAgents(t *testing.T) {
	tests := []struct {
		name   string
		list   []string
		err    string
		scheme string
	}{
		{"host:port", []string{"127.0.0.1:8500", " consul-b:8500"}, "", "http"},
		{"https", []string{"https://a:8501", "https://b:8501"}, "", "https"},
		{"mixed schemes", []string{"http://a:8500", "https://b:8501"}, "mixed schemes", ""},
		{"a unix socket", []string{"unix:///run/consul.sock", "a:8500"}, "unix", ""},
		{"no port", []string{"a", "b:8500"}, `"a": want host:port`, ""},
		{"a bad port", []string{"a:http"}, "not a number", ""},
		{"an empty entry", []string{"a:8500", ""}, `"": want host:port`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, scheme, err := parseAgents(tt.list)
			switch {
			case tt.err == "" && err != nil:
				t.Fatal(err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("error %v, want one saying %q", err, tt.err)
			case scheme != tt.scheme:
				t.Errorf("scheme %q, want %q", scheme, tt.scheme)
			}
		})
	}
	t.Run("CONSUL_HTTP_ADDR naming another agent", func(t *testing.T) {
		t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:9999")
		_, err := New(Config{Agents: []string{"127.0.0.1:8500", "127.0.0.1:8501"}}, nil)
		if err == nil || !strings.Contains(err.Error(), "CONSUL_HTTP_ADDR") {
			t.Errorf("error %v, want one naming CONSUL_HTTP_ADDR", err)
		}
	})
}
