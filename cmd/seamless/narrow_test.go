package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// consulPaths is a reverse proxy in front of a Consul agent that records
// the paths requested.
type consulPaths struct {
	addr  string // host:port, for CONSUL_HTTP_ADDR
	mu    sync.Mutex
	paths map[string]bool
}

func proxyConsul(t *testing.T, addr string) *consulPaths {
	t.Helper()
	u, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &consulPaths{paths: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.paths[r.URL.Path] = true
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.addr = strings.TrimPrefix(srv.URL, "http://")
	return p
}

func (p *consulPaths) with(prefix string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for path := range p.paths {
		if strings.HasPrefix(path, prefix) {
			out = append(out, path)
		}
	}
	slices.Sort(out)
	return out
}

// renderWith runs `seamless render` with env and returns the configuration.
func renderWith(t *testing.T, env ...string) []byte {
	t.Helper()
	cmd := exec.Command(seamlessBin, "render")
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render: %v\n%s", err, stderr.String())
	}
	return stdout.Bytes()
}

// With the built-in template and Consul as the only source, seamless reads
// only the services it routes: the untagged ones are never asked for, the
// configuration is the one every service watched gives, and a service
// that gains or loses its seamless.* tag gains or loses its route.
func TestBuiltInTemplateWatchesOnlyRoutedServices(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2"} {
		r.ports[n] = namedBackend(t, n)
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing, r.hostTag)
	}
	// api's tags are the union of its instances': api2 is routed with api1.
	r.ports["api1"], r.ports["api2"] = namedBackend(t, "api1"), namedBackend(t, "api2")
	registerExternal(t, c, "api1", "api", r.ports["api1"], api.HealthPassing, "seamless.http.host=api.example")
	registerExternal(t, c, "api2", "api", r.ports["api2"], api.HealthPassing, "v2")
	const unused = 30
	for i := range unused {
		registerExternal(t, c, fmt.Sprintf("db%d", i), fmt.Sprintf("db-%d", i), 5000+i, api.HealthPassing, "primary")
	}
	proxy := proxyConsul(t, r.consul.Addr())
	r.extraEnv = append(r.extraEnv, "CONSUL_HTTP_ADDR="+proxy.addr)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	r.eventuallyServedBy(t, "api.example", "api1", "api2")

	if got := proxy.with("/v1/health/service/"); !slices.Equal(got, []string{"/v1/health/service/api", "/v1/health/service/web"}) {
		t.Errorf("health queries for %v, want api's and web's alone", got)
	}
	if w, l := in.metric(`seamless_consul_services{state="watched"}`), in.metric(`seamless_consul_services{state="listed"}`); w != 2 || l != unused+3 {
		t.Errorf("%v services watched of %v listed, want 2 of %d (and consul)", w, l, unused+3)
	}

	// Narrowed (Consul alone) and not (Consul and an empty services
	// directory): the same configuration. render reads the state
	// directory, never writes it.
	env := []string{"SEAMLESS_STATE_DIR=" + t.TempDir(), "CONSUL_HTTP_ADDR=" + r.consul.Addr(), "SEAMLESS_HTTP_BIND=" + r.http,
		"SEAMLESS_STATS_BIND=127.0.0.1:8404", "SEAMLESS_SERVER_SLOTS=4"}
	narrowed := renderWith(t, append(env, "SEAMLESS_SOURCES=consul")...)
	full := renderWith(t, append(env, "SEAMLESS_SOURCES=consul,file", "SEAMLESS_SERVICES_DIR="+t.TempDir())...)
	if !bytes.Equal(narrowed, full) {
		t.Errorf("narrowed configuration:\n%s\nwith every service watched:\n%s", narrowed, full)
	}
	if !bytes.Contains(narrowed, []byte("api.example")) {
		t.Errorf("the configuration lacks api's route:\n%s", narrowed)
	}

	t.Log("db-1 gets a route")
	r.ports["db1"] = namedBackend(t, "db1")
	registerExternal(t, c, "db1", "db-1", r.ports["db1"], api.HealthPassing, "seamless.http.host=db.example")
	r.eventuallyServedBy(t, "db.example", "db1")
	t.Log("and loses it")
	registerExternal(t, c, "db1", "db-1", r.ports["db1"], api.HealthPassing, "primary")
	testenv.Eventually(t, 25*time.Second, "db.example unrouted (503)", func() bool {
		code, _ := getHost(r.http, "db.example", "/")
		return code == http.StatusServiceUnavailable
	})
	if got := proxy.with("/v1/health/service/db-"); !slices.Equal(got, []string{"/v1/health/service/db-1"}) {
		t.Errorf("health queries for %v, want db-1's alone", got)
	}
	if out := in.out.String(); !strings.Contains(out, "services now used: watching them") ||
		!strings.Contains(out, "services no longer used: not watching them") {
		t.Errorf("no log line says db-1 started and stopped being watched")
	}
}

// With a template of one's own, SEAMLESS_CONSUL_SERVICES names the
// services it reads: only those are watched, and a template that reads
// another is refused (the running configuration stays) rather than
// rendered with that service empty.
func TestTemplateWatchesTheServicesNamed(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2"} {
		r.ports[n] = namedBackend(t, n)
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing)
	}
	for i := range 20 {
		registerExternal(t, c, fmt.Sprintf("db%d", i), fmt.Sprintf("db-%d", i), 5000+i, api.HealthPassing)
	}
	proxy := proxyConsul(t, r.consul.Addr())
	tmpl := filepath.Join(t.TempDir(), "haproxy.cfg.tmpl")
	writeAtomic(t, tmpl, classicTemplate)
	r.extraEnv = []string{"SEAMLESS_TEMPLATE=" + tmpl, "WWW_BIND=" + r.http,
		"CONSUL_HTTP_ADDR=" + proxy.addr, "SEAMLESS_CONSUL_SERVICES=web,api-*"}
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	if got := proxy.with("/v1/health/service/"); !slices.Equal(got, []string{"/v1/health/service/web"}) {
		t.Errorf("health queries for %v, want web's alone", got)
	}
	if w, l := in.metric(`seamless_consul_services{state="watched"}`), in.metric(`seamless_consul_services{state="listed"}`); w != 1 || l != 22 {
		t.Errorf("%v services watched of %v listed, want 1 of 22", w, l)
	}

	t.Log("a service matching a pattern is watched once registered")
	registerExternal(t, c, "api1", "api-1", 6000, api.HealthPassing)
	testenv.Eventually(t, 15*time.Second, "api-1 watched", func() bool {
		return slices.Contains(proxy.with("/v1/health/service/"), "/v1/health/service/api-1")
	})

	t.Log("a template that reads a service not named is refused")
	rendered := filepath.Join(r.stateDir, "haproxy.cfg")
	before, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, tmpl, classicTemplate+"{{ range service \"db-3\" }}# {{ .Port }}{{ end }}\n")
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 15*time.Second, "the render refused, naming db-3", func() bool {
		return strings.Contains(in.out.String(), `service \"db-3\" is not watched`)
	})
	if after, _ := os.ReadFile(rendered); !bytes.Equal(after, before) {
		t.Errorf("the refused render replaced the running file:\n%s", after)
	}
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	if got := proxy.with("/v1/health/service/db-"); len(got) != 0 {
		t.Errorf("health queries for %v, want none", got)
	}
}

// A catalog large enough to be seeded from the node dump (64 services or
// more) holds its per-service queries until HAProxy serves, then watches:
// a change after the start is served.
func TestASeededStartWatchesOnceHAProxyServes(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	r.ports["old"], r.ports["new"] = namedBackend(t, "old"), namedBackend(t, "new")
	const services = 70
	for i := range services {
		registerExternal(t, c, fmt.Sprintf("i%d", i), fmt.Sprintf("svc-%d", i), r.ports["old"], api.HealthPassing,
			fmt.Sprintf("seamless.http.host=svc-%d.example", i))
	}
	proxy := proxyConsul(t, r.consul.Addr())
	r.extraEnv = append(r.extraEnv, "CONSUL_HTTP_ADDR="+proxy.addr)
	in := r.start(t)
	r.eventuallyServedBy(t, "svc-7.example", "old")
	if got := proxy.with("/v1/internal/ui/nodes"); len(got) == 0 {
		t.Fatal("the start was not seeded from the node dump")
	}
	if !strings.Contains(in.out.String(), "the per-service queries wait until HAProxy serves") {
		t.Error("the per-service queries did not wait for HAProxy")
	}
	registerExternal(t, c, "i7", "svc-7", r.ports["new"], api.HealthPassing, "seamless.http.host=svc-7.example")
	r.eventuallyServedBy(t, "svc-7.example", "new")
	testenv.Eventually(t, 10*time.Second, "a query held per service and for the service and node lists", func() bool {
		return in.metric("seamless_consul_requests_in_flight") == services+2
	})
}
