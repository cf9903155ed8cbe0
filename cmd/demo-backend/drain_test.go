package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// sigterm stops the backend as SIGTERM does and returns its exit code on
// the channel, once it has drained.
func sigterm(t *testing.T, log *syncBuffer, stop func() int) <-chan int {
	t.Helper()
	stopped := make(chan int, 1)
	go func() { stopped <- stop() }()
	testenv.Eventually(t, 10*time.Second, "draining", func() bool { return strings.Contains(log.String(), "draining") })
	return stopped
}

// servingBackend starts backend b1 with the drain flags, on a port of
// its own, once it answers.
func servingBackend(t *testing.T, drainFlags ...string) (addr string, log *syncBuffer, stop func() int) {
	t.Helper()
	addr = testenv.Addr(testenv.FreePort(t))
	log, stop = backend(t, append([]string{"-listen", addr, "-name", "b1"}, drainFlags...)...)
	testenv.Eventually(t, 10*time.Second, "serving", func() bool {
		code, _ := testenv.Get("http://" + addr + "/")
		return code == 200
	})
	return addr, log, stop
}

// TestDrainLastsWhileRequestsCome: past -drain, a backend that still gets
// requests keeps serving them (a load balancer slower than the drain) and
// stops once they have stopped for -drain-idle.
func TestDrainLastsWhileRequestsCome(t *testing.T) {
	addr, log, stop := servingBackend(t, "-drain", "300ms", "-drain-idle", "700ms", "-drain-max", "30s")
	stopped := sigterm(t, log, stop)
	// Ten times -drain, every request answered.
	n, until := 0, time.Now().Add(3*time.Second)
	for ; time.Now().Before(until) && n < 100_000; n++ {
		if code, body := testenv.Get("http://" + addr + "/"); code != 200 || body != "hello from b1" {
			t.Fatalf("request %d into the drain: %d %q", n, code, body)
		}
	}
	select {
	case code := <-stopped:
		if code != 0 {
			t.Errorf("exit code %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the backend did not stop once requests stopped")
	}
	if l := log.String(); !strings.Contains(l, "no request came for -drain-idle") {
		t.Errorf("want the drain ended by the idle time; log:\n%s", l)
	}
	t.Logf("%d requests answered past the 300ms drain", n)
}

// TestDrainEndsAtItsBound: requests that never stop do not hold a backend
// past -drain-max.
func TestDrainEndsAtItsBound(t *testing.T) {
	addr, log, stop := servingBackend(t, "-drain", "200ms", "-drain-idle", "5s", "-drain-max", "1500ms")
	stopped := sigterm(t, log, stop)
	until := time.Now().Add(15 * time.Second)
	for time.Now().Before(until) {
		if code, _ := testenv.Get("http://" + addr + "/"); code != 200 {
			break
		}
	}
	select {
	case code := <-stopped:
		if code != 0 {
			t.Errorf("exit code %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the backend kept serving past its bound while requests came")
	}
	if l := log.String(); !strings.Contains(l, "the drain's bound (-drain-max)") {
		t.Errorf("want the drain ended by its bound; log:\n%s", l)
	}
}

// TestDeregistrationIsRetried: an agent that fails the deregistration
// (a 500 here, an overloaded agent in the field) is asked again: left
// registered, the instance would be routed to until its check failed,
// after it stopped.
func TestDeregistrationIsRetried(t *testing.T) {
	var deregs atomic.Int32
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/v1/agent/service/register":
			_, _ = io.Copy(io.Discard, r.Body)
		case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/agent/service/deregister/"):
			if deregs.Add(1) < 3 {
				http.Error(w, "rpc error: timed out", http.StatusInternalServerError)
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer agent.Close()
	addr := testenv.Addr(testenv.FreePort(t))
	log, stop := backend(t, "-listen", addr, "-consul", agent.URL, "-resync", "1h", "-drain", "100ms", "-drain-idle", "0")
	testenv.Eventually(t, 10*time.Second, "registered", func() bool { return strings.Contains(log.String(), "registered in consul") })
	if code := <-sigterm(t, log, stop); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if n := deregs.Load(); n != 3 {
		t.Errorf("%d deregistrations, want 3 (two refused)", n)
	}
	l := log.String()
	if !strings.Contains(l, "retrying") || !strings.Contains(l, "deregistered from consul") {
		t.Errorf("want the deregistration retried until it succeeded; log:\n%s", l)
	}
}

// TestACatalogThatStillListsTheInstanceIsCleared: an agent answers 200 to
// a deregistration whose sync to its servers failed (its anti-entropy run
// would remove the instance up to a minute later, routed to all along).
// The backend sees the catalog still listing it, deregisters it from the
// catalog, and drains only once it has left.
func TestACatalogThatStillListsTheInstanceIsCleared(t *testing.T) {
	var (
		mu                 sync.Mutex
		listed             = true
		cleared            string // the catalog deregistration's body
		filter             string // the catalog read's
		deregAt, clearedAt time.Time
	)
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/v1/agent/service/register":
			_, _ = io.Copy(io.Discard, r.Body)
		case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/agent/service/deregister/"):
			mu.Lock()
			defer mu.Unlock()
			deregAt = time.Now()
		case r.Method == http.MethodGet && r.URL.Path == "/v1/agent/self":
			io.WriteString(w, `{"Config":{"NodeName":"node-1"}}`)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/catalog/service/web":
			mu.Lock()
			defer mu.Unlock()
			filter = r.URL.Query().Get("filter")
			if !listed {
				io.WriteString(w, "[]")
				return
			}
			io.WriteString(w, `[{"Node":"node-1","ServiceID":"web-1","ServiceName":"web"}]`)
		case r.Method == http.MethodPut && r.URL.Path == "/v1/catalog/deregister":
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			defer mu.Unlock()
			listed, cleared, clearedAt = false, string(b), time.Now()
			io.WriteString(w, "true")
		default:
			http.NotFound(w, r)
		}
	}))
	defer agent.Close()
	addr := testenv.Addr(testenv.FreePort(t))
	log, stop := backend(t, "-listen", addr, "-consul", agent.URL, "-service", "web", "-id", "web-1",
		"-resync", "1h", "-drain", "100ms", "-drain-idle", "0", "-drain-max", "10s")
	testenv.Eventually(t, 10*time.Second, "registered", func() bool { return strings.Contains(log.String(), "registered in consul") })
	if code := <-sigterm(t, log, stop); code != 0 {
		t.Errorf("exit code %d", code)
	}
	mu.Lock()
	defer mu.Unlock()
	var body struct{ Node, ServiceID string }
	if err := json.Unmarshal([]byte(cleared), &body); err != nil || body.Node != "node-1" || body.ServiceID != "web-1" {
		t.Errorf("catalog deregistration %q (%v), want node-1 and web-1", cleared, err)
	}
	if want := "Node == `node-1` and ServiceID == `web-1`"; filter != want {
		t.Errorf("catalog read with filter %q, want %q", filter, want)
	}
	if d := clearedAt.Sub(deregAt); d < catalogGrace {
		t.Errorf("cleared from the catalog %s after the agent's deregistration, want %s of grace first", d, catalogGrace)
	}
	l := log.String()
	left, drain := strings.Index(l, "left the catalog"), strings.Index(l, "draining")
	if left < 0 || drain < left {
		t.Errorf("want the drain to begin once the instance left the catalog; log:\n%s", l)
	}
}
