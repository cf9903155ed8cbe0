package status

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The profiler answers on its own listener; the status endpoint has none.
func TestDebugServesProfilesAndStatusDoesNot(t *testing.T) {
	srv, err := ListenDebug("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	resp, err := http.Get("http://" + srv.Addr() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "goroutine profile") {
		t.Fatalf("goroutine profile: %d %.200s", resp.StatusCode, b)
	}
	// A profile as long as the write timeout is refused at once: nobody
	// holds the profiler (and a core) for hours.
	quick := &http.Client{Timeout: 10 * time.Second}
	resp, err = quick.Get("http://" + srv.Addr() + "/debug/pprof/profile?seconds=86400")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a day-long CPU profile: %d %.200s, want it refused", resp.StatusCode, b)
	}

	st, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), func() error { return nil }, func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	sdone := make(chan error, 1)
	sctx, scancel := context.WithCancel(context.Background())
	go func() { sdone <- st.Run(sctx) }()
	defer func() { scancel(); <-sdone }()
	resp, err = http.Get("http://" + st.Addr() + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("the status endpoint serves the profiler")
	}
}
