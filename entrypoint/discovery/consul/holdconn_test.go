package consul

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// testTransport is the transport under test, as the source builds it.
func testTransport(t *testing.T, keep int) http.RoundTripper {
	rt := newConnTransport(holdingTransport(http.DefaultTransport.(*http.Transport), keep), keep)
	t.Cleanup(rt.CloseIdleConnections)
	return rt
}

// countingServer is an httptest server that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func get(t *testing.T, rt http.RoundTripper, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

// getAll reads the whole answer to url.
func getAll(t *testing.T, rt http.RoundTripper, url string) (int, string) {
	t.Helper()
	resp, err := get(t, rt, context.Background(), url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// A connection is reused only after its body was read to the end: one
// closed early is closed (draining it could wait as long as the agent
// likes). A 5xx is an answer like any other.
func TestHeldConnReusedOnlyAfterItsBodyWasRead(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, strings.Repeat("x", 10000))
	})
	rt := testTransport(t, 8)
	for i := range 3 {
		if code, body := getAll(t, rt, srv.URL+"/"); code != 200 || len(body) != 10000 {
			t.Fatalf("answer %d: %d, %d bytes", i, code, len(body))
		}
	}
	if code, body := getAll(t, rt, srv.URL+"/fail"); code != 500 || !strings.Contains(body, "No cluster leader") {
		t.Errorf("5xx: %d %q", code, body)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 4 answers read to their end, want 1", n)
	}
	resp, err := get(t, rt, context.Background(), srv.URL+"/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // unread
	getAll(t, rt, srv.URL+"/")
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections after a body closed unread, want 2 (that one not reused)", n)
	}
}

// rawServer answers each connection with handle, on its own listener.
func rawServer(t *testing.T, handle func(c net.Conn, br *bufio.Reader)) (string, *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				handle(c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String(), &conns
}

// The agent closed an idle connection: the next GET on it fails before
// any answer, and is sent again once on a new connection, as net/http
// does.
func TestHeldConnRetriesAGetOnAConnClosedWhileIdle(t *testing.T) {
	closed := make(chan struct{}, 2)
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") // keep-alive, then close
		c.Close()
		closed <- struct{}{}
	})
	rt := testTransport(t, 8)
	for i := range 2 {
		if code, body := getAll(t, rt, url+"/v1/status/leader"); code != 200 || body != "ok" {
			t.Fatalf("answer %d: %d %q", i, code, body)
		}
		<-closed
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// An answer without a Content-Length ends when the agent closes the
// connection: the caller reads all of it, and the connection is not kept.
func TestHeldConnReadsAnAnswerThatEndsWithTheConn(t *testing.T) {
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
	})
	rt := testTransport(t, 8)
	for i := range 2 {
		var reused atomic.Bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused.Store(reused.Load() || info.Reused) }})
		resp, err := get(t, rt, ctx, url+"/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "until the end" {
			t.Fatalf("answer %d: %q %v", i, b, err)
		}
		if reused.Load() {
			t.Errorf("answer %d was sent on a connection whose last answer ended with it", i)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (none reused)", n)
	}
}

// A request cancelled while it waits for the answer, or halfway through
// the body, returns the context's error at once and closes its connection.
func TestHeldConnCancelled(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/quick" {
			fmt.Fprint(w, "quick")
			return
		}
		if r.URL.Path == "/half" {
			fmt.Fprint(w, "half")
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
	})
	rt := testTransport(t, 8)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := get(t, rt, ctx, srv.URL+"/wait")
		done <- err
	}()
	waitConns(t, conns, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled while waiting: %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	resp, err := get(t, rt, ctx, srv.URL+"/half")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "half" {
		t.Fatalf("first half: %q %v", buf, err)
	}
	cancel()
	if _, err := resp.Body.Read(buf); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled mid-body: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	getAll(t, rt, srv.URL+"/quick")
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3: a cancelled request's connection is not reused", n)
	}
}

func waitConns(t *testing.T, conns *atomic.Int32, n int32) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d connections", n), func() bool { return conns.Load() >= n })
}

// Like net/http: gzip asked for and decoded unless the caller chose an
// encoding; a decoded body read to its end gives its connection back.
func TestHeldConnDecodesGzip(t *testing.T) {
	plain := strings.Repeat(`{"Service":"web"}`, 200)
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "gzip" {
			fmt.Fprint(w, plain)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, plain)
		zw.Close()
	})
	rt := testTransport(t, 8)
	for i := range 3 {
		resp, err := get(t, rt, context.Background(), srv.URL+"/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != plain || !resp.Uncompressed || resp.Header.Get("Content-Encoding") != "" {
			t.Fatalf("answer %d: %d bytes, err %v, uncompressed %v, Content-Encoding %q",
				i, len(b), err, resp.Uncompressed, resp.Header.Get("Content-Encoding"))
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != plain || resp.Uncompressed {
		t.Errorf("an encoding the caller chose: %d bytes, uncompressed %v", len(b), resp.Uncompressed)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// A held query costs one goroutine, its caller's: net/http's Transport
// adds a reader and a writer per connection (3 per query; 3,000 at a
// thousand watched services), and their buffers. The agent is another process, so that
// every goroutine counted is the client's.
func TestHeldQueryCostsOneGoroutine(t *testing.T) {
	const n = 100
	addr, lines, release := holdingServer(t)
	url := "http://" + addr

	rt := testTransport(t, n)
	heapBefore, stacksBefore := heapAndStacks()
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			code, _, err := func() (int, string, error) {
				resp, err := get(t, rt, context.Background(), fmt.Sprintf("%s/v1/health/service/s%d?index=1&wait=5m", url, i))
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b), err
			}()
			if err == nil && code != 200 {
				err = fmt.Errorf("answered %d", code)
			}
			errs <- err
		})
	}
	for range n { // one line per request held
		if !lines.Scan() {
			t.Fatalf("the server stopped: %v", lines.Err())
		}
	}
	held := runtime.NumGoroutine() - before
	heapHeld, stacksHeld := heapAndStacks()
	heap, stacks := (heapHeld-heapBefore)/n, (stacksHeld-stacksBefore)/n
	release() // the server answers them all
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d held queries: %d goroutines; each %d bytes of heap, %d of stack", n, held, heap, stacks)
	if held > n+5 {
		t.Errorf("%d held queries run %d goroutines, want at most %d: one per query", n, held, n+5)
	}
	// No buffer while waiting (net/http's: 5-7 KiB per query, with small
	// buffers), nor a copy of the request.
	if heap > 2048 {
		t.Errorf("a held query keeps %d bytes of heap, want at most 2 KiB: its connection and its request", heap)
	}
}

// TestHoldingServerProcess is the agent of TestHeldQueryCostsOneGoroutine:
// it prints its address, then a line per request, and answers them all
// when its stdin closes.
func TestHoldingServerProcess(t *testing.T) {
	if os.Getenv("SEAMLESS_HOLDING_SERVER") != "1" {
		t.Skip("run by TestHeldQueryCostsOneGoroutine")
	}
	release := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(release)
	}()
	var mu sync.Mutex
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fmt.Println(r.URL.Path)
		mu.Unlock()
		<-release
		w.Header().Set("X-Consul-Index", "2")
		fmt.Fprint(w, "[]")
	}))
	if addr := os.Getenv("SEAMLESS_HOLDING_SERVER_ADDR"); addr != "" { // where an agent was
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv.Listener.Close()
		srv.Listener = l
	}
	srv.Start()
	fmt.Println(srv.Listener.Addr().String())
	<-release
	srv.Close()
}

func TestHeldConnDialsTheURLsHostAndPort(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8500/v1/agent/self": "127.0.0.1:8500",
		"http://consul/v1/agent/self":         "consul:80",
		"http://[::1]:8500/v1/agent/self":     "[::1]:8500",
		"http://[::1]/v1/agent/self":          "[::1]:80",
	} {
		req, err := http.NewRequest(http.MethodGet, in, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := hostPort(req); got != want {
			t.Errorf("%s dials %q, want %q", in, got, want)
		}
	}
}

// A held query's connection is dialled within its deadline: a replay to
// an agent whose address does not answer gave up only at the dialer's
// own timeout (3 s with several agents, 30 s with one), after the query
// was due.
func TestAHeldQueryDialsWithinItsDeadline(t *testing.T) {
	ct := newConnTransport(http.DefaultTransport.(*http.Transport).Clone(), 1)
	ct.dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
		<-ctx.Done() // an address that never answers
		return nil, ctx.Err()
	}
	req, err := http.NewRequest(http.MethodGet, "http://192.0.2.1:8500/v1/health/service/web?index=5", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ct.send(req, time.Now().Add(50*time.Millisecond))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("send: %v, want the deadline's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dial outlived the held query's deadline by 10 s")
	}
}
