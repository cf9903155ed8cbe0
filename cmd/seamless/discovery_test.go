package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// namedBackend answers its name on every path: the test sees which
// instance served a request. ?slow=N answers after N milliseconds.
func namedBackend(t *testing.T, name string) int {
	t.Helper()
	port, _ := stoppableBackend(t, name)
	return port
}

// stoppableBackend is namedBackend with a function that stops it.
func stoppableBackend(t *testing.T, name string) (int, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ms, err := strconv.Atoi(r.URL.Query().Get("slow")); err == nil {
			select {
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, name+"\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port, func() { srv.Close() }
}

// getHost sends GET path to addr with the given Host header.
func getHost(addr, host, path string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Host = host
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// servedBy asks n times and returns which backends answered.
func servedBy(addr, host string, n int) map[string]int {
	seen := map[string]int{}
	for range n {
		code, body := getHost(addr, host, "/")
		if code != 200 {
			body = strconv.Itoa(code)
		}
		seen[body]++
	}
	return seen
}

// registerExternal registers an instance on a node of its own through the
// catalog, as consul-esm does for external services: Raft keeps it across
// an agent restart, with no anti-entropy to undo it.
func registerExternal(t *testing.T, c *api.Client, id, service string, port int, status string, tags ...string) {
	t.Helper()
	node := "node-" + id
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: node, Address: "127.0.0.1",
		Service: &api.AgentService{ID: id, Service: service, Address: "127.0.0.1", Port: port, Tags: tags},
		Check: &api.AgentCheck{Node: node, CheckID: "service:" + id, Name: "http", Status: status,
			ServiceID: id, ServiceName: service},
	}, nil)
	if err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
}

type discoveryRig struct {
	consul   *testenv.ConsulAgent
	http     string // the HTTP frontend, 127.0.0.1:port
	stateDir string
	ports    map[string]int
	hostTag  string
	extraEnv []string
}

func newDiscoveryRig(t *testing.T) *discoveryRig {
	t.Helper()
	testenv.HAProxy(t)
	r := &discoveryRig{consul: testenv.Consul(t), stateDir: filepath.Join(t.TempDir(), "state"),
		ports: map[string]int{}, hostTag: "seamless.http.host=127.0.0.1"}
	r.http = testenv.Addr(testenv.FreePort(t))
	return r
}

func (r *discoveryRig) env(t *testing.T) []string {
	return append([]string{
		"SEAMLESS_SOURCES=consul",
		"CONSUL_HTTP_ADDR=" + r.consul.Addr(),
		"SEAMLESS_HTTP_BIND=" + r.http,
		"SEAMLESS_STATS_BIND=" + testenv.Addr(testenv.FreePort(t)),
		"SEAMLESS_STATE_DIR=" + r.stateDir,
		"SEAMLESS_WAIT=0",
	}, r.extraEnv...)
}

func (r *discoveryRig) start(t *testing.T) *instance {
	t.Helper()
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: r.env(t)})
	testenv.Eventually(t, 30*time.Second, "seamless ready (/readyz)", func() bool {
		select {
		case <-in.exited:
			t.Fatalf("seamless exited with %d", in.code)
		default:
		}
		code, _ := testenv.Get("http://" + in.status + "/readyz")
		return code == 200
	})
	return in
}

func (r *discoveryRig) eventuallyServedBy(t *testing.T, host string, want ...string) {
	t.Helper()
	var last map[string]int
	ok := false
	// Long enough for a Consul source that backs off (at most 10 s).
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) {
		last = servedBy(r.http, host, 12)
		if len(last) == len(want) {
			ok = true
			for _, w := range want {
				if last[w] == 0 {
					ok = false
				}
			}
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	t.Fatalf("host %s: served by %v, want exactly %v", host, last, want)
}

func startLoadOn(t *testing.T, addr string, d time.Duration) []*loadgen.Load {
	t.Helper()
	var loads []*loadgen.Load
	for _, m := range []loadgen.Mode{loadgen.NewConn, loadgen.KeepAlive} {
		l, err := loadgen.Start(context.Background(), loadgen.Config{
			Target: addr, Mode: m, Workers: 2, MaxRequests: 2_000_000, MaxDuration: d,
		})
		if err != nil {
			t.Fatal(err)
		}
		loads = append(loads, l)
		t.Cleanup(func() { l.Stop() })
	}
	return loads
}

func TestConsulDiscoveryEndToEnd(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2", "web3"} {
		r.ports[n] = namedBackend(t, n)
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing, r.hostTag)
	}
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2", "web3")
	loads := startLoadOn(t, r.http, 3*time.Minute)

	t.Log("an instance turns critical")
	registerExternal(t, c, "web2", "web", r.ports["web2"], api.HealthCritical, r.hostTag)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web3")

	t.Log("an instance is deregistered")
	if _, err := c.Catalog().Deregister(&api.CatalogDeregistration{Node: "node-web3"}, nil); err != nil {
		t.Fatal(err)
	}
	r.eventuallyServedBy(t, "127.0.0.1", "web1")

	t.Log("a new tagged service gets a route")
	if code, _ := getHost(r.http, "api.example", "/"); code != 503 {
		t.Errorf("unknown host: status %d, want 503", code)
	}
	r.ports["api1"] = namedBackend(t, "api1")
	registerExternal(t, c, "api1", "api", r.ports["api1"], api.HealthPassing, "seamless.http.host=api.example")
	r.eventuallyServedBy(t, "api.example", "api1")

	t.Log("Consul is away for 20 s")
	// The new route came with a reload, which HAProxy serves a moment
	// before the master confirms it.
	testenv.Eventually(t, 10*time.Second, "the new route's reload confirmed", func() bool { return in.metric(successes) >= 1 })
	reloads := in.metric(successes)
	r.consul.Stop()
	away := time.Now()
	for time.Since(away) < 20*time.Second {
		// The wait is the scenario; meanwhile every request must work.
		if got := servedBy(r.http, "127.0.0.1", 5); got["web1"] != 5 {
			t.Fatalf("while Consul is away: served by %v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := in.metric(successes); got != reloads {
		t.Errorf("%v reloads while Consul was away, want none", got-reloads)
	}
	if code, body := testenv.Get("http://" + in.status + "/readyz"); code != 200 {
		t.Errorf("/readyz while Consul is away: %d %s; what was discovered still serves", code, body)
	}
	r.consul.Start()
	registerExternal(t, c, "web2", "web", r.ports["web2"], api.HealthPassing, r.hostTag)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")

	for _, l := range loads {
		requireNoFailures(t, "load during discovery changes", stopLoad(t, l))
	}
	if !strings.Contains(in.out.String(), "web: -1 instance") {
		t.Errorf("no apply log line says what changed")
	}
}

func TestStartWithConsulDownUsesTheSavedSnapshot(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	r.ports["web1"] = namedBackend(t, "web1")
	registerExternal(t, c, "web1", "web", r.ports["web1"], api.HealthPassing, r.hostTag)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1")
	in.signal(syscall.SIGTERM)
	if code := in.wait(20 * time.Second); code != 0 {
		t.Fatalf("first seamless exited %d", code)
	}
	// The rendered file too would let HAProxy start; the snapshot must
	// be enough on its own.
	if err := os.Remove(filepath.Join(r.stateDir, "haproxy.cfg")); err != nil {
		t.Fatal(err)
	}
	r.consul.Stop()
	r.extraEnv = []string{"SEAMLESS_DISCOVERY_TIMEOUT=1s"}
	in = startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: r.env(t)})
	r.eventuallyServedBy(t, "127.0.0.1", "web1")
	// HAProxy may serve a moment before the supervisor has seen its
	// worker answer on the CLI.
	testenv.Eventually(t, 10*time.Second, "/healthz 200: seamless does not die because Consul is down", func() bool {
		code, _ := testenv.Get("http://" + in.status + "/healthz")
		return code == 200
	})
	if code, body := testenv.Get("http://" + in.status + "/readyz"); code != 503 || !strings.Contains(body, "consul") {
		t.Errorf("/readyz = %d %q with Consul never reached, want 503 naming consul", code, body)
	}
	r.consul.Start()
	testenv.Eventually(t, 30*time.Second, "ready once Consul answers", func() bool {
		code, _ := testenv.Get("http://" + in.status + "/readyz")
		return code == 200
	})
}
