package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// Services whose slots would need more file descriptors than the limit
// HAProxy runs with are refused before any reload, with an error naming
// the need, the limit and SEAMLESS_SERVER_SLOTS; the running
// configuration keeps serving, and a catalog that fits again applies.
func TestSlotsBeyondTheFDLimitAreRefused(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	port := namedBackend(t, "up")
	dir := t.TempDir()
	write := func(i int) {
		writeAtomic(t, filepath.Join(dir, fmt.Sprintf("svc%02d.yaml", i)),
			fmt.Sprintf("name: svc%02d\ntags: [\"seamless.http.host=svc%02d.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", i, i, port))
	}
	write(0)
	httpAddr := testenv.Addr(testenv.FreePort(t))
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, wrap: []string{prlimit, "--nofile=1024:1024", "--"},
		env: []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + httpAddr,
			"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SEAMLESS_WAIT=0",
			"SEAMLESS_SERVER_SLOTS=16", "SEAMLESS_REMOVAL_HOLD=1s"}})
	testenv.Eventually(t, 20*time.Second, "svc00 served", func() bool {
		code, body := getHost(httpAddr, "svc00.test", "/")
		return code == 200 && body == "up"
	})
	refused := `seamless_config_applies_total{result="refused"}`
	before := in.metric(refused)

	// 60 more services × 16 slots with checks: 976 servers, over 1024
	// with HAProxy's own share. Written one by one with SEAMLESS_WAIT=0,
	// the first ones fit and apply; the last ones are refused.
	for i := 1; i <= 60; i++ {
		write(i)
	}
	testenv.Eventually(t, 20*time.Second, "a rendering refused", func() bool { return in.metric(refused) > before })
	out := in.out.String()
	for _, want := range []string{"file descriptors", "limit of 1024", "SEAMLESS_SERVER_SLOTS (now 16"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q", want)
		}
	}
	if code, body := getHost(httpAddr, "svc00.test", "/"); code != 200 || body != "up" {
		t.Errorf("svc00 after the refusal: %d %q, want it still served", code, body)
	}
	if code, _ := getHost(httpAddr, "svc60.test", "/"); code == 200 {
		t.Error("svc60 is served although every rendering with it was refused")
	}

	// Back within the limit (the removal guard holds a mass removal for
	// a second): the next change applies.
	for i := 31; i <= 60; i++ {
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("svc%02d.yaml", i))); err != nil {
			t.Fatal(err)
		}
	}
	write(99)
	testenv.Eventually(t, 20*time.Second, "svc99 served once the services fit", func() bool {
		code, body := getHost(httpAddr, "svc99.test", "/")
		return code == 200 && body == "up"
	})
}

// At start, a catalog whose checked slots cannot fit in the limit stops
// seamless before HAProxy starts, with an error that names the limit and
// SEAMLESS_HEALTH_CHECKS; with SEAMLESS_HEALTH_CHECKS=false the same
// catalog starts and is served, since unchecked servers cost HAProxy no
// file descriptor.
func TestAtStartServersBeyondTheFDLimitStopWithTheFixNamed(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	port := namedBackend(t, "up")
	dir := t.TempDir()
	// 70 services × 16 slots: 1120 checked servers, over 1024.
	for i := range 70 {
		writeAtomic(t, filepath.Join(dir, fmt.Sprintf("svc%02d.yaml", i)),
			fmt.Sprintf("name: svc%02d\ntags: [\"seamless.http.host=svc%02d.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", i, i, port))
	}
	state := ""
	start := func(checks string) (*instance, string) {
		httpAddr := testenv.Addr(testenv.FreePort(t))
		state = filepath.Join(t.TempDir(), "state")
		return startSeamless(t, nil, startOpts{args: []string{"haproxy"}, wrap: []string{prlimit, "--nofile=1024:1024", "--"},
			env: []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + httpAddr,
				"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + state,
				"SEAMLESS_SERVER_SLOTS=16", "SEAMLESS_HEALTH_CHECKS=" + checks}}), httpAddr
	}

	in, _ := start("true")
	if code := in.wait(30 * time.Second); code == 0 {
		t.Errorf("seamless exited with 0, want a failure")
	}
	out := in.out.String()
	for _, want := range []string{"discovery cannot start", "limit of 1024", "SEAMLESS_HEALTH_CHECKS=false", "SEAMLESS_SERVER_SLOTS (now 16"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q", want)
		}
	}

	in, httpAddr := start("false")
	testenv.Eventually(t, 20*time.Second, "svc69 served without health checks", func() bool {
		select {
		case <-in.exited:
			t.Fatalf("seamless exited with %d", in.code)
		default:
		}
		code, body := getHost(httpAddr, "svc69.test", "/")
		return code == 200 && body == "up"
	})
	cfg, err := os.ReadFile(filepath.Join(state, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cfg), " check") {
		t.Error("the configuration checks servers with SEAMLESS_HEALTH_CHECKS=false")
	}
}
