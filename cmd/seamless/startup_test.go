package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// environ reads a process's environment from /proc.
func environ(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}

// The master, its workers and `haproxy -c` get seamless's environment
// without the Consul token and the other CONSUL_*, DOCKER_* and SEAMLESS_*
// variables; the rest (a user's own) still passes.
func TestHAProxyDoesNotInheritSecrets(t *testing.T) {
	testenv.HAProxy(t)
	secrets := []string{"CONSUL_HTTP_TOKEN=secret-token", "DOCKER_HOST=unix:///secret.sock"}
	s := newSite(t, startBackend(t))
	// Documented: HAProxy reads a withheld variable as empty; seamless
	// says so at start.
	s.global = "    setenv FROM_TOKEN \"t${CONSUL_HTTP_TOKEN}\"\n"
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{env: append(secrets, "SEAMLESS_TEST_KEPT_BY_USER=no", "USER_KNOB=kept")})
	in.waitReady(s)
	if !strings.Contains(in.out.String(), "variable=CONSUL_HTTP_TOKEN") {
		t.Errorf("no warning names the withheld variable the configuration uses")
	}
	p := in.showProc()
	if len(p.Workers) == 0 {
		t.Fatal("no worker")
	}
	for _, pid := range []int{p.Master.Pid, p.Workers[0].Pid} {
		env := environ(t, pid)
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			for _, prefix := range []string{"CONSUL_", "DOCKER_", "SEAMLESS_"} {
				if strings.HasPrefix(k, prefix) {
					t.Errorf("pid %d inherited %s", pid, kv)
				}
			}
		}
		if !strings.Contains("\x00"+strings.Join(env, "\x00")+"\x00", "\x00USER_KNOB=kept\x00") {
			t.Errorf("pid %d lost USER_KNOB: %q", pid, env)
		}
	}

	// haproxy -c too: this file is invalid only where the token is set.
	s.extraFE = ".if defined(CONSUL_HTTP_TOKEN)\n    the-token-leaked-into-haproxy-c\n.endif\n"
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "reload of the file that tests the environment", func() bool {
		return in.metric(successes)+in.metric(failures) >= 1
	})
	if got := in.metric(failures); got != 0 {
		t.Fatalf("the reload failed: haproxy -c saw CONSUL_HTTP_TOKEN\n%s", in.out.String())
	}
	testenv.Eventually(t, 10*time.Second, "version 2 served", func() bool { return served(s) == "v2" })
	code, _, errOut := runBinary(t, secrets, "check", "-f", s.path)
	if code != 0 {
		t.Errorf("seamless check: exit %d: haproxy -c saw CONSUL_HTTP_TOKEN\n%s", code, errOut)
	}
}

// SEAMLESS_HARD_STOP_AFTER beyond what HAProxy's time parser takes is a
// bad variable (exit 2, before HAProxy runs), and its maximum is accepted
// by the real HAProxy.
func TestHardStopAfterIsBoundedByHAProxy(t *testing.T) {
	testenv.HAProxy(t)
	s := newSite(t, startBackend(t))
	s.write(t, 1)
	code, _, errOut := runBinary(t, []string{"SEAMLESS_HARD_STOP_AFTER=99999h"}, "check", "-f", s.path)
	if code != exitUsage || !strings.Contains(errOut, "SEAMLESS_HARD_STOP_AFTER") {
		t.Errorf("99999h: exit %d, want %d naming the variable; stderr:\n%s", code, exitUsage, errOut)
	}
	var env []string
	for _, v := range config.Vars() {
		if v.Name == "SEAMLESS_HARD_STOP_AFTER" || v.Name == "SEAMLESS_MAX_RELOADS" {
			env = append(env, v.Name+"="+v.Max)
		}
	}
	if code, _, errOut := runBinary(t, env, "check", "-f", s.path); code != 0 {
		t.Errorf("%v, the maxima: exit %d; HAProxy refused them:\n%s", env, code, errOut)
	}
}

// closedAddr is a loopback address where nothing listens: a Consul that
// is down.
func closedAddr(t *testing.T) string { return testenv.Addr(testenv.FreePort(t)) }

// A stop signal during the start-up wait for the sources ends seamless at
// once (exit 0: nothing was serving yet), instead of after
// SEAMLESS_DISCOVERY_TIMEOUT, which Docker would end with SIGKILL.
func TestStopDuringTheDiscoveryWait(t *testing.T) {
	testenv.HAProxy(t)
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{
		"SEAMLESS_SOURCES=consul", "CONSUL_HTTP_ADDR=" + closedAddr(t),
		"SEAMLESS_DISCOVERY_TIMEOUT=60s", "SEAMLESS_STATE_DIR=" + t.TempDir(),
		"SEAMLESS_HTTP_BIND=" + testenv.Addr(testenv.FreePort(t)), "SEAMLESS_STATS_BIND=",
	}})
	testenv.Eventually(t, 10*time.Second, "seamless waits for Consul", func() bool {
		return strings.Contains(in.out.String(), "Consul query failed")
	})
	in.signal(syscall.SIGTERM)
	if code := in.wait(3 * time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM during the start-up wait, want 0", code)
	}
}

// With the descriptors of a small container (256), 1,000 idle connections
// held against the status endpoint neither block /healthz nor starve
// haproxy -c: a reload still validates and succeeds.
func TestIdleStatusConnectionsStarveNothing(t *testing.T) {
	testenv.HAProxy(t)
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	be := startBackend(t)
	s := newSite(t, be)
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{wrap: []string{prlimit, "--nofile=256:256", "--"}})
	in.waitReady(s)

	const idle = 1000
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range idle {
		c, err := net.DialTimeout("tcp", in.status, 5*time.Second)
		if err != nil {
			t.Fatalf("after %d connections: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + in.status + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with %d idle connections held: %v", idle, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the reload's outcome", func() bool {
		return in.metric(successes)+in.metric(failures) >= 1
	})
	if in.metric(failures) != 0 {
		t.Fatalf("the reload failed with the idle connections held")
	}
	testenv.Eventually(t, 10*time.Second, "version 2 served", func() bool { return served(s) == "v2" })
}

// Consul down and nothing saved from an earlier run: HAProxy starts with
// the built-in frontends and answers 503 for every host, seamless is
// healthy but not ready, and once Consul answers a tagged service is
// routed and seamless becomes ready. A source that is down never makes it
// exit.
func TestStartWithConsulDownAndNothingSaved(t *testing.T) {
	r := newDiscoveryRig(t)
	r.consul.Stop() // its address is now a closed port
	r.extraEnv = []string{"SEAMLESS_DISCOVERY_TIMEOUT=1s"}
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: r.env(t)})
	testenv.Eventually(t, 20*time.Second, "HAProxy serves the frontend: 503 for every host", func() bool {
		select {
		case <-in.exited:
			t.Fatalf("seamless exited with %d while Consul is down", in.code)
		default:
		}
		code, _ := getHost(r.http, "web.example", "/")
		return code == 503
	})
	if code, _ := getHost(r.http, "other.example", "/x"); code != 503 {
		t.Errorf("another host: %d, want 503", code)
	}
	testenv.Eventually(t, 10*time.Second, "/healthz 200", func() bool {
		code, _ := testenv.Get("http://" + in.status + "/healthz")
		return code == 200
	})
	if code, body := testenv.Get("http://" + in.status + "/readyz"); code != 503 || !strings.Contains(body, "consul") {
		t.Errorf("/readyz = %d %q with Consul never reached, want 503 naming consul", code, body)
	}

	r.consul.Start()
	r.ports["web1"] = namedBackend(t, "web1")
	registerExternal(t, r.consul.Client(), "web1", "web", r.ports["web1"], api.HealthPassing, "seamless.http.host=web.example")
	r.eventuallyServedBy(t, "web.example", "web1")
	testenv.Eventually(t, 10*time.Second, "/readyz 200 once Consul answered", func() bool {
		code, _ := testenv.Get("http://" + in.status + "/readyz")
		return code == 200
	})
}
