package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// The backends view against a real seamless and HAProxy fed by the file
// source: one slot drained and one put in maintenance over the master CLI
// show so on /status and on the page, as Chromium renders it.
func TestBackendsViewShowsHAProxysLiveStates(t *testing.T) {
	testenv.HAProxy(t)
	bin := testenv.Chromium(t)
	dir := t.TempDir()
	ports := []int{namedBackend(t, "web1"), namedBackend(t, "web2"), namedBackend(t, "web3")}
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(ports...)))
	// A service the built-in template leaves out, and why.
	writeAtomic(t, filepath.Join(dir, "plain.yaml"), "name: plain\ntags: [\"seamless.http.host=not a host\"]\ninstances:\n  - address: 127.0.0.1\n    port: 9\n")
	httpAddr := testenv.Addr(testenv.FreePort(t))
	env := []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + httpAddr,
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SEAMLESS_WAIT=0"}
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: env})
	var web status.Backend
	testenv.Eventually(t, 30*time.Second, "the web backend and its three instances are on /status", func() bool {
		r, err := tryStatus(in)
		if err != nil {
			return false
		}
		for _, b := range r.Backends {
			n := 0
			for _, s := range b.Servers {
				if s.Instance != "" && s.Health == "passing" && strings.HasPrefix(s.State, "UP") {
					n++
				}
			}
			if n == 3 {
				web = b
				return true
			}
		}
		return false
	})
	var held []status.BackendServer
	for _, s := range web.Servers {
		if s.Instance != "" {
			held = append(held, s)
		}
	}
	drained, maint := held[0], held[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, cmd := range []string{"set server " + web.Name + "/" + drained.Name + " state drain", "set server " + web.Name + "/" + maint.Name + " state maint"} {
		if out, err := in.cli().Do(ctx, "@1 "+cmd); err != nil || strings.TrimSpace(out) != "" {
			t.Fatalf("%s: %q %v", cmd, out, err)
		}
	}
	r := getStatus(t, in)
	states := map[string]status.BackendServer{}
	for _, b := range r.Backends {
		if b.Name == web.Name {
			for _, s := range b.Servers {
				states[s.Name] = s
			}
		}
	}
	if s := states[drained.Name]; !strings.HasPrefix(s.State, "DRAIN") || s.Instance != drained.Instance || s.Address != drained.Address {
		t.Errorf("drained slot %+v", s)
	}
	if s := states[maint.Name]; !strings.HasPrefix(s.State, "MAINT") || s.Instance != maint.Instance {
		t.Errorf("slot in maintenance %+v", s)
	}
	if !slices.Contains(r.Routes, status.Route{Match: "host 127.0.0.1 path /", Service: "web", Backend: web.Name}) {
		t.Errorf("routes %+v, want 127.0.0.1/ to web's backend %s", r.Routes, web.Name)
	}
	for _, s := range states {
		if s.Instance == "" && s.Address != "" {
			t.Errorf("free slot %+v shows its placeholder address", s)
		}
	}
	if !slices.ContainsFunc(r.Skipped, func(s string) bool { return strings.Contains(s, "plain") }) {
		t.Errorf("skipped %q, want the service without routing tags", r.Skipped)
	}

	shot := filepath.Join(t.TempDir(), "backends.png")
	if dir := os.Getenv("SEAMLESS_ARTIFACTS"); dir != "" {
		shot = filepath.Join(dir, "backends.png")
	}
	dom := testenv.RunChromium(t, bin, "http://"+in.status+"/", "--dump-dom")
	testenv.RunChromium(t, bin, "http://"+in.status+"/", "--screenshot="+shot, "--window-size=1280,1400")
	t.Logf("screenshot: %s", shot)
	for _, want := range []string{
		`<span class="pill st-drain">DRAIN</span>`,
		`<span class="pill st-maint">MAINT</span>`,
		"<code>" + drained.Instance + "</code>",
		"<code>" + maint.Instance + "</code>",
		"<code>" + web.Name + "</code>",
		"<td class=\"text\">host 127.0.0.1 path /</td>",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page as Chromium built it lacks %s", want)
		}
	}
	// On a phone the page is still laid out for its width: the tables
	// scroll inside their box, the page does not.
	testenv.RunChromium(t, bin, "http://"+in.status+"/", "--screenshot="+filepath.Join(filepath.Dir(shot), "backends-phone.png"), "--window-size=390,844")
}
