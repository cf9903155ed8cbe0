package status

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	m := metrics.New()
	var down, unready, stale atomic.Bool
	unready.Store(true)
	srv, err := Listen("127.0.0.1:0", m.Registry, func() error {
		if down.Load() {
			return errors.New("haproxy master exited")
		}
		return nil
	}, func() error {
		if unready.Load() {
			return errors.New("source consul has not answered yet")
		}
		if stale.Load() {
			return &model.Degraded{Reason: "source consul is stale"}
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	defer func() { cancel(); wg.Wait() }()
	base := "http://" + srv.Addr()

	if code, body := get(t, base+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("healthy: %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "consul") {
		t.Errorf("not ready: %d %q", code, body)
	}
	unready.Store(false)
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Errorf("ready: %d %q", code, body)
	}
	stale.Store(true)
	if code, body := get(t, base+"/readyz"); code != 200 || !strings.Contains(body, "degraded: source consul is stale") {
		t.Errorf("degraded is still ready, and says why: %d %q", code, body)
	}
	down.Store(true)
	if code, body := get(t, base+"/healthz"); code != 503 || !strings.Contains(body, "master exited") {
		t.Errorf("unhealthy: %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "master exited") {
		t.Errorf("ready while unhealthy: %d %q", code, body)
	}

	m.Reloads.WithLabelValues(metrics.Success).Add(3)
	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{`seamless_reloads_total{result="success"} 3`, `seamless_reloads_total{result="failure"} 0`, "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestBusyAddressFailsAtStart(t *testing.T) {
	m := metrics.New()
	a, err := Listen("127.0.0.1:0", m.Registry, func() error { return nil }, func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.ln.Close()
	if _, err := Listen(a.Addr(), m.Registry, func() error { return nil }, func() error { return nil }, nil); err == nil {
		t.Error("a busy address was accepted")
	}
}
