package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// With SEAMLESS_HEALTH_CHECKS=false no server is checked by HAProxy, and
// every membership change still goes over the runtime API, verified, with
// no reload: an instance turning passing, one added, a weight changed, one
// removed. Consul's health alone decides.
func TestRuntimeUpdatesWithoutHealthChecks(t *testing.T) {
	r := newDiscoveryRig(t)
	r.extraEnv = []string{"SEAMLESS_HEALTH_CHECKS=false", "SEAMLESS_SERVER_SLOTS=8", "SEAMLESS_DRAIN_TIMEOUT=1s"}
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2", "web3"} {
		r.ports[n] = namedBackend(t, n)
	}
	registerExternal(t, c, "web1", "web", r.ports["web1"], api.HealthPassing, r.hostTag)
	registerExternal(t, c, "web2", "web", r.ports["web2"], api.HealthCritical, r.hostTag)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1")
	cfg, err := os.ReadFile(filepath.Join(r.stateDir, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?m)^\s*(default-)?server .*\bcheck\b`).Match(cfg) {
		t.Fatalf("a server is checked with SEAMLESS_HEALTH_CHECKS=false:\n%s", cfg)
	}
	reloads, updates := in.metric(successes), in.metric(runtimeUpdates)

	t.Log("web2 critical → passing")
	registerExternal(t, c, "web2", "web", r.ports["web2"], api.HealthPassing, r.hostTag)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")

	t.Log("web3 added")
	registerExternal(t, c, "web3", "web", r.ports["web3"], api.HealthPassing, r.hostTag)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2", "web3")

	t.Log("web3's weight 1 → 7")
	_, err = c.Catalog().Register(&api.CatalogRegistration{Node: "node-web3", Address: "127.0.0.1",
		Service: &api.AgentService{ID: "web3", Service: "web", Address: "127.0.0.1", Port: r.ports["web3"],
			Tags: []string{r.hostTag}, Weights: api.AgentWeights{Passing: 7, Warning: 1}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "HAProxy runs web3 with weight 7", func() bool {
		out, err := in.cli().Do(t.Context(), "@1 show servers state http-web")
		if err != nil {
			return false
		}
		states, err := haproxy.ParseServersState(out)
		if err != nil {
			return false
		}
		for _, s := range states {
			if s.Port == r.ports["web3"] {
				return s.Weight == 7
			}
		}
		return false
	})

	t.Log("web1 removed")
	if _, err := c.Catalog().Deregister(&api.CatalogDeregistration{Node: "node-web1"}, nil); err != nil {
		t.Fatal(err)
	}
	r.eventuallyServedBy(t, "127.0.0.1", "web2", "web3")

	if got := in.metric(successes); got != reloads {
		t.Errorf("%v reloads, want none: every change fits the slots", got-reloads)
	}
	if got := in.metric(runtimeUpdates); got < updates+4 {
		t.Errorf("%v runtime updates, want at least 4", got-updates)
	}
	if regexp.MustCompile(`runtime update failed`).MatchString(in.out.String()) {
		t.Error("a runtime update failed and fell back to a reload")
	}
	// HAProxy would take "set server … health up" without a check; it is
	// not sent, since the health is the source's.
	sent := regexp.MustCompile(`msg="runtime commands".*`).FindAllString(in.out.String(), -1)
	if len(sent) == 0 {
		t.Error("no runtime commands logged")
	}
	for _, l := range sent {
		if regexp.MustCompile(`\bhealth\b`).MatchString(l) {
			t.Errorf("a health command was sent to a server without check: %s", l)
		}
	}
}

// SEAMLESS_PASSIVE_CHECKS=true: three of five replicas refuse
// connections while Consul lists them passing (a replica that crashed, or
// stopped before its removal was applied, is that until Consul's check or
// seamless catch up), and no request fails: the first connection each
// refuses takes it out of rotation and the request goes to a live
// replica. Without the option HAProxy's checks need three failures, 2 s
// apart, and requests fail meanwhile.
func TestPassiveChecksTakeRefusingReplicasOutAtOnce(t *testing.T) {
	r := newDiscoveryRig(t)
	r.extraEnv = []string{"SEAMLESS_PASSIVE_CHECKS=true"}
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2"} {
		r.ports[n] = namedBackend(t, n)
	}
	for i, p := range testenv.FreePorts(t, 3) { // nothing listens there
		r.ports[fmt.Sprintf("dead%d", i)] = p
	}
	for n, p := range r.ports {
		registerExternal(t, c, n, "web", p, api.HealthPassing, r.hostTag)
	}
	r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")

	loads := startLoadOn(t, r.http, 30*time.Second)
	for _, l := range loads {
		testenv.Eventually(t, 20*time.Second, "2,000 requests", func() bool { return l.Snapshot().Requests > 2000 })
	}
	for i, l := range loads {
		res := l.Stop()
		t.Logf("%s: %d requests, %d failed %v", []string{"new connection", "keep-alive"}[i], res.Requests, res.Failed, res.Errors)
		if res.Failed != 0 {
			t.Errorf("%d of %d requests failed: %v", res.Failed, res.Requests, res.Errors)
		}
	}
}
