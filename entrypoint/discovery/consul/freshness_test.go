package consul

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// fakeServer answers like a Consul agent relaying a server that may be
// cut off from its leader: X-Consul-LastContact and X-Consul-KnownLeader
// are the fake's to set. A real stale answer needs a follower without a
// leader (a multi-server cluster, the chaos suite's business); this
// stands in at the edge of the unit, the HTTP answer.
type fakeServer struct {
	mu          sync.Mutex
	port        int // the one instance's port, and the KV value
	index       uint64
	lastContact time.Duration
	noLeader    bool
	changed     chan struct{} // closed at each change
	fresh       int           // requests without an index (fresh reads)
}

func newFakeServer(t *testing.T) (*fakeServer, string) {
	f := &fakeServer{port: 1000, index: 10, changed: make(chan struct{})}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// set changes the data and the headers, waking the blocked queries.
func (f *fakeServer) set(port int, lastContact time.Duration, noLeader bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.port, f.lastContact, f.noLeader = port, lastContact, noLeader
	f.index++
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeServer) freshReads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	idx, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	if idx == 0 {
		f.fresh++
	}
	ch := f.changed
	if idx != 0 && idx == f.index {
		f.mu.Unlock()
		select { // a blocking query: until a change, or the client gives up
		case <-ch:
		case <-r.Context().Done():
			return
		}
		f.mu.Lock()
	}
	port, index, lc, noLeader := f.port, f.index, f.lastContact, f.noLeader
	f.mu.Unlock()
	node := `"Node":"n1","Address":"10.0.0.1","Datacenter":"dc1"`
	svc := fmt.Sprintf(`{"ID":"web1","Service":"web","Port":%d}`, port)
	var body string
	switch p := r.URL.Path; {
	case p == "/v1/catalog/services":
		body = `{"web":[]}`
	case p == "/v1/catalog/nodes":
		body = `[{` + node + `}]`
	case p == "/v1/health/service/web":
		body = `[{"Node":{` + node + `},"Service":` + svc + `,"Checks":[]}]`
	case p == nodeDumpPath:
		body = `[{` + node + `,"Services":[` + svc + `],"Checks":[]}]`
	case strings.HasPrefix(p, "/v1/kv/"):
		v := base64.StdEncoding.EncodeToString([]byte(strconv.Itoa(port)))
		body = fmt.Sprintf(`[{"Key":%q,"Value":%q}]`, strings.TrimPrefix(p, "/v1/kv/"), v)
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Consul-Index", strconv.FormatUint(index, 10))
	w.Header().Set("X-Consul-LastContact", strconv.FormatInt(lc.Milliseconds(), 10))
	w.Header().Set("X-Consul-KnownLeader", strconv.FormatBool(!noLeader))
	fmt.Fprint(w, body)
}

// TestStaleAnswersAreNotApplied shows, for every kind of query, that an
// answer from a server too long out of contact with its leader (or that
// knows none) is not used: the last good data keeps serving, the source
// says it is stale and why, logs it once, reads afresh until the answers
// are fresh again, and then uses them.
func TestStaleAnswersAreNotApplied(t *testing.T) {
	catalog := func(s model.Snapshot, q model.Query) string {
		r := s.Results[q]
		if r.Catalog == nil || r.Catalog.Len() != 1 {
			return "no instance"
		}
		return strconv.Itoa(r.Catalog.All()[0].Port)
	}
	kv := func(s model.Snapshot, q model.Query) string {
		if ps := s.Results[q].Pairs; len(ps) == 1 {
			return ps[0].Value
		}
		return "no key"
	}
	tests := []struct {
		name    string
		q       model.Query
		watches int
		value   func(model.Snapshot, model.Query) string
	}{
		{"per-service catalog (services, nodes, health)", model.Query{Kind: model.QueryCatalog, Datacenter: "dc1"}, 0, catalog},
		{"catalog from the node dump", model.Query{Kind: model.QueryCatalog, Datacenter: "dc1"}, 2, catalog},
		{"a KV key", model.Query{Kind: model.QueryKey, Key: "k"}, 0, kv},
		{"a KV prefix", model.Query{Kind: model.QueryPrefix, Key: "k"}, 0, kv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, url := newFakeServer(t)
			r := startSource(t, url, Config{MaxStale: 10 * time.Second, Watches: tt.watches, Margin: time.Second, WaitTime: 2 * time.Second}, tt.q)
			r.waitFor("the first answer", func(s model.Snapshot) bool { return tt.value(s, tt.q) == "1000" })
			if st := r.src.Status(); st.Stale || !st.Up {
				t.Fatalf("fresh answers, yet status %+v", st)
			}

			f.set(2000, 20*time.Second, false) // cut off from the leader for 20s
			testenv.Eventually(t, wait, "the source to say it is stale", func() bool { return r.src.Status().Stale })
			st := r.src.Status()
			for _, want := range []string{"20s", "SEAMLESS_CONSUL_MAX_STALE=10s"} {
				if !strings.Contains(st.StaleReason, want) {
					t.Errorf("stale reason %q does not say %q", st.StaleReason, want)
				}
			}
			// Retried, reading afresh: the reread rule of a failed query.
			reads := f.freshReads()
			testenv.Eventually(t, wait, "the stale query to be read afresh again", func() bool { return f.freshReads() >= reads+2 })
			f.set(3000, 0, true) // no leader at all
			testenv.Eventually(t, wait, "the reason to say no leader", func() bool {
				return strings.Contains(r.src.Status().StaleReason, "knows no leader")
			})
			if snap, _ := r.last(); tt.value(snap, tt.q) != "1000" {
				got := tt.value(snap, tt.q)
				t.Fatalf("a stale answer was applied: %s", got)
			}
			if n := strings.Count(r.logged(), "Consul's answer is stale"); n != 1 {
				t.Errorf("the stale episode was logged %d times, want once:\n%s", n, r.logged())
			}

			f.set(4000, 0, false)
			r.waitFor("the fresh answer", func(s model.Snapshot) bool { return tt.value(s, tt.q) == "4000" })
			testenv.Eventually(t, wait, "the source to be fresh", func() bool { st := r.src.Status(); return !st.Stale && st.Up })
			if n := strings.Count(r.logged(), "fresh again"); n != 1 {
				t.Errorf("the recovery was logged %d times, want once", n)
			}
		})
	}
}

func TestCheckFresh(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name  string
		h     http.Header
		stale bool
	}{
		{"within the bound", h("X-Consul-LastContact", "9999", "X-Consul-KnownLeader", "true"), false},
		{"past the bound", h("X-Consul-LastContact", "10001", "X-Consul-KnownLeader", "true"), true},
		{"no leader", h("X-Consul-LastContact", "0", "X-Consul-KnownLeader", "false"), true},
		// Consul 1.14's streaming view says KnownLeader false on every answer.
		{"the agent's streaming view", h("X-Consul-LastContact", "0", "X-Consul-KnownLeader", "false", "X-Consul-Query-Backend", "streaming"), false},
		{"no headers (a local endpoint, a proxy)", h(), false},
		{"garbage", h("X-Consul-LastContact", "-5", "X-Consul-KnownLeader", "maybe"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkFresh(tt.h, 10*time.Second) != nil; got != tt.stale {
				t.Errorf("stale %v, want %v", got, tt.stale)
			}
		})
	}
}
