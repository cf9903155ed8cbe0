package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// From 64 exact hosts the built-in configuration looks them up in a map
// file in SEAMLESS_STATE_DIR (routes/hostmap.go). Through the whole
// pipeline: HAProxy starts with the map, a new host reloads with a new
// map, and the old one is removed once HAProxy runs the new one.
func TestManyHostsRouteThroughTheHostsMap(t *testing.T) {
	testenv.HAProxy(t)
	const services = 70
	even, odd := namedBackend(t, "even"), namedBackend(t, "odd")
	dir := t.TempDir()
	write := func(s int) {
		port := even
		if s%2 == 1 {
			port = odd
		}
		writeAtomic(t, filepath.Join(dir, fmt.Sprintf("svc%02d.yaml", s)),
			fmt.Sprintf("name: svc%02d\ntags: [\"seamless.http.host=svc%02d.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", s, s, port))
	}
	for s := range services {
		write(s)
	}
	httpAddr := testenv.Addr(testenv.FreePort(t))
	state := filepath.Join(t.TempDir(), "state")
	startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
		"SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + httpAddr, "SEAMLESS_STATS_BIND=",
		"SEAMLESS_STATE_DIR=" + state, "SEAMLESS_WAIT=0", "SEAMLESS_SERVER_SLOTS=4"}})
	served := func(hosts ...int) func() bool {
		return func() bool {
			for _, s := range hosts {
				want := map[bool]string{false: "even", true: "odd"}[s%2 == 1]
				if code, body := getHost(httpAddr, fmt.Sprintf("SVC%02d.test", s), "/"); code != 200 || body != want {
					return false
				}
			}
			return true
		}
	}
	testenv.Eventually(t, 30*time.Second, "the first, a middle and the last host served by their backends", served(0, 33, 68, 69))
	maps := func() []string {
		m, _ := filepath.Glob(filepath.Join(state, "hosts-*.map"))
		return m
	}
	first := maps()
	cfg, err := os.ReadFile(filepath.Join(state, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || !strings.Contains(string(cfg), "map_str("+first[0]+")") || strings.Contains(string(cfg), "-m str svc05.test }") {
		t.Fatalf("maps %v; the configuration:\n%s", first, cfg)
	}

	write(services) // a new host: a new map, with a reload
	testenv.Eventually(t, 30*time.Second, "the new host served", served(services, 0))
	testenv.Eventually(t, 10*time.Second, "only the new map is left", func() bool {
		m := maps()
		return len(m) == 1 && m[0] != first[0]
	})
}

// `seamless render` and `seamless check` with as many hosts: render prints
// a rule per host (it names no file, and writes nothing into a running
// seamless's state), check validates the map in a directory of its own.
func TestRenderAndCheckWithManyHosts(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	for s := range 70 {
		writeAtomic(t, filepath.Join(dir, fmt.Sprintf("svc%02d.yaml", s)),
			fmt.Sprintf("name: svc%02d\ntags: [\"seamless.http.host=svc%02d.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", s, s, 9000+s))
	}
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) (string, string, error) {
		c := exec.Command(seamlessBin, cmd)
		c.Env = append(os.Environ(), "SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR="+dir,
			"SEAMLESS_STATE_DIR="+state, "SEAMLESS_HTTP_BIND=127.0.0.1:5001")
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		return stdout.String(), stderr.String(), err
	}
	out, errOut, err := run("render")
	if err != nil {
		t.Fatalf("render: %v\n%s", err, errOut)
	}
	if strings.Contains(out, "map_str(") || !strings.Contains(out, "-m str svc69.test }") {
		t.Errorf("render does not print a rule per host:\n%s", out)
	}
	if _, errOut, err := run("check"); err != nil {
		t.Fatalf("check: %v\n%s", err, errOut)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("render or check wrote into SEAMLESS_STATE_DIR: %v", entries)
	}
}
