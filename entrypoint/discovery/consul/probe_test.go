package consul

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// While the agent is away the source's queries back off, up to 10 s each
// (longer here).
// When it answers again, the probe wakes them all: the source sees a
// change within about a second of the agent's return, not when the
// longest backoff ends. And it knows the agent is away within seconds.
func TestAgentsReturnWakesBackedOffQueries(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "web-1", Service: "web", Port: 80})
	// Every retry waits 10-20 s (jitter takes up to half off): longer
	// than the longest backoff, so that the agent's restart (a few
	// seconds) cannot outlast it.
	r := startSource(t, agent.Addr(), Config{retry: 2 * retryMax}, model.LocalCatalog)
	r.waitFor("web-1", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	r.steady(watching(2)) // web and consul

	agent.Stop()
	stopped := time.Now()
	// The four blocking queries (services, nodes, web, consul) broke with
	// their connections, and back off.
	testenv.Eventually(t, wait, "every query backed off", func() bool {
		r.src.probe.mu.Lock()
		defer r.src.probe.mu.Unlock()
		return r.src.probe.backedOff >= int(watching(2))
	})
	testenv.Eventually(t, 2*probeFast+probeTimeout, "the source stale, saying the agent does not name its leader", func() bool {
		st := r.src.Status()
		return st.Stale && strings.Contains(st.StaleReason, "/v1/status/leader")
	})
	t.Logf("stale %s after the agent stopped: %s", time.Since(stopped).Round(100*time.Millisecond), r.src.Status().StaleReason)

	agent.Start()
	back := time.Now()
	t.Logf("the agent answered again %s after it stopped", back.Sub(stopped).Round(100*time.Millisecond))
	register(t, c, "n2", "10.0.0.2", &api.AgentService{ID: "web-2", Service: "web", Port: 80})
	// The probe's second and a request, with room for a busy machine;
	// far less than what the backoffs have left.
	const bound = 2500 * time.Millisecond
	testenv.Eventually(t, bound, "web-2 seen soon after the agent's return", func() bool {
		s, n := r.last()
		return n > 0 && len(instances(s, "web")) == 2
	})
	t.Logf("web-2 seen %s after the agent answered again", time.Since(back).Round(100*time.Millisecond))
	testenv.Eventually(t, bound, "the source fresh again", func() bool { st := r.src.Status(); return st.Up && !st.Stale })
}

// An agent cut off from its servers may hold the probe's request instead
// of failing it. Once the agent is known to be down, such a probe must not
// hold up the next: the agent's return is seen within about probeFast,
// not after the longer timeout of a probe of a healthy agent.
func TestAProbeThatHangsDoesNotDelayTheAgentsReturn(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	hung := make(chan struct{}, 1)
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status/leader" {
			stubCatalog(w, r)
			return
		}
		if down.Load() {
			select {
			case hung <- struct{}{}:
			default:
			}
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, `"10.0.0.1:8300"`)
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	testenv.Eventually(t, 2*probeTimeout, "the probe sees the agent down", func() bool {
		why, _ := r.src.probe.stale()
		return why != ""
	})
	select {
	case <-hung: // one from before, maybe
	default:
	}
	select { // a probe hangs now, the agent known down
	case <-hung:
	case <-time.After(wait):
		t.Fatal("no probe reached the agent")
	}
	down.Store(false)
	back := time.Now()
	testenv.Eventually(t, 2*probeFast, "the probe sees the agent back", func() bool {
		why, _ := r.src.probe.stale()
		return why == ""
	})
	t.Logf("the agent's return seen after %s", time.Since(back).Round(100*time.Millisecond))
}

// An election (the agent answers, and knows no leader for a moment) leaves
// the blocking queries in flight alone: Consul's blocking queries and
// streams survive it, and cutting them all would send every replica's
// every query to the new leader at once. An agent that could not reach
// its servers at all may have lost the connections they wait on: its
// return reads them afresh.
func TestOnlyAnAgentCutFromItsServersRereadsQueriesInFlight(t *testing.T) {
	var (
		mode  atomic.Value // "ok", "no leader", "cut", "once" (cut, for one probe)
		mu    sync.Mutex
		fresh int // reads of the service list at index 0
	)
	mode.Store("ok")
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/status/leader":
			switch mode.Load() {
			case "ok":
				fmt.Fprint(w, `"10.0.0.1:8300"`)
			case "no leader":
				fmt.Fprint(w, `""`)
			case "once":
				mode.Store("ok")
				http.Error(w, "rpc error getting client: failed to get conn: i/o timeout", http.StatusInternalServerError)
			default:
				http.Error(w, "rpc error getting client: failed to get conn: i/o timeout", http.StatusInternalServerError)
			}
			return
		case "/v1/catalog/services":
			if r.URL.Query().Get("index") == "" {
				mu.Lock()
				fresh++
				mu.Unlock()
			}
		}
		stubCatalog(w, r)
	})
	freshReads := func() int {
		mu.Lock()
		defer mu.Unlock()
		return fresh
	}
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("the catalog", func(s model.Snapshot) bool { return len(instances(s, "s")) == 1 })
	r.steady(watching(1))
	p := r.src.probe
	outage := func(m string) (woken, reread bool) {
		t.Helper()
		recovery, reconnection := p.recovery(), p.reconnection()
		mode.Store(m)
		testenv.Eventually(t, 2*probeEvery, m+": the probe sees the agent down, twice", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.down != "" && (m != "cut" || p.severed >= 2)
		})
		if m != "once" {
			mode.Store("ok")
		}
		testenv.Eventually(t, 2*probeFast+probeTimeout, m+": the probe sees the agent back", func() bool { why, _ := p.stale(); return why == "" })
		return recovery.Err() != nil, reconnection.Err() != nil
	}

	before := freshReads()
	if woken, reread := outage("no leader"); !woken || reread {
		t.Errorf("after an election: backed-off queries woken %v (want true), queries in flight read afresh %v (want false)", woken, reread)
	}
	if woken, reread := outage("once"); !woken || reread {
		t.Errorf("after one failed probe: backed-off queries woken %v (want true), queries in flight read afresh %v (want false)", woken, reread)
	}
	if woken, reread := outage("cut"); !woken || !reread {
		t.Errorf("after a cut: backed-off queries woken %v, queries in flight read afresh %v; want both", woken, reread)
	}
	testenv.Eventually(t, wait, "the service list read afresh after the cut", func() bool { return freshReads() > before })
}

// A fresh read (after a failure) sent while the agent is cut off may hang
// as well as a blocking one; the agent's return ends it too, rather than
// its deadline (the margin, 15 s).
func TestTheAgentsReturnEndsAFreshReadThatHangs(t *testing.T) {
	var (
		cut     atomic.Bool
		cutCh   = make(chan struct{})
		hanging = make(chan struct{}, 1)
		freshOK atomic.Int32
	)
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/status/leader":
			if cut.Load() {
				http.Error(w, "rpc error getting client: failed to get conn: i/o timeout", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, `"10.0.0.1:8300"`)
			return
		case "/v1/catalog/services":
			switch {
			case r.URL.Query().Get("index") != "": // blocking: until the cut
				select {
				case <-cutCh:
					http.Error(w, "rpc error: i/o timeout", http.StatusInternalServerError)
				case <-r.Context().Done():
				}
				return
			case cut.Load(): // a fresh read through the cut hangs
				select {
				case hanging <- struct{}{}:
				default:
				}
				<-r.Context().Done()
				return
			}
			freshOK.Add(1)
		}
		stubCatalog(w, r)
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("the catalog", func(s model.Snapshot) bool { return len(instances(s, "s")) == 1 })
	before := freshOK.Load()
	cut.Store(true)
	close(cutCh)
	select {
	case <-hanging:
	case <-time.After(wait):
		t.Fatal("no fresh read of the service list during the cut")
	}
	testenv.Eventually(t, 2*probeEvery, "the probe sees the agent cut off, twice", func() bool {
		p := r.src.probe
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.severed >= 2
	})
	cut.Store(false)
	back := time.Now()
	testenv.Eventually(t, 2*probeFast+time.Second, "the service list read again soon after the agent's return", func() bool {
		return freshOK.Load() > before
	})
	t.Logf("read again %s after the agent's return", time.Since(back).Round(100*time.Millisecond))
}

// The Consul leader dies: an agent whose streams ran through it fails the
// health queries in flight (500, the stream's EOF), and its streaming
// view, which serves blocking health queries, catches up within moments
// from another server. A read without an index, though, is forwarded to
// the servers, which forward it to the leader they still know: it hangs
// until their dial times out (10 s in the chaos runs). The source's read
// after the failure must go to the view (an index), not wait on that.
func TestAReadAfterAFailedHealthQueryUsesTheAgentsView(t *testing.T) {
	var broken atomic.Bool
	brokeCh, blocking := make(chan struct{}), make(chan struct{}, 1)
	view := webHealth
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if webCatalog(w, r) { // the election is over
			return
		}
		index := r.URL.Query().Get("index")
		switch r.URL.Path {
		case "/v1/health/service/web":
			switch {
			case !broken.Load() && (index == "" || index == "1"):
				w.Header().Set("X-Consul-Index", "10")
				fmt.Fprint(w, view("a"))
			case !broken.Load(): // blocking on the view until the leader dies
				select {
				case blocking <- struct{}{}:
				default:
				}
				select {
				case <-brokeCh:
					http.Error(w, "rpc error: code = Unavailable desc = error reading from server: EOF", http.StatusInternalServerError)
				case <-r.Context().Done():
				}
			case index == "": // forwarded to the dead leader
				<-r.Context().Done()
			case index < "11": // the view, caught up: 1 or 10
				w.Header().Set("X-Consul-Index", "11")
				w.Header().Set("X-Consul-Query-Backend", "streaming")
				fmt.Fprint(w, view("a", "b"))
			default:
				<-r.Context().Done()
			}
		default:
			http.NotFound(w, r)
		}
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("web-a", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	select {
	case <-blocking:
	case <-time.After(wait):
		t.Fatal("no blocking query on web")
	}
	broken.Store(true)
	close(brokeCh)
	died := time.Now()
	// The first backoff (250 ms at most) and a request, with room for a
	// busy machine; far less than the forwarded read's hang.
	testenv.Eventually(t, 2*time.Second, "web-b from the agent's view soon after the failure", func() bool {
		s, n := r.last()
		return n > 0 && len(instances(s, "web")) == 2
	})
	t.Logf("web-b seen %s after the stream failed", time.Since(died).Round(10*time.Millisecond))
}

// After a partition heals, the agent's streaming view of a service may
// keep serving what it had before the cut while its subscription waits
// out a backoff that grew during the cut (up to a minute in Consul 1.14;
// seen in the chaos suite, where a removal reached one replica only when
// the next fault reset the view). The source must check the view against
// the servers after a failure, read the service from them while the view
// lags, and follow the view again once it moves.
func TestAViewThatLagsItsServersIsReadFromThem(t *testing.T) {
	var (
		caught  atomic.Bool
		directs atomic.Int32
	)
	r, broke := laggingView(t, func() viewAnswer {
		if caught.Load() {
			return viewAnswer{21, []string{"b", "c"}} // the view resubscribed, and c came since
		}
		return viewAnswer{10, []string{"a"}}
	}, func() viewAnswer {
		directs.Add(1)
		return viewAnswer{20, []string{"b"}} // the servers: a left during the cut, b came
	})
	close(broke)
	cut := time.Now()
	nodes := func() []string { s, _ := r.last(); return webNodes(s) }
	// The first backoff (250 ms at most), the view's answer and a read
	// from the servers, with room for a busy machine.
	testenv.Eventually(t, 3*time.Second, "web as its servers have it (b), not as the lagging view does (a)", func() bool {
		return slices.Equal(nodes(), []string{"b"})
	})
	t.Logf("the servers' answer passed on %s after the failure", time.Since(cut).Round(10*time.Millisecond))
	// While the view lags, the servers are asked again at every poll,
	// and the view's stale answers change nothing.
	testenv.Eventually(t, 3*behindPoll, "the servers read again while the view lags", func() bool { return directs.Load() >= 2 })
	if got := nodes(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("while the view lags: %v, want [b]", got)
	}
	caught.Store(true)
	testenv.Eventually(t, 3*behindPoll, "the view followed again once it moved (c)", func() bool {
		return slices.Equal(nodes(), []string{"b", "c"})
	})
}

// webHealth is Consul's health answer for service web with an instance
// web-N on each node N (datacenter dc9).
func webHealth(nodes ...string) string {
	var es []string
	for _, n := range nodes {
		es = append(es, fmt.Sprintf(`{"Node": {"Node": %q, "Datacenter": "dc9"}, "Service": {"ID": %q, "Service": "web"}, "Checks": []}`, n, "web-"+n))
	}
	return "[" + strings.Join(es, ",") + "]"
}

// webCatalog answers as an agent whose cluster has a leader and a catalog
// of one service, web, on node a, whose lists never change (their
// blocking queries wait until cancelled). It reports whether it answered:
// other paths are the caller's.
func webCatalog(w http.ResponseWriter, r *http.Request) bool {
	switch r.URL.Path {
	case "/v1/status/leader":
		fmt.Fprint(w, `"10.0.0.2:8300"`)
	case "/v1/catalog/services", "/v1/catalog/nodes":
		if r.URL.Query().Get("index") != "" {
			<-r.Context().Done()
			return true
		}
		w.Header().Set("X-Consul-Index", "5")
		if r.URL.Path == "/v1/catalog/nodes" {
			fmt.Fprint(w, `[{"Node": "a", "Datacenter": "dc9"}]`)
			return true
		}
		fmt.Fprint(w, `{"web": []}`)
	default:
		return false
	}
	return true
}

// After a failure the agent's view of a service is checked against its
// servers (the leader). In a rolling restart of the servers the read may
// fail, or reach a server behind the view; neither tells whether the view
// lags, so neither is taken: the view is checked again at its next poll.
// An answer of the servers passed on while the view lagged is replaced
// once they agree with the view again. And a view that went back to an
// older state (resubscribed to a server still applying its log) is not
// followed until it has caught up, unless the servers too went back:
// Consul started over. Here the view serves web on node a at index 10
// before the failure.
func TestTheServersCheckOfAView(t *testing.T) {
	a := []string{"a"}
	tests := []struct {
		name   string
		view   []viewAnswer // after the failure, in turn; the last repeats
		reads  []viewAnswer // the servers' answers, in turn; the last repeats
		checks int32        // reads of the servers at least
		want   [][]string
		counts map[string]bool // the outcomes counted (ViewChecks), at least once
	}{
		{"a failed check is made again", []viewAnswer{{10, a}}, []viewAnswer{{0, nil}, {20, []string{"b"}}}, 2,
			[][]string{a, {"b"}}, map[string]bool{"unknown": true, "differed": true}},
		{"a server behind the view is not taken", []viewAnswer{{10, a}}, []viewAnswer{{5, []string{}}, {10, a}}, 2,
			[][]string{a}, map[string]bool{"unknown": true, "agreed": true}},
		{"the servers agreeing with the view again are followed", []viewAnswer{{10, a}}, []viewAnswer{{20, []string{"b"}}, {30, a}}, 2,
			[][]string{a, {"b"}, a}, map[string]bool{"differed": true, "agreed": true}},
		{"a view gone back to an older state is not followed", []viewAnswer{{5, []string{"a", "g"}}, {12, a}}, []viewAnswer{{10, a}}, 1,
			[][]string{a}, map[string]bool{"differed": true}},
		{"a view gone back is not followed while the servers cannot tell", []viewAnswer{{5, []string{"a", "g"}}, {5, []string{"a", "g"}}, {12, a}}, []viewAnswer{{0, nil}}, 1,
			[][]string{a}, map[string]bool{"unknown": true}},
		{"an older answer the servers confirm stands: Consul started over", []viewAnswer{{3, []string{"b"}}}, []viewAnswer{{3, []string{"b"}}}, 1,
			[][]string{a, {"b"}}, map[string]bool{"started_over": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var views, directs atomic.Int32
			r, broke := laggingView(t, inTurn(&views, tt.view), inTurn(&directs, tt.reads))
			close(broke)
			final := tt.want[len(tt.want)-1]
			// The backoff, the view's answer, a check, one poll of the
			// view (behindPoll) and the next check, with room to spare.
			testenv.Eventually(t, 3*behindPoll, fmt.Sprintf("%d reads of the servers", tt.checks), func() bool {
				return directs.Load() >= tt.checks
			})
			r.waitFor(fmt.Sprintf("web on %v", final), func(s model.Snapshot) bool { return slices.Equal(webNodes(s), final) })
			if tt.view[len(tt.view)-1].index > 10 {
				// The view caught up: followed again.
				testenv.Eventually(t, 3*behindPoll, "the view caught up", func() bool { return int(views.Load()) >= len(tt.view) })
				r.waitFor("the index the view caught up to", func(s model.Snapshot) bool { return s.Local() != nil && s.Local().Index >= 12 })
			}
			// A read is counted by the fake as it answers, its outcome by
			// the source once it has decoded the answer: wait for those.
			for _, o := range ViewCheckOutcomes {
				if tt.counts[o] {
					testenv.Eventually(t, 3*behindPoll, "a check counted "+o, func() bool { return r.src.ViewChecks(o) > 0 })
				}
			}
			var got [][]string
			for _, s := range r.history() {
				if n := webNodes(s); len(got) == 0 || !slices.Equal(n, got[len(got)-1]) {
					got = append(got, n)
				}
			}
			if !slices.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("web was served on %v in turn; want %v", got, tt.want)
			}
			for _, o := range ViewCheckOutcomes {
				if n := r.src.ViewChecks(o); (n > 0) != tt.counts[o] {
					t.Errorf("%d checks counted %s; want some: %v", n, o, tt.counts[o])
				}
			}
		})
	}
}

// viewAnswer is an answer of the view or the servers in laggingView.
type viewAnswer struct {
	index int
	nodes []string // nil: the read fails
}

// inTurn answers as, one after the other, counting them in n; the last
// repeats.
func inTurn(n *atomic.Int32, as []viewAnswer) func() viewAnswer {
	return func() viewAnswer { return as[min(int(n.Add(1)), len(as))-1] }
}

// laggingView starts a source on an agent whose view has web on node a at
// index 10, and holds its blocking query until broke is closed: then the
// query fails (a server shutting down) and the view answers view(), at
// once to a fresh read or one that waits on another index, else after
// the wait. A read from the servers (no index) answers servers().
func laggingView(t *testing.T, view, servers func() viewAnswer) (*running, chan struct{}) {
	t.Helper()
	var broken atomic.Bool
	brokeCh, blocking := make(chan struct{}), make(chan struct{}, 1)
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if webCatalog(w, r) {
			return
		}
		if r.URL.Path != "/v1/health/service/web" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		index := q.Get("index")
		answer := func(a viewAnswer) {
			if a.nodes == nil {
				http.Error(w, "rpc error making call: EOF", http.StatusInternalServerError)
				return
			}
			w.Header().Set("X-Consul-Index", strconv.Itoa(a.index))
			fmt.Fprint(w, webHealth(a.nodes...))
		}
		switch {
		case index == "": // the servers (the leader)
			if q.Has("stale") {
				http.Error(w, "a check reads from the leader: a server may be behind the view", http.StatusBadRequest)
				return
			}
			answer(servers())
		case !broken.Load() && index == "1":
			answer(viewAnswer{10, []string{"a"}})
		case !broken.Load(): // blocking until the servers restart
			select {
			case blocking <- struct{}{}:
			default:
			}
			select {
			case <-brokeCh:
				broken.Store(true)
				http.Error(w, "rpc error: server shutting down", http.StatusInternalServerError)
			case <-r.Context().Done():
			}
		default:
			a := view()
			if index != strconv.Itoa(a.index) && index != "10" {
				answer(a)
				return
			}
			d, err := time.ParseDuration(q.Get("wait"))
			if err != nil {
				http.Error(w, "no wait: "+err.Error(), http.StatusBadRequest)
				return
			}
			select {
			case <-time.After(d):
				answer(view())
			case <-r.Context().Done():
			}
		}
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("web-a", func(s model.Snapshot) bool { return slices.Equal(webNodes(s), []string{"a"}) })
	select {
	case <-blocking:
	case <-time.After(wait):
		t.Fatal("no blocking query on web")
	}
	return r, brokeCh
}

// webNodes are the nodes of service web's instances in s, sorted.
func webNodes(s model.Snapshot) []string {
	out := []string{}
	for _, in := range instances(s, "web") {
		out = append(out, in.Node)
	}
	slices.Sort(out)
	return out
}

// The agent's return ends every wait backing off, from one goroutine:
// a callback each on the recovery context took a goroutine each, all at
// once (10,000 of them with as many services).
func TestTheAgentsReturnEndsTheBackoffsFromOneGoroutine(t *testing.T) {
	const n = 1000
	p := newAgentProbe(nil, slog.New(slog.DiscardHandler))
	ctx := t.Context()
	p.observe(ctx, fmt.Errorf("connection refused"))
	release := make(chan struct{})
	var ended, goOn atomic.Int32
	for range n {
		p.backoffThen(ctx, p.recovery(), time.Hour, func(on bool) {
			if on {
				goOn.Add(1)
			}
			ended.Add(1)
			<-release
		})
	}
	before := runtime.NumGoroutine()
	p.observe(ctx, nil) // back
	testenv.Eventually(t, wait, "a wait ended", func() bool { return ended.Load() > 0 })
	if more := runtime.NumGoroutine() - before; more > 2 {
		t.Errorf("the agent's return took %d goroutines at once for %d waits, want at most 2", more, n)
	}
	close(release)
	testenv.Eventually(t, wait, "every wait ended", func() bool { return ended.Load() == n })
	if got := goOn.Load(); got != n {
		t.Errorf("%d of %d waits went on", got, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.backedOff != 0 || len(p.waits) != 0 {
		t.Errorf("after the return: %d backed off, %d waits kept", p.backedOff, len(p.waits))
	}
}
