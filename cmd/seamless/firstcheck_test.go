package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// The built-in template's first configuration, with nothing applied
// before, is checked by HAProxy's start alone, not by a haproxy -c before
// it: the check would parse the same file once more (seconds at 100,000
// servers) with nothing running to protect. A template of yours is still
// checked first, so that a refusal names its lines; so is a later start
// over the file the first one left.
func TestFirstStartChecks(t *testing.T) {
	real := testenv.HAProxy(t)
	for _, tc := range []struct {
		name     string
		template bool
		restart  bool
		want     string // the first runs of HAProxy: a check of the candidate, the master
	}{
		{name: "builtin", want: "master"},
		{name: "restart", restart: true, want: "check master"},
		{name: "template", template: true, want: "check master"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The wrapper records the runs that matter: a check of the
			// rendered candidate, and the master's start.
			dir := t.TempDir()
			state := filepath.Join(dir, "state")
			calls, wrapper := filepath.Join(dir, "calls"), filepath.Join(dir, "haproxy")
			script := fmt.Sprintf(`#!/bin/sh
case " $* " in
  *" -c "*" %[1]s/haproxy.cfg.new "*) echo check >> %[2]s ;;
  *" -c "*) ;;
  *" -W "*) echo master >> %[2]s ;;
esac
exec %[3]s "$@"
`, state, calls, real)
			if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			services := t.TempDir()
			writeAtomic(t, filepath.Join(services, "web.yaml"), fmt.Sprintf(
				"name: web\ntags: [\"seamless.http.host=web.test\"]\ninstances:\n  - id: main\n    address: 127.0.0.1\n    port: %d\n",
				namedBackend(t, "web")))
			httpAddr := testenv.Addr(testenv.FreePort(t))
			env := []string{"SEAMLESS_HAPROXY_BIN=" + wrapper, "SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + services,
				"SEAMLESS_HTTP_BIND=" + httpAddr, "SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + state}
			if tc.template {
				tmpl := filepath.Join(dir, "haproxy.cfg.tmpl")
				writeAtomic(t, tmpl, fmt.Sprintf(`defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend www
    bind %s
    http-request return status 200 content-type text/plain string "web"
`, httpAddr))
				env = append(env, "SEAMLESS_TEMPLATE="+tmpl)
			}
			serves := func() bool {
				code, body := getHost(httpAddr, "web.test", "/")
				return code == 200 && body == "web"
			}
			if tc.restart {
				in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: env})
				testenv.Eventually(t, 20*time.Second, "the first run serves", serves)
				in.signal(syscall.SIGTERM)
				if code := in.wait(20 * time.Second); code != 0 {
					t.Fatalf("the first run exited %d, want 0", code)
				}
				if err := os.Remove(calls); err != nil {
					t.Fatal(err)
				}
			}
			startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: env})
			testenv.Eventually(t, 20*time.Second, "web serves", serves)
			b, err := os.ReadFile(calls)
			if err != nil {
				t.Fatal(err)
			}
			runs := strings.Fields(string(b))
			if got := strings.Join(runs[:min(len(runs), len(strings.Fields(tc.want)))], " "); got != tc.want {
				t.Errorf("HAProxy ran %v before serving, want %q first", runs, tc.want)
			}
		})
	}
}
