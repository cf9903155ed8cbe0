package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/internal/testenv"
)

const (
	runtimeUpdates = `seamless_runtime_updates_total{result="success"}`
	connsViaWorker = `seamless_runtime_connections_total{via="worker"}`
	connsViaMaster = `seamless_runtime_connections_total{via="master"}`
)

// Scaling 2 → 8 → 2 under load changes servers over the runtime API: no
// reload, no new worker, no failed request, and requests in flight on the
// removed instances finish. A ninth instance outgrows the slots: exactly
// one reload, still lossless.
func TestScalingWithoutReloads(t *testing.T) {
	r := newDiscoveryRig(t)
	// 8 → 2 removes 75 % at once: the removal guard holds it, briefly.
	r.extraEnv = []string{"SEAMLESS_SERVER_SLOTS=8", "SEAMLESS_DRAIN_TIMEOUT=3s", "SEAMLESS_REMOVAL_HOLD=1s"}
	c := r.consul.Client()
	var names []string
	for i := 1; i <= 9; i++ {
		n := fmt.Sprintf("web%d", i)
		names = append(names, n)
		r.ports[n] = namedBackend(t, n)
	}
	for _, n := range names[:2] {
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing, r.hostTag)
	}
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", names[:2]...)
	workers := in.showProc().Workers
	reloads := in.metric(successes)
	viaWorker, viaMaster, updates := in.metric(connsViaWorker), in.metric(connsViaMaster), in.metric(runtimeUpdates)
	loads := startLoadOn(t, r.http, 2*time.Minute)

	t.Log("2 → 8")
	for _, n := range names[2:8] {
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing, r.hostTag)
	}
	r.eventuallyServedBy(t, "127.0.0.1", names[:8]...)

	t.Log("8 → 2 with a slow request in flight on every instance")
	var wg sync.WaitGroup
	slow := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			code, body := getHost(r.http, "127.0.0.1", "/?slow=1500")
			slow <- fmt.Sprintf("%d %s", code, body)
		})
	}
	testenv.Eventually(t, 10*time.Second, "the slow requests reached their servers", func() bool {
		return in.metric(`seamless_haproxy_up`) == 1 && inFlight(t, in) >= 8
	})
	for _, n := range names[2:8] {
		if _, err := c.Catalog().Deregister(&api.CatalogDeregistration{Node: "node-" + n}, nil); err != nil {
			t.Fatal(err)
		}
	}
	r.eventuallyServedBy(t, "127.0.0.1", names[:2]...)
	wg.Wait()
	close(slow)
	for res := range slow {
		if !strings.HasPrefix(res, "200 web") {
			t.Errorf("a request in flight on a removed instance: %q", res)
		}
	}
	if got := in.metric(successes); got != reloads {
		t.Errorf("%v reloads while scaling within the slots, want 0", got-reloads)
	}
	if now := in.showProc().Workers; len(now) != 1 || len(workers) != 1 || now[0].Pid != workers[0].Pid {
		t.Errorf("workers %+v, then %+v: a new worker was forked", workers, now)
	}
	if in.metric(runtimeUpdates) < 2 {
		t.Errorf("runtime updates = %v, want at least 2", in.metric(runtimeUpdates))
	}
	// The runtime API's fast way: the worker's own socket, which
	// seamless declares and HAProxy binds in the run directory.
	if fi, err := os.Stat(filepath.Join(in.runDir, "worker.sock")); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the worker's socket in the run directory: %v %v", fi, err)
	}
	// Each update's commands and their read-back: one connection.
	if w, m, u := in.metric(connsViaWorker)-viaWorker, in.metric(connsViaMaster)-viaMaster, in.metric(runtimeUpdates)-updates; w != u || m != 0 {
		t.Errorf("runtime connections over the worker's socket %v, through the master %v, for %v updates; want one each over the worker's socket", w, m, u)
	}

	t.Log("9 instances outgrow 8 slots: one reload")
	for _, n := range names[2:] {
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing, r.hostTag)
	}
	r.eventuallyServedBy(t, "127.0.0.1", names...)
	// HAProxy serves from the new worker a moment before the master
	// confirms the reload.
	testenv.Eventually(t, 10*time.Second, "the reload is confirmed", func() bool { return in.metric(successes) >= reloads+1 })
	for _, l := range loads {
		requireNoFailures(t, "load while scaling", stopLoad(t, l))
	}
	if got := in.metric(successes); got != reloads+1 {
		t.Errorf("%v reloads to grow the slots, want exactly 1", got-reloads)
	}
	// With no wait, the six registrations may land in several applies
	// when the machine is busy; each must still say what it changed.
	if !regexp.MustCompile(`applied over the runtime API, no reload.* change="web: \+\d+ instances?"`).MatchString(in.out.String()) {
		t.Error("no log line says what the runtime update changed")
	}
}

// inFlight reads the sessions HAProxy has open to web's servers.
func inFlight(t *testing.T, in *instance) int {
	t.Helper()
	out, err := in.cli().Do(t.Context(), "@1 show stat")
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) > 4 && f[0] == "http-web" && f[1] == "BACKEND" {
			fmt.Sscan(f[4], &n)
		}
	}
	return n
}

// An instance whose address is a DNS name cannot be set over the runtime
// API (it takes IP addresses): the change falls back to a reload, and says
// why.
func TestANameFallsBackToAReload(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	r.ports["web1"] = namedBackend(t, "web1")
	r.ports["web2"] = namedBackend(t, "web2")
	registerExternal(t, c, "web1", "web", r.ports["web1"], api.HealthPassing, r.hostTag)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1")
	reloads := in.metric(successes)
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: "node-web2", Address: "127.0.0.1",
		Service: &api.AgentService{ID: "web2", Service: "web", Address: "localhost", Port: r.ports["web2"], Tags: []string{r.hostTag}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	testenv.Eventually(t, 10*time.Second, "one reload", func() bool { return in.metric(successes) == reloads+1 })
	if !strings.Contains(in.out.String(), "runtime update failed; reloading instead") {
		t.Error("the fallback is not logged")
	}
}
