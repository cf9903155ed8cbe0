package main

import (
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/config"
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
