package main

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// A Consul agent that stops answering (cut off, restarted) makes the
// source fail long before it is stale (a blocking query's minute plus a
// margin): /readyz stays 200, since the last good data serves, but says
// so, and says it no more once Consul answers again.
func TestReadyzNamesASourceThatFails(t *testing.T) {
	r := newDiscoveryRig(t)
	r.ports["web1"] = namedBackend(t, "web1")
	registerExternal(t, r.consul.Client(), "web1", "web", r.ports["web1"], api.HealthPassing, r.hostTag)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1")

	r.consul.Stop()
	var code int
	var body string
	defer func() {
		if t.Failed() {
			t.Logf("last /readyz: %d %q", code, body)
		}
	}()
	testenv.Eventually(t, 20*time.Second, "/readyz names the failing source", func() bool {
		code, body = testenv.Get("http://" + in.status + "/readyz")
		return strings.Contains(body, "degraded") && strings.Contains(body, "source consul")
	})
	if code != 200 {
		t.Errorf("/readyz = %d %q while Consul is away: the last good data serves, want 200", code, body)
	}
	if got := servedBy(r.http, "127.0.0.1", 4); got["web1"] != 4 {
		t.Errorf("while Consul is away: served by %v", got)
	}
	r.consul.Start()
	testenv.Eventually(t, 30*time.Second, "/readyz plain ok once Consul answers again", func() bool {
		code, body = testenv.Get("http://" + in.status + "/readyz")
		return code == 200 && strings.TrimSpace(body) == "ok"
	})
}
