package main

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// syncBuffer collects a backend's log while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// backend runs the command in the test until the returned stop is called;
// stop cancels it (as SIGTERM does) and returns its exit code.
func backend(t *testing.T, args ...string) (log *syncBuffer, stop func() int) {
	t.Helper()
	log = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"demo-backend"}, args...), log, log) }()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(20 * time.Second):
				// Errorf: stop may run on a goroutine of the test's.
				t.Errorf("the backend did not stop within 20s; log:\n%s", log)
			}
		})
		return code
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("backend log:\n%s", log)
		}
	})
	return log, stop
}

func healthy(t *testing.T, c *api.Client, service string) []*api.ServiceEntry {
	t.Helper()
	entries, _, err := c.Health().Service(service, "", true, nil)
	if err != nil {
		t.Logf("health query: %v", err)
		return nil
	}
	return entries
}

// TestRegistersAndDrains: the backend registers with its tags and an HTTP
// check that passes, and at SIGTERM leaves the catalog while it still
// serves; only then does it stop.
func TestRegistersAndDrains(t *testing.T) {
	consul := testenv.Consul(t)
	c := consul.Client()
	addr := testenv.Addr(testenv.FreePort(t))
	log, stop := backend(t, "-listen", addr, "-name", "b1", "-consul", consul.Addr(),
		"-service", "web", "-tags", "seamless.http.host=example.com,seamless.http.path=/api",
		"-check-interval", "200ms", "-drain", "1s")

	var entry *api.ServiceEntry
	testenv.Eventually(t, 20*time.Second, "the backend registered and its check passes", func() bool {
		es := healthy(t, c, "web")
		if len(es) == 1 {
			entry = es[0]
		}
		return entry != nil
	})
	host, port, _ := net.SplitHostPort(addr)
	svc := entry.Service
	if svc.Address != host || strconv.Itoa(svc.Port) != port || svc.ID != "web-"+host+"-"+port ||
		!slices.Equal(svc.Tags, []string{"seamless.http.host=example.com", "seamless.http.path=/api"}) {
		t.Errorf("registered %+v", svc)
	}
	if len(entry.Checks) < 1 || !slices.ContainsFunc(entry.Checks, func(h *api.HealthCheck) bool {
		return h.ServiceID == svc.ID && h.Type == "http" && h.Status == api.HealthPassing
	}) {
		t.Errorf("no passing HTTP check on the service: %+v", entry.Checks)
	}

	stopped := make(chan int, 1)
	go func() { stopped <- stop() }()
	// The registration is gone while the backend still answers: the drain.
	testenv.Eventually(t, 10*time.Second, "the backend left the catalog", func() bool {
		svcs, _, err := c.Catalog().Service("web", "", nil)
		return err == nil && len(svcs) == 0
	})
	if code, body := testenv.Get("http://" + addr + "/"); code != 200 || body != "hello from b1" {
		t.Errorf("during the drain: %d %q, want the backend still serving", code, body)
	}
	if code := <-stopped; code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("still listening after it stopped")
	}
	l := log.String()
	dereg, left, drain, stop2 := strings.Index(l, "deregistered from consul"), strings.Index(l, "left the catalog"),
		strings.Index(l, "draining"), strings.Index(l, "stopped")
	if dereg < 0 || left < dereg || drain < left || stop2 < drain || strings.Contains(l, "level=WARN") {
		t.Errorf("want deregistered, left the catalog, draining, then stopped in the log, no warning:\n%s", l)
	}
}

// TestRegistersAgain: a registration the agent lost (an agent restarted in
// -dev mode) comes back at the next resync.
func TestRegistersAgain(t *testing.T) {
	consul := testenv.Consul(t)
	c := consul.Client()
	addr := testenv.Addr(testenv.FreePort(t))
	backend(t, "-listen", addr, "-consul", consul.Addr(), "-id", "web-1",
		"-check-interval", "200ms", "-resync", "100ms", "-drain", "0")
	testenv.Eventually(t, 20*time.Second, "registered", func() bool { return len(healthy(t, c, "web")) == 1 })
	if err := c.Agent().ServiceDeregister("web-1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "registered again", func() bool {
		svc, _, err := c.Agent().Service("web-1", nil)
		return err == nil && svc != nil
	})
}

// TestWaitsForConsul: an agent that is not up yet is retried; a backend
// stopped before it ever registered stops without a drain.
func TestWaitsForConsul(t *testing.T) {
	addr := testenv.Addr(testenv.FreePort(t))
	log, stop := backend(t, "-listen", addr, "-consul", testenv.Addr(testenv.FreePort(t)), "-drain", "1m")
	testenv.Eventually(t, 10*time.Second, "a failed registration is retried", func() bool {
		return strings.Count(log.String(), "consul registration failed; retrying") >= 2
	})
	if code, body := testenv.Get("http://" + addr + "/"); code != 200 || body != "hello from "+addr {
		t.Errorf("serves while Consul is away: %d %q", code, body)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if l := log.String(); !strings.Contains(l, "never registered") || strings.Contains(l, "draining") {
		t.Errorf("want a stop without drain:\n%s", l)
	}
}

// TestDrainWithoutConsul: -drain alone keeps serving after SIGTERM, for a
// load balancer that watches the container engine instead of Consul.
func TestDrainWithoutConsul(t *testing.T) {
	addr := testenv.Addr(testenv.FreePort(t))
	log, stop := backend(t, "-listen", addr, "-name", "b1", "-drain", "2s")
	testenv.Eventually(t, 10*time.Second, "serving", func() bool {
		code, _ := testenv.Get("http://" + addr + "/")
		return code == 200
	})
	stopped := make(chan int, 1)
	go func() { stopped <- stop() }()
	testenv.Eventually(t, 10*time.Second, "draining", func() bool { return strings.Contains(log.String(), "draining") })
	if code, body := testenv.Get("http://" + addr + "/"); code != 200 || body != "hello from b1" {
		t.Errorf("during the drain: %d %q", code, body)
	}
	if code := <-stopped; code != 0 {
		t.Errorf("exit code %d", code)
	}
}
