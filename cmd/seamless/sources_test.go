package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// A consul-template template for HAProxy, as users have them: a service
// loop, a KV knob, and the services list filtered by tag.
const classicTemplate = `global
    maxconn {{ keyOrDefault "lb/maxconn" "2000" }}

defaults
    mode http
    option idle-close-on-response
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend www
    bind {{ env "WWW_BIND" }}
    default_backend web

backend web
    balance roundrobin{{ range service "web" }}
    server {{ .Node }} {{ .Address }}:{{ .Port }}{{ end }}
{{ range services }}{{ if .Tags.Contains "admin" }}
# admin service: {{ .Name }}{{ end }}{{ end }}
`

func TestConsulTemplateEndToEnd(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2"} {
		r.ports[n] = namedBackend(t, n)
		registerExternal(t, c, n, "web", r.ports[n], api.HealthPassing)
	}
	tmpl := filepath.Join(t.TempDir(), "haproxy.cfg.tmpl")
	writeAtomic(t, tmpl, classicTemplate)
	r.extraEnv = []string{"SEAMLESS_TEMPLATE=" + tmpl, "WWW_BIND=" + r.http}
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	rendered := filepath.Join(r.stateDir, "haproxy.cfg")
	if b, _ := os.ReadFile(rendered); !strings.Contains(string(b), "maxconn 2000") {
		t.Errorf("keyOrDefault did not render its default:\n%s", b)
	}

	t.Log("a KV change is applied")
	applies := in.metric(`seamless_config_applies_total{result="reloaded"}`)
	if _, err := c.KV().Put(&api.KVPair{Key: "lb/maxconn", Value: []byte("4096")}, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the KV value is applied with a reload", func() bool {
		b, _ := os.ReadFile(rendered)
		return strings.Contains(string(b), "maxconn 4096") &&
			in.metric(`seamless_config_applies_total{result="reloaded"}`) > applies
	})

	t.Log("a KV value that breaks the configuration is refused")
	reloads := in.metric(successes)
	if _, err := c.KV().Put(&api.KVPair{Key: "lb/maxconn", Value: []byte("1\n    stats enable")}, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the injected value is refused", func() bool {
		return in.metric("seamless_config_errors_total") >= 1
	})
	if b, _ := os.ReadFile(rendered); !strings.Contains(string(b), "maxconn 4096") {
		t.Errorf("the refused render replaced the running file:\n%s", b)
	}
	if got := in.metric(successes); got != reloads {
		t.Errorf("%v reloads after a refused render", got-reloads)
	}
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
}

func TestCheckNamesAnUnsupportedFunction(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "bad.tmpl")
	writeAtomic(t, tmpl, "global\n    maxconn 10\n\n{{ with secret \"kv/x\" }}{{ .Data }}{{ end }}\n")
	cmd := exec.Command(seamlessBin, "check")
	cmd.Env = append(os.Environ(), "SEAMLESS_TEMPLATE="+tmpl, "SEAMLESS_DISCOVERY_TIMEOUT=1s")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != exitInvalid {
		t.Fatalf("seamless check: exit %d (%v), want %d\n%s", code, err, exitInvalid, out.String())
	}
	for _, want := range []string{`"secret"`, "bad.tmpl:4", "not supported"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, out.String())
		}
	}
}

const webService = `name: web
tags: ["seamless.http.host=127.0.0.1"]
instances:
%s`

func instancesYAML(ports ...int) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, "  - address: 127.0.0.1\n    port: %d\n", p)
	}
	return b.String()
}

func TestServicesDirEndToEnd(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	web1, web2 := namedBackend(t, "web1"), namedBackend(t, "web2")
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(web1)))
	r := &discoveryRig{http: testenv.Addr(testenv.FreePort(t)), stateDir: filepath.Join(t.TempDir(), "state")}
	env := []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + r.http,
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + r.stateDir, "SEAMLESS_WAIT=0"}
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: env})
	r.eventuallyServedBy(t, "127.0.0.1", "web1")
	loads := startLoadOn(t, r.http, time.Minute)

	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(web1, web2)))
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")

	t.Log("a malformed edit keeps the last good content")
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(web2))+"  - address: 127.0.0.1\n    port: seventy\n")
	testenv.Eventually(t, 10*time.Second, "the error names the file and line", func() bool {
		return strings.Contains(in.out.String(), "web.yaml:7")
	})
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")

	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(web2)))
	r.eventuallyServedBy(t, "127.0.0.1", "web2")
	for _, l := range loads {
		requireNoFailures(t, "load during file changes", stopLoad(t, l))
	}

	out, err := exec.CommandContext(context.Background(), seamlessBin, "render").Output()
	if err == nil {
		t.Errorf("render without discovery configured succeeded: %s", out)
	}
}

func TestRenderPrintsWhatWouldBeApplied(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(9001, 9002)))
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(seamlessBin, "render")
	cmd.Env = append(os.Environ(), "SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR="+dir,
		"SEAMLESS_STATE_DIR="+state, "SEAMLESS_HTTP_BIND=127.0.0.1:5001")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"bind 127.0.0.1:5001", "127.0.0.1:9001", "127.0.0.1:9002"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("rendered config lacks %q:\n%s", want, stdout.String())
		}
	}
	// A running seamless's state is read, never written.
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("render wrote into SEAMLESS_STATE_DIR: %v", entries)
	}
}

// A start-up that fails after discovery has started (here: the defaults
// file cannot be written) must end seamless, not leave it waiting for an
// applier that never ran.
func TestStartupFailureAfterDiscoveryExits(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(9001)))
	runDir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(filepath.Join(runDir, "defaults.cfg"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(seamlessBin)
	cmd.Env = append(os.Environ(), "SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR="+dir, "SEAMLESS_RUN_DIR="+runDir,
		"SEAMLESS_STATE_DIR="+filepath.Join(t.TempDir(), "state"), "SEAMLESS_HTTP_BIND=127.0.0.1:18093",
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATUS_ADDR=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		if code := cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(out.String(), "cannot write defaults file") {
			t.Errorf("exit %d, want %d after the defaults file failed\n%s", code, exitUsage, out.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("seamless hung after a failed start:\n%s", out.String())
	}
}

// With a template of yours, an instance that moves to another port is a
// server line whose address alone changed. On HAProxy 3.0+ the running
// worker takes it over the runtime API, with no reload; on 2.6, which
// would keep sending a busy keep-alive client to the old address, it
// reloads. Either way such a client's requests follow the move, and the
// file says it. An instance added still reloads.
func TestATemplatesMovedServerTakesItsKeepAliveClientsAlong(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	for _, n := range []string{"web1", "web2", "web3", "web4"} {
		r.ports[n] = namedBackend(t, n)
	}
	registerExternal(t, c, "web2", "web", r.ports["web2"], api.HealthPassing)
	tmpl := filepath.Join(t.TempDir(), "haproxy.cfg.tmpl")
	writeAtomic(t, tmpl, classicTemplate)
	r.extraEnv = []string{"SEAMLESS_TEMPLATE=" + tmpl, "WWW_BIND=" + r.http}
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web2")
	procs := in.showProc()
	inPlace := haproxy.VersionAtLeast(procs.Master.Version, 3, 0)
	reloads, updates := in.metric(successes), in.metric(runtimeUpdates)
	busy := keepAliveClient(t, r.http)
	testenv.Eventually(t, 5*time.Second, "the keep-alive client served by web2", func() bool { return busy.last() == "web2" })

	t.Log("web2's instance moves to web3's port")
	registerExternal(t, c, "web2", "web", r.ports["web3"], api.HealthPassing)
	testenv.EventuallyExplained(t, 10*time.Second, "the keep-alive client follows the move to web3",
		func() bool { return busy.last() == "web3" }, func() { t.Logf("last served by %s", busy.last()) })
	wantReloads, wantUpdates := reloads, updates+1
	if !inPlace {
		wantReloads, wantUpdates = reloads+1, updates
	}
	// Counted once the file is renamed into place, which a runtime update
	// does after HAProxy shows the move.
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("HAProxy %s: %v reloads and %v runtime updates for the move", procs.Master.Version, wantReloads-reloads, wantUpdates-updates), func() bool {
		return in.metric(successes) == wantReloads && in.metric(runtimeUpdates) == wantUpdates
	})
	rendered := filepath.Join(r.stateDir, "haproxy.cfg")
	if b, _ := os.ReadFile(rendered); !strings.Contains(string(b), fmt.Sprintf("server node-web2 127.0.0.1:%d\n", r.ports["web3"])) {
		t.Errorf("the file does not hold the move:\n%s", b)
	}
	if now := in.showProc().Workers; inPlace && (len(now) != 1 || len(procs.Workers) != 1 || now[0].Pid != procs.Workers[0].Pid) {
		t.Errorf("workers %v, then %v: want the same one", procs.Workers, now)
	}

	t.Log("an instance added reloads")
	registerExternal(t, c, "web4", "web", r.ports["web4"], api.HealthPassing)
	r.eventuallyServedBy(t, "127.0.0.1", "web3", "web4")
	// The new worker serves before the reload is confirmed and counted.
	testenv.Eventually(t, 10*time.Second, "one reload for the added server", func() bool {
		return in.metric(successes) == wantReloads+1
	})
}

// liveClient sends requests one after another on one kept-alive
// connection until the test ends, and remembers who answered last.
type liveClient struct {
	mu   sync.Mutex
	body string
}

func (l *liveClient) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.body
}

func keepAliveClient(t *testing.T, addr string) *liveClient {
	t.Helper()
	l := &liveClient{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
	go func() {
		defer close(done)
		hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		end := time.Now().Add(time.Minute)
		for i := 0; i < 200_000 && time.Now().Before(end); i++ {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
			resp, err := hc.Do(req)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			l.mu.Lock()
			l.body = strings.TrimSpace(string(b))
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; tr.CloseIdleConnections() })
	return l
}
