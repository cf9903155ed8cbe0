package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestNewRejectsBadConfiguration(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		addr string // CONSUL_HTTP_ADDR
		want string
	}{
		{"a negative wait", Config{WaitTime: -time.Second}, "", "negative"},
		{"a wait Consul would cap", Config{WaitTime: 11 * time.Minute}, "", "limit"},
		{"an unknown scheme in CONSUL_HTTP_ADDR", Config{}, "ftp://127.0.0.1:8500", "ftp"},
		{"a CA file that does not exist", Config{API: &api.Config{Address: "127.0.0.1:8500",
			TLSConfig: api.TLSConfig{CAFile: "/nonexistent/ca.pem"}}}, "", "ca.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CONSUL_HTTP_ADDR", tt.addr)
			_, err := New(tt.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		t.Setenv("CONSUL_HTTP_ADDR", "unix:///run/consul.sock")
		s, err := New(Config{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.cfg.WaitTime != DefaultWaitTime || s.Name() != "consul" || s.addrHint != "from CONSUL_HTTP_ADDR" {
			t.Errorf("wait %s name %s hint %q", s.cfg.WaitTime, s.Name(), s.addrHint)
		}
	})
}

func TestAggregateStatus(t *testing.T) {
	c := func(id, status string) model.Check { return model.Check{CheckID: id, Status: status} }
	tests := []struct {
		name   string
		checks []model.Check
		want   string
	}{
		{"no checks is passing", nil, model.StatusPassing},
		{"all passing", []model.Check{c("a", "passing"), c("b", "passing")}, model.StatusPassing},
		{"warning beats passing", []model.Check{c("a", "passing"), c("b", "warning")}, model.StatusWarning},
		{"critical beats warning", []model.Check{c("a", "critical"), c("b", "warning")}, model.StatusCritical},
		{"node maintenance beats everything", []model.Check{c("a", "critical"), c("_node_maintenance", "critical")}, model.StatusMaintenance},
		{"service maintenance", []model.Check{c("_service_maintenance:web-1", "critical")}, model.StatusMaintenance},
		{"an unknown status counts as critical", []model.Check{c("a", "passing"), c("b", "on fire")}, model.StatusCritical},
		{"an empty status counts as critical", []model.Check{c("a", "")}, model.StatusCritical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := aggregateStatus(tt.checks); got != tt.want {
				t.Errorf("%s, want %s", got, tt.want)
			}
		})
	}
}

func TestNextIndex(t *testing.T) {
	tests := []struct {
		name            string
		prev, got, want uint64
	}{
		{"first answer", 0, 42, 42},
		{"forward", 42, 50, 50},
		{"unchanged", 42, 42, 42},
		{"backwards starts over", 42, 7, 0},
		{"zero is never waited on", 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextIndex(tt.prev, tt.got); got != tt.want {
				t.Errorf("nextIndex(%d, %d) = %d, want %d", tt.prev, tt.got, got, tt.want)
			}
		})
	}
}

func TestConvertDumpSurvivesOddData(t *testing.T) {
	const dump = `[
	  null,
	  {"Node": "peer-node", "PeerName": "other", "Services": [{"ID": "x", "Service": "x"}]},
	  {"Node": "n1", "Address": "10.0.0.1", "Meta": {}, "TaggedAddresses": null,
	   "Services": [null,
	     {"ID": "web", "Service": "web", "Port": 80, "Tags": [], "Weights": null},
	     {"ID": "imported", "Service": "web", "PeerName": "other"},
	     {"ID": "", "Service": "", "Port": -1, "Tags": ["a\nb", "<x>"], "Meta": {"k": "\u0000"},
	      "TaggedAddresses": {"wan": {"Address": "::1", "Port": 443}, "lan": {"Address": "x"}}}],
	   "Checks": [null,
	     {"CheckID": "node-ok", "Status": "passing"},
	     {"CheckID": "web-weird", "ServiceID": "web", "Status": "unheard-of"},
	     {"CheckID": "orphan", "ServiceID": "gone", "Status": "critical"}]},
	  {"Node": "n2", "Services": [{"ID": "web", "Service": "web", "Port": 81}]}
	]`
	var nodes []*nodeInfo
	if err := json.Unmarshal([]byte(dump), &nodes); err != nil {
		t.Fatal(err)
	}
	cat := convertDump(nodes, "dc1", "")
	var names []string
	for _, n := range cat.Nodes {
		names = append(names, n.Name)
	}
	if !slices.Equal(names, []string{"n1", "n2"}) {
		t.Errorf("nodes %v: peers and nulls should be left out", names)
	}
	got := map[string]model.Instance{}
	for _, in := range cat.Instances {
		got[in.ID] = in
	}
	if len(got) != 3 {
		t.Fatalf("instances %+v, want n1/web, n1/ and n2/web", cat.Instances)
	}
	if in := got["n1/web"]; in.Status != model.StatusCritical || len(in.Checks) != 1 || len(in.NodeChecks) != 1 || in.Tags != nil {
		t.Errorf("n1/web %+v: an unknown check status is critical; node check and own check", in)
	}
	if in := got["n2/web"]; in.Status != model.StatusPassing || in.Address != "" || in.Port != 81 {
		t.Errorf("n2/web %+v", in)
	}
	if in := got["n1/"]; in.TaggedAddresses["wan"] != "[::1]:443" || in.TaggedAddresses["lan"] != "x" || in.Address != "10.0.0.1" {
		t.Errorf("n1/ %+v", in)
	}
}

func FuzzConvertDump(f *testing.F) {
	f.Add([]byte(`[{"Node":"n","Services":[{"ID":"a","Service":"a","Tags":["t"]}],"Checks":[{"CheckID":"c","ServiceID":"a","Status":"warning"}]}]`))
	f.Add([]byte(`[null,{"PeerName":"p"},{"Services":[null],"Checks":[null]}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var nodes []*nodeInfo
		if json.Unmarshal(b, &nodes) != nil {
			return
		}
		for _, tag := range []string{"", "t"} {
			cat := convertDump(nodes, "dc", tag)
			for _, in := range cat.Instances {
				if tag != "" && !slices.Contains(in.Tags, tag) {
					t.Errorf("instance %+v without tag %q", in, tag)
				}
			}
		}
	})
}

// stubCatalog answers Consul's public catalog endpoints with service s on
// node a of datacenter dc9, at index 1 (the health of s at index 2: the
// source's first read of a service's health waits on index 1). A request
// waiting on the index of the answer blocks until it is cancelled, as
// Consul's does while nothing changes.
func stubCatalog(w http.ResponseWriter, r *http.Request) {
	index := "1"
	if strings.HasPrefix(r.URL.Path, "/v1/health/service/") {
		index = "2"
	}
	if r.URL.Query().Get("index") == index {
		<-r.Context().Done()
		return
	}
	w.Header().Set("X-Consul-Index", index)
	switch r.URL.Path {
	case "/v1/catalog/services":
		fmt.Fprint(w, `{"s": []}`)
	case "/v1/catalog/nodes":
		fmt.Fprint(w, `[{"Node": "a", "Datacenter": "dc9"}]`)
	default:
		fmt.Fprint(w, healthOf("a"))
	}
}

// healthOf is the health of service s, with one instance on node.
func healthOf(node string) string {
	return fmt.Sprintf(`[{"Node": {"Node": %q, "Datacenter": "dc9"}, "Service": {"ID": "s", "Service": "s"}, "Checks": []}]`, node)
}

// stub serves handler as a Consul, for the edges a real one will not show.
func stub(t testing.TB, handler http.HandlerFunc) string {
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close) // after the source has stopped: cleanups run last first
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestStatusExplainsErrors(t *testing.T) {
	tests := []struct {
		name    string
		addr    func(t *testing.T) string
		q       model.Query
		mention []string
	}{
		{"nobody listens", func(t *testing.T) string { return testenv.Addr(testenv.FreePort(t)) },
			model.LocalCatalog, []string{"CONSUL_HTTP_ADDR", "connection refused", "catalog"}},
		{"the token may not read the catalog", func(t *testing.T) string {
			return stub(t, func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "Permission denied: token with AccessorID 'x' lacks permission 'node:read'", http.StatusForbidden)
			})
		}, model.LocalCatalog, []string{"CONSUL_HTTP_TOKEN", "node:read", "403", "from CONSUL_HTTP_ADDR"}},
		{"the token may not read a key", func(t *testing.T) string {
			return stub(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "Permission denied", http.StatusForbidden) })
		}, model.Query{Kind: model.QueryKey, Key: "secret/x"}, []string{"key:read", `"secret/x"`}},
		{"Consul fails", func(t *testing.T) string {
			return stub(t, func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "No cluster leader", http.StatusInternalServerError)
			})
		}, model.LocalCatalog, []string{"500", "No cluster leader", "from CONSUL_HTTP_ADDR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr(t)
			r := startSource(t, addr, Config{}, tt.q)
			testenv.Eventually(t, wait, "an error", func() bool { return r.src.Status().LastError != "" })
			st := r.src.Status()
			if st.Up || st.LastErrorAt.IsZero() {
				t.Errorf("status %+v", st)
			}
			for _, m := range append(tt.mention, addr) {
				if !strings.Contains(st.LastError, m) {
					t.Errorf("error %q does not mention %q", st.LastError, m)
				}
			}
			if snap, n := r.last(); n > 0 && len(snap.Results) != 0 {
				t.Errorf("a failing query has an answer: %+v", snap)
			}
		})
	}
}

// An index that goes backwards, which the servers confirm (a restored
// snapshot, a Consul that started over), makes the watch read afresh
// instead of waiting on an index that will not come back.
func TestIndexGoingBackwardsStartsOver(t *testing.T) {
	var (
		mu      sync.Mutex
		indexes []string
	)
	answers := []struct {
		index uint64
		node  string
	}{{100, "a"}, {5, "b"}, {7, "b"}}
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health/service/s" {
			stubCatalog(w, r)
			return
		}
		if !r.URL.Query().Has("index") { // the servers, started over
			w.Header().Set("X-Consul-Index", "6")
			fmt.Fprint(w, healthOf("b"))
			return
		}
		mu.Lock()
		n := len(indexes)
		indexes = append(indexes, r.URL.Query().Get("index"))
		mu.Unlock()
		if n >= len(answers) {
			<-r.Context().Done() // a blocking query with nothing new
			return
		}
		w.Header().Set("X-Consul-Index", fmt.Sprint(answers[n].index))
		fmt.Fprint(w, healthOf(answers[n].node))
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("node b", func(s model.Snapshot) bool {
		in := instances(s, "s")
		return len(in) == 1 && in[0].Node == "b" && in[0].Datacenter == "dc9"
	})
	testenv.Eventually(t, wait, "four requests", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(indexes) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	// A health query reads afresh on index 1, which any answer passes:
	// the agent's streaming view answers it.
	if want := []string{"1", "100", "1", "7"}; !slices.Equal(indexes, want) {
		t.Errorf("indexes waited on %q, want %q", indexes, want)
	}
}

// scripted fails or succeeds as told, noting when it was called, then
// blocks until its context ends.
type scripted struct {
	script []error
	calls  []time.Time
	done   chan struct{} // closed when the script has run
}

func (f *scripted) fetch(ctx context.Context) (model.Result, error) {
	f.calls = append(f.calls, time.Now())
	if i := len(f.calls) - 1; i < len(f.script) {
		return model.Result{Catalog: &model.Catalog{}}, f.script[i]
	}
	close(f.done)
	<-ctx.Done()
	return model.Result{}, ctx.Err()
}

func TestRetriesBackOffExponentiallyAndResetOnSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, err := New(Config{API: &api.Config{Address: "127.0.0.1:1"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fail := errors.New("refused")
		script := slices.Repeat([]error{fail}, 10) // 250ms·2⁹ passes the 30s cap
		script = append(script, nil, fail, fail)
		f := &scripted{script: script, done: make(chan struct{})}
		ctx, cancel := context.WithCancel(t.Context())
		w := &watch{q: model.LocalCatalog, cancel: cancel, f: f}
		src.mu.Lock()
		src.watches[w.q] = w
		src.mu.Unlock()
		src.wg.Go(func() { src.runWatch(ctx, w) })
		<-f.done // the fake clock runs while everything waits
		if src.Status().Up || len(f.calls) != len(script)+1 {
			t.Fatalf("status %+v after %d calls", src.Status(), len(f.calls))
		}
		cancel()
		src.wg.Wait()

		bound := func(attempt int) time.Duration { return min(250*time.Millisecond<<attempt, 10*time.Second) }
		expect := []time.Duration{}
		for i := range 10 {
			expect = append(expect, bound(i))
		}
		expect = append(expect, 0, bound(0), bound(1)) // after the success: minInterval, then from the start
		for i, want := range expect {
			gap := f.calls[i+1].Sub(f.calls[i])
			if want == 0 {
				if gap != minInterval {
					t.Errorf("after the success: %s, want %s", gap, minInterval)
				}
				continue
			}
			if gap < want/2 || gap > want {
				t.Errorf("retry %d after %s, want between %s and %s", i, gap, want/2, want)
			}
		}
	})
}

// pacedScript is a scripted fetcher that paces its own queries, as the
// per-service catalog does, at the pace of a catalog of instances.
type pacedScript struct {
	*scripted
	instances int
}

func (p pacedScript) pace() (time.Duration, bool) { return catalogPace(p.instances), true }

// A per-service catalog's answers to one write arrive a few milliseconds
// apart; the one carrying the change must not wait out a pause the first
// started, while a steady stream of answers is held to the catalog's pace:
// 4 ms at 1,000 instances (minInterval held 50 changes a second across
// services 100 ms apart), 400 ms at 100,000.
func TestAPerServiceCatalogPassesABurstOnAtItsPace(t *testing.T) {
	repeat := func(d time.Duration) []time.Duration { return slices.Repeat([]time.Duration{d}, 3) }
	for _, tc := range []struct {
		name string
		f    func(*scripted) fetcher
		want []time.Duration // between one call and the next
	}{
		{"per service, 1,000 instances", func(s *scripted) fetcher { return pacedScript{s, 1000} },
			append([]time.Duration{0, 0, 0}, repeat(4*time.Millisecond)...)},
		{"per service, 100,000 instances", func(s *scripted) fetcher { return pacedScript{s, 100000} },
			append([]time.Duration{0, 0, 0}, repeat(400*time.Millisecond)...)},
		{"one query", func(s *scripted) fetcher { return s }, slices.Repeat([]time.Duration{minInterval}, 6)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src, err := New(Config{API: &api.Config{Address: "127.0.0.1:1"}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				f := &scripted{script: make([]error, len(tc.want)), done: make(chan struct{})}
				ctx, cancel := context.WithCancel(t.Context())
				w := &watch{q: model.LocalCatalog, cancel: cancel, f: tc.f(f)}
				src.mu.Lock()
				src.watches[w.q] = w
				src.mu.Unlock()
				src.wg.Go(func() { src.runWatch(ctx, w) })
				<-f.done
				cancel()
				src.wg.Wait()
				var got []time.Duration
				for i := 1; i < len(f.calls); i++ {
					got = append(got, f.calls[i].Sub(f.calls[i-1]))
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("requests %v apart, want %v", got, tc.want)
				}
			})
		})
	}
}

func TestCatalogPaceIsPerInstanceAndBounded(t *testing.T) {
	for _, tc := range []struct {
		instances int
		want      time.Duration
	}{{0, 0}, {-1, 0}, {1, 4 * time.Microsecond}, {1000, 4 * time.Millisecond}, {10000, 40 * time.Millisecond}, {100000, 400 * time.Millisecond}, {250000, maxCatalogPace}, {1000000, maxCatalogPace}} {
		if got := catalogPace(tc.instances); got != tc.want {
			t.Errorf("catalogPace(%d) = %s, want %s", tc.instances, got, tc.want)
		}
	}
}

// The catalog paces itself by the catalog it passed on last, and only
// while its per-service watches serve.
func TestTheCatalogPacesByItsLastCatalog(t *testing.T) {
	f := &catalogFetcher{}
	if _, self := f.pace(); self {
		t.Error("the node dump paces itself; want minInterval")
	}
	f.split = &splitCatalog{}
	if d, self := f.pace(); !self || d != 0 {
		t.Errorf("before a catalog: %s %v, want 0 true", d, self)
	}
	f.split.last = &model.Catalog{Instances: make([]model.Instance, 1000)}
	if d, _ := f.pace(); d != 4*time.Millisecond {
		t.Errorf("after 1,000 instances: %s, want 4ms", d)
	}
}

// When one query sees Consul's index go backwards (a restarted Consul),
// the others, still blocked on the old index where the new Consul would
// hold them for the whole wait, are cut short and read afresh.
func TestARestartSeenByOneQueryRestartsTheOthers(t *testing.T) {
	var (
		mu       sync.Mutex
		services []string // the index each services request waited on
		health   int
		reset    = -1 // how many services requests came before the reset answer
	)
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		idx := r.URL.Query().Get("index")
		switch r.URL.Path {
		case "/v1/catalog/services":
			mu.Lock()
			services = append(services, idx)
			mu.Unlock()
			if idx == "100" {
				<-r.Context().Done() // the new Consul will not reach 100 for a long time
				return
			}
			w.Header().Set("X-Consul-Index", "100")
			fmt.Fprint(w, `{"s": []}`)
		case "/v1/health/service/s":
			if idx == "" { // the servers, started over
				w.Header().Set("X-Consul-Index", "5")
				fmt.Fprint(w, healthOf("b"))
				return
			}
			mu.Lock()
			health++
			n := health
			mu.Unlock()
			switch n {
			case 1:
				w.Header().Set("X-Consul-Index", "100")
				fmt.Fprint(w, healthOf("a"))
			case 2:
				mu.Lock()
				reset = len(services)
				mu.Unlock()
				w.Header().Set("X-Consul-Index", "5") // restarted, with less data
				fmt.Fprint(w, healthOf("b"))
			default:
				<-r.Context().Done()
			}
		default:
			stubCatalog(w, r)
		}
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("s on node b", func(s model.Snapshot) bool {
		in := instances(s, "s")
		return len(in) == 1 && in[0].Node == "b"
	})
	testenv.Eventually(t, promptly, "the service list read afresh", func() bool {
		mu.Lock()
		defer mu.Unlock()
		// Whether the list's query was already held on 100 when the reset
		// came depends on the scheduler; either way a fresh read follows.
		return reset >= 0 && slices.Contains(services[reset:], "")
	})
}

// When Consul starts over, the query that sees it first (its index went
// back, and the leader's too) makes every other query read afresh; their
// answers, below what they had, are Consul's new state: they are taken as
// such, without asking the leader again and without restarting the others
// once more. Each restart cuts every held query, so before, n services
// cost about n²/2 fresh reads and n reads of the leader.
func TestARestartIsAnnouncedOnce(t *testing.T) {
	const n = 20
	var (
		reset          atomic.Bool
		resetCh        = make(chan struct{})
		fresh, leaders atomic.Int32 // after the reset
	)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("s%02d", i)
	}
	health := func(w http.ResponseWriter, name string, index int) {
		w.Header().Set("X-Consul-Index", strconv.Itoa(index))
		fmt.Fprintf(w, `[{"Node": {"Node": "a", "Datacenter": "dc9"}, "Service": {"ID": %q, "Service": %q}, "Checks": []}]`, name, name)
	}
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		idx := r.URL.Query().Get("index")
		name, isHealth := strings.CutPrefix(r.URL.Path, "/v1/health/service/")
		switch {
		case !isHealth && idx == "":
			w.Header().Set("X-Consul-Index", "100")
			if r.URL.Path == "/v1/catalog/nodes" {
				fmt.Fprint(w, `[{"Node": "a", "Datacenter": "dc9"}]`)
				return
			}
			fmt.Fprintf(w, `{"%s": []}`, strings.Join(names, `": [], "`))
		case !isHealth:
			<-r.Context().Done() // the lists do not change
		case idx == "": // the leader, started over
			leaders.Add(1)
			health(w, name, 5)
		case idx == "1" && reset.Load():
			fresh.Add(1)
			health(w, name, 5)
		case idx == "1":
			health(w, name, 100)
		case idx == "100" && name == names[0]:
			select {
			case <-r.Context().Done():
			case <-resetCh:
				health(w, name, 5) // the first to see Consul start over
			}
		default:
			<-r.Context().Done() // the new Consul will not reach 100 for long
		}
	})
	r := startSource(t, addr, Config{Watches: n + 16}, model.LocalCatalog)
	r.steady(watching(n))
	reset.Store(true)
	close(resetCh)
	testenv.Eventually(t, wait, "every service read afresh", func() bool { return fresh.Load() >= n })
	r.steady(watching(n))
	if got := fresh.Load(); got != n {
		t.Errorf("%d fresh reads after the reset for %d services; want %d, one each", got, n, n)
	}
	if got := leaders.Load(); got != 1 {
		t.Errorf("the leader was read %d times after the reset; want once, by the query that saw it first", got)
	}
}
