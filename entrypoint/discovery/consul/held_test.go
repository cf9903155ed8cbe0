package consul

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// holdingServer starts TestHoldingServerProcess, an agent in a process of
// its own that holds every request until release is called, and returns
// its address and the lines it prints, one per request it holds.
func holdingServer(t *testing.T) (addr string, lines *bufio.Scanner, release func()) {
	t.Helper()
	return holdingServerAt(t, "")
}

// holdingServerAt is holdingServer listening on at ("": any port).
func holdingServerAt(t *testing.T, at string) (addr string, lines *bufio.Scanner, release func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHoldingServerProcess$")
	cmd.Env = append(os.Environ(), "SEAMLESS_HOLDING_SERVER=1", "SEAMLESS_HOLDING_SERVER_ADDR="+at)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if f, ok := stdout.(*os.File); ok {
		f.SetReadDeadline(time.Now().Add(30 * time.Second))
	}
	lines = bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("the server did not start: %v", lines.Err())
	}
	return lines.Text(), lines, func() { stdin.Close() }
}

// heldCatalog is a per-service catalog of room for n services, reading
// from a holding server whose lines are returned, past the service and
// node lists' requests.
func heldCatalog(t *testing.T, n int) (*splitCatalog, *bufio.Scanner) {
	t.Helper()
	addr, lines, release := holdingServer(t)
	t.Setenv("CONSUL_HTTP_ADDR", addr)
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	s, err := New(Config{Watches: n + 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newSplitCatalog(context.Background(), s, "", n+16, nil)
	t.Cleanup(c.stop)
	t.Cleanup(release) // first: the held queries answer, then stop waits for them
	for range 2 {
		if !lines.Scan() {
			t.Fatalf("the server stopped: %v", lines.Err())
		}
	}
	return c, lines
}

// noLateSetUps keeps every set-up's place for the test: none gives it up
// on a slow machine.
func noLateSetUps(t *testing.T) {
	late := setUpFor
	setUpFor = time.Hour
	t.Cleanup(func() { setUpFor = late })
}

// heapAndStacks is the live heap and the goroutines' stacks, in bytes.
func heapAndStacks() (heap, stacks int64) {
	for range 3 { // a stack shrinks at most once per collection
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), int64(ms.StackInuse)
}

// A watched service costs its held query's connection and little more:
// while the query waits, no goroutine holds its frames. Through the API
// client, 1,000 watched services cost 13 MiB; with a goroutine blocked in
// a read for each, 2 to 8 KiB of stack apiece.
func TestAWatchedServiceCostsASmallStack(t *testing.T) {
	const n = 200
	c, lines := heldCatalog(t, n)
	heapBefore, stacksBefore := heapAndStacks()
	goroutines := runtime.NumGoroutine()
	for i := range n {
		// Seeded at index 1: each query waits, as after a start.
		sb := &sub{kind: partHealth, name: "s" + strconv.Itoa(i), seed: 1}
		c.wg.Go(func() { c.run(c.ctx, sb) })
	}
	for range n {
		if !lines.Scan() {
			t.Fatalf("the server stopped: %v", lines.Err())
		}
	}
	heapHeld, stacksHeld := heapAndStacks()
	heap, stacks := (heapHeld-heapBefore)/n, (stacksHeld-stacksBefore)/n
	waiting := runtime.NumGoroutine() - goroutines
	t.Logf("%d watched services: %d goroutines; each %d bytes of heap, %d of stack",
		n, waiting, heap, stacks)
	// Parked, a held query has no goroutine: a few serve them all.
	if waiting > n/10 {
		t.Errorf("%d held queries keep %d goroutines, want at most %d", n, waiting, n/10)
	}
	if stacks > 1<<10 {
		t.Errorf("a watched service's held query keeps %d bytes of stack, want at most 1 KiB", stacks)
	}
	if heap > 3584 {
		t.Errorf("a watched service's held query keeps %d bytes of heap, want at most 3.5 KiB", heap)
	}
}

// A held health query is the request the API client sends for the same
// query: path (a hostile name escaped alike), parameters, token and
// authentication, so that an agent cannot tell them apart.
func TestAHeldHealthQueryIsTheClientsRequest(t *testing.T) {
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		w.Header().Set("X-Consul-Index", "9")
		w.Write([]byte("[]"))
	}))
	defer srv.Close()
	host := srv.Listener.Addr().String()
	for _, tc := range []struct {
		name string
		cfg  api.Config
		dc   string
		tag  string
	}{
		{name: "web", cfg: api.Config{}},
		{name: "we b/x?y=1#z%", cfg: api.Config{Token: "secret", Datacenter: "dc9"}, dc: "dc2", tag: "v1"},
		{name: "api", cfg: api.Config{Namespace: "team", Partition: "p1", WaitTime: time.Minute,
			HttpAuth: &api.HttpBasicAuth{Username: "u", Password: "p"}}},
		{name: "db", cfg: api.Config{Address: "http://" + host + "/prefix"}},
	} {
		cfg := tc.cfg
		if cfg.Address == "" {
			cfg.Address = host
		}
		client, err := api.NewClient(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		opts := &api.QueryOptions{Datacenter: tc.dc, AllowStale: true, WaitIndex: 7, WaitTime: 3 * time.Second}
		if _, _, err := client.Health().Service(tc.name, tc.tag, false, opts); err != nil {
			t.Fatal(err)
		}
		want := <-got
		req := newAgentRequest(&cfg).health(context.Background(), host, tc.dc, tc.name, tc.tag, true, 7, 3*time.Second)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		held := <-got
		if held.Method != want.Method || held.RequestURI != want.RequestURI {
			t.Errorf("%s: the held query asks %s %s, the client %s %s", tc.name, held.Method, held.RequestURI, want.Method, want.RequestURI)
		}
		for _, h := range []string{"X-Consul-Token", "Authorization", "Content-Type"} {
			if held.Header.Get(h) != want.Header.Get(h) {
				t.Errorf("%s: the held query's %s is %q, the client's %q", tc.name, h, held.Header.Get(h), want.Header.Get(h))
			}
		}
	}
}

// heldSource is a source on the agent at url (or on agents, in order) and
// a sub-watch of service web of its per-service catalog, ready for its
// next request.
func heldSource(t *testing.T, url string, agents ...string) (*splitCatalog, *subWatch) {
	t.Helper()
	t.Setenv("CONSUL_HTTP_ADDR", strings.TrimPrefix(url, "http://"))
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	s, err := New(Config{Watches: 8, Agents: agents}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &splitCatalog{s: s}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.restarted, c.restartCancel = context.WithCancel(c.ctx)
	t.Cleanup(c.cancel)
	w := &subWatch{c: c, ctx: c.ctx, sb: &sub{kind: partHealth, name: "web"}}
	w.prepare()
	return c, w
}

// holdOnce holds w's query waiting on index and returns its answer.
func holdOnce(t *testing.T, c *splitCatalog, w *subWatch, index uint64) (uint64, error) {
	t.Helper()
	h, err := c.holdHealth(w, index, time.Minute)
	if err != nil || h == nil {
		t.Fatalf("holding the query: %v (%v)", err, h)
	}
	h.wait()
	_, meta, err := h.answer()
	if err != nil {
		return 0, err
	}
	return meta.LastIndex, nil
}

// The agent closed an idle connection: a held query written on it is
// written again once on a new one, as the client's requests are.
func TestAHeldQueryOnAConnClosedWhileIdleIsSentAgain(t *testing.T) {
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Consul-Index: 5\r\nContent-Length: 2\r\n\r\n[]") // keep-alive, then close
	})
	c, w := heldSource(t, url)
	for i := range 2 {
		if index, err := holdOnce(t, c, w, 1); err != nil || index != 5 {
			t.Fatalf("answer %d: index %d, %v", i, index, err)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
	if s := c.s; s.started.Load() != 2 || s.finished.Load() != 2 {
		t.Errorf("%d requests started and %d finished, want 2 and 2", s.started.Load(), s.finished.Load())
	}
}

// A held query waiting on an index is cut short by Consul's restart (seen
// by another query) and is not sent again: the sub-watch reads afresh.
func TestAHeldQueryIsCutShortByARestart(t *testing.T) {
	url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		http.ReadRequest(br)
		io.Copy(io.Discard, br) // holds it
	})
	c, w := heldSource(t, url)
	w.cur.index = 3
	h, err := c.holdHealth(w, 3, time.Minute)
	if err != nil || h == nil {
		t.Fatalf("holding the query: %v (%v)", err, h)
	}
	done := make(chan error, 1)
	go func() {
		h.wait()
		_, _, err := h.answer()
		done <- err
	}()
	c.restart()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the query cut short answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a restart did not cut the held query short")
	}
}

// With several agents, a held query that its agent closed unanswered on a
// reused connection is sent again where a new query would go: that agent
// is gone, so to the next one, as the client's failover did.
func TestAReplayedHeldQueryFailsOverToTheNextAgent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Consul-Index: 5\r\nContent-Length: 2\r\n\r\n[]")
		// The agent goes: it takes no new connection, and answers
		// nothing on this one.
		ln.Close()
		http.ReadRequest(br)
	}()
	next, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Consul-Index: 7\r\nContent-Length: 2\r\n\r\n[]")
	})
	first := ln.Addr().String()
	c, w := heldSource(t, first, first, strings.TrimPrefix(next, "http://"))
	if index, err := holdOnce(t, c, w, 1); err != nil || index != 5 {
		t.Fatalf("the first answer: index %d, %v; want 5", index, err)
	}
	if index, err := holdOnce(t, c, w, 5); err != nil || index != 7 {
		t.Fatalf("the query sent again: index %d, %v; want 7, from the next agent", index, err)
	}
}

// A cut (Consul's restart, the agent's return) that comes once the answer
// has begun leaves its connection alone: read to its end, the connection
// went back to the pool, where the next request takes it. Before, such a
// cut closed it under whichever request had taken it.
func TestALateCutLeavesThePooledConnectionAlone(t *testing.T) {
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Consul-Index: 5\r\nContent-Length: 2\r\n\r\n[]")
		}
	})
	c, w := heldSource(t, url)
	h, err := c.holdHealth(w, 1, time.Minute)
	if err != nil || h == nil {
		t.Fatalf("holding the query: %v (%v)", err, h)
	}
	h.wait()
	if _, _, err := h.answer(); err != nil {
		t.Fatal(err)
	}
	h.cutShort() // as a restart that took h before its uncut
	if index, err := holdOnce(t, c, w, 1); err != nil || index != 5 {
		t.Fatalf("the next query: index %d, %v", index, err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1: the cut closed the pooled connection", n)
	}
}

// A held query that cannot be written says which service it was for, as a
// query that failed later does.
func TestAHeldQueryThatCannotBeSentNamesItsService(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there any more
	c, w := heldSource(t, "http://"+addr)
	h, err := c.holdHealth(w, 1, time.Minute)
	if err == nil || h != nil {
		t.Fatalf("holding a query to %s: %v, %v; want an error", addr, h, err)
	}
	if !strings.Contains(err.Error(), `reading service "web"`) {
		t.Errorf("the error does not name the service: %v", err)
	}
}

// With several agents, a query is held only when the proxy rule sends
// none of them through a proxy: a held query fails over on its own
// connections, and would reach directly an agent that NO_PROXY does not
// name. Before, only the first agent was asked.
func TestAHeldQueryIsNotHeldWhenAnotherAgentIsProxied(t *testing.T) {
	url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Consul-Index: 5\r\nContent-Length: 2\r\n\r\n[]")
	})
	first, second := strings.TrimPrefix(url, "http://"), "127.0.0.1:1"
	c, w := heldSource(t, url, first, second)
	// The environment's rule is read once per process; this one proxies
	// the second agent alone, as NO_PROXY=127.0.0.1:<first port> would.
	c.s.conns.proxied = func(r *http.Request) bool { return r.URL.Host == second }
	h, err := c.holdHealth(w, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if h != nil {
		t.Error("the query was held, though the second agent is reached through a proxy")
	}
}

// The seeded queries are set up a few at a time: each takes a goroutine
// (and its stack) until its request is written, and 10,000 started at
// once took 51 MB of stacks for a moment, the most the process held.
func TestSeededQueriesAreSetUpAFewAtATime(t *testing.T) {
	const n = 500
	c, lines := heldCatalog(t, n)
	noLateSetUps(t)
	var mu sync.Mutex
	inSetUp, most := 0, 0
	runs := make([]func(func()), n)
	for i := range runs {
		// Seeded at index 1: each query waits, as after a start.
		_, run := c.seeded("s"+strconv.Itoa(i), 1, [32]byte{})
		runs[i] = func(setUp func()) {
			mu.Lock()
			inSetUp++
			most = max(most, inSetUp)
			mu.Unlock()
			run(func() {
				mu.Lock()
				inSetUp--
				mu.Unlock()
				setUp()
			})
		}
	}
	c.startOnceServing(runs)
	for range n {
		if !lines.Scan() {
			t.Fatalf("the server stopped: %v", lines.Err())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most > setUpAtOnce {
		t.Errorf("%d of %d seeded queries were in set-up at once, want at most %d", most, n, setUpAtOnce)
	}
	if most == 0 {
		t.Error("no seeded query was set up")
	}
}

// When the agent is back, the queries backing off go on through the
// starter too, a few at a time: a goroutine each at once cost as much as
// the seeded start did.
func TestTheAgentsReturnSetsTheQueriesUpAFewAtATime(t *testing.T) {
	const n = 300
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing answers there until the agent is back
	noLateSetUps(t)
	t.Setenv("CONSUL_HTTP_ADDR", addr)
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	s, err := New(Config{Watches: n + 16, retry: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newSplitCatalog(context.Background(), s, "", n+16, nil)
	defer c.stop()
	go func() { // the failures' events
		for {
			select {
			case <-c.events:
			case <-c.ctx.Done():
				return
			}
		}
	}()
	for i := range n {
		sb := &sub{kind: partHealth, name: "s" + strconv.Itoa(i), seed: 1}
		c.wg.Go(func() { c.run(c.ctx, sb) })
	}
	testenv.Eventually(t, wait, "every query backing off", func() bool {
		s.probe.mu.Lock()
		defer s.probe.mu.Unlock()
		return s.probe.backedOff >= n
	})
	_, lines, release := holdingServerAt(t, addr)
	defer release()

	before := runtime.NumGoroutine()
	most := make(chan int)
	done := make(chan struct{})
	go func() { // counts itself
		m := 0
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				most <- m
				return
			case <-tick.C:
				m = max(m, runtime.NumGoroutine()-before)
			}
		}
	}()
	s.probe.observe(t.Context(), errors.New("connection refused"))
	s.probe.observe(t.Context(), nil) // back
	for held := 0; held < n; {
		if !lines.Scan() {
			t.Fatalf("the server stopped: %v", lines.Err())
		}
		if strings.HasPrefix(lines.Text(), "/v1/health/service/") {
			held++
		}
	}
	close(done)
	// Besides those in set-up, a few: the counter, the one that ends the
	// waits, the starter's, the two lists' reads held on their goroutines
	// beneath net/http's, those that just left set-up.
	if got, want := <-most, n/6; got > want {
		t.Errorf("the agent's return to %d queries backing off took up to %d goroutines at once, want at most %d", n, got, want)
	}
}

// closeWaits is a connection whose Close waits for release.
type closeWaits struct {
	net.Conn
	release         chan struct{}
	closing, closed *atomic.Int32
}

func (c closeWaits) Close() error {
	c.closing.Add(1)
	<-c.release
	c.closed.Add(1)
	return nil
}

// Consul's restart cuts the held queries short on the goroutine that saw
// it, and the agent's return after a cut on one goroutine: a callback
// each on the context took 200 bytes a query and, when it ended, a
// goroutine each at once.
func TestARestartCutsTheHeldQueriesFromOneGoroutine(t *testing.T) {
	const n = 1000
	for _, event := range []string{"restart", "reconnection"} {
		t.Run(event, func(t *testing.T) {
			s := &Source{probe: newAgentProbe(nil, slog.New(slog.DiscardHandler))}
			c := &splitCatalog{s: s}
			c.ctx, c.cancel = context.WithCancel(t.Context())
			defer c.cancel()
			c.restarted, c.restartCancel = context.WithCancel(c.ctx)
			epoch, reconnection := c.restartCtx(), s.probe.reconnection()
			release := make(chan struct{})
			var closing, closed atomic.Int32
			held := make([]*heldHealth, n)
			for i := range held {
				h := &heldHealth{s: s, c: c, onRestart: true, conn: &heldConn{Conn: closeWaits{release: release, closing: &closing, closed: &closed}}}
				c.cutAtRestart(epoch, h)
				s.probe.cutAtReconnection(reconnection, h)
				held[i] = h
			}
			before := runtime.NumGoroutine()
			if event == "restart" {
				go c.restart()
			} else {
				s.probe.observe(t.Context(), errors.New("connection refused"))
				s.probe.observe(t.Context(), errors.New("connection refused")) // cut from its servers
				s.probe.observe(t.Context(), nil)
			}
			testenv.Eventually(t, wait, "a cut", func() bool { return closing.Load() > 0 })
			if more := runtime.NumGoroutine() - before; more > 2 {
				t.Errorf("the %s took %d goroutines at once for %d held queries, want at most 2", event, more, n)
			}
			close(release)
			testenv.Eventually(t, wait, "every held query cut", func() bool { return closed.Load() == n })
			for _, h := range held {
				h.uncut()
			}
			if len(c.restartHeld) != 0 || len(s.probe.reheld) != 0 {
				t.Errorf("after uncut: %d kept for a restart, %d for a reconnection", len(c.restartHeld), len(s.probe.reheld))
			}
		})
	}
}
