package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// SEAMLESS_CONSUL_ADDRS reaches the Consul source: a CONSUL_HTTP_ADDR that
// names another preferred agent is refused at start, naming both.
func TestConsulAgentsReachTheSource(t *testing.T) {
	t.Setenv("SEAMLESS_SOURCES", "consul")
	t.Setenv("SEAMLESS_CONSUL_ADDRS", "127.0.0.1:8500,127.0.0.1:8501")
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:9999")
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	_, err = newRawSources(cfg, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "CONSUL_HTTP_ADDR") || !strings.Contains(err.Error(), "127.0.0.1:8500,127.0.0.1:8501") {
		t.Errorf("error %v, want one naming CONSUL_HTTP_ADDR and the list of agents", err)
	}
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:8500")
	if _, err := newRawSources(cfg, nil, nil); err != nil {
		t.Errorf("CONSUL_HTTP_ADDR naming the first agent: %v", err)
	}
}

// SEAMLESS_CONSUL_QUERY_WAIT is the wait of the Consul source's blocking
// queries (the consul package's tests show what the wait does).
func TestConsulQueryWaitReachesTheSource(t *testing.T) {
	waits := make(chan string, 8)
	consul := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Has("index") {
			select {
			case waits <- q.Get("wait"):
			default:
			}
			<-r.Context().Done() // nothing changes
			return
		}
		w.Header().Set("X-Consul-Index", "1")
		switch r.URL.Path {
		case "/v1/status/leader":
			fmt.Fprint(w, `"10.0.0.1:8300"`)
		case "/v1/catalog/services":
			fmt.Fprint(w, `{}`)
		default:
			fmt.Fprint(w, `[]`)
		}
	}))
	t.Cleanup(consul.Close)
	t.Setenv("SEAMLESS_SOURCES", "consul")
	t.Setenv("SEAMLESS_CONSUL_QUERY_WAIT", "7s")
	t.Setenv("CONSUL_HTTP_ADDR", strings.TrimPrefix(consul.URL, "http://"))
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := newRawSources(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srcs[0].(model.Wanter).Want([]model.Query{model.LocalCatalog})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srcs[0].Run(ctx, make(chan model.Snapshot, 16))
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case w := <-waits:
		if d, err := time.ParseDuration(w); err != nil || d != 7*time.Second {
			t.Errorf("a blocking query waits %q, want SEAMLESS_CONSUL_QUERY_WAIT's 7s", w)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no blocking query within 30s")
	}
}
