package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/metrics"
)

var update = flag.Bool("update", false, "rewrite testdata/status.json from the current output")

// t0 is the fixed "now" of the fixtures.
var t0 = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// fixture is a discovery-mode seamless a few minutes into a bad morning:
// Docker is unreachable, a template edit was refused, a reload failed.
func fixture() Report {
	return Report{
		Time: t0, Version: "1.4.0", Commit: "9109275", Hostname: "lb-1", Mode: ModeDiscovery,
		// The server overrides these with its own checks.
		Healthy: false, UnhealthyReason: "ignored",
		Sources: []Source{
			{Name: "consul", Up: true, LastSuccess: t0.Add(-2 * time.Second)},
			{Name: "docker", Up: false, LastSuccess: t0.Add(-3 * time.Minute),
				LastError:   "Cannot connect to the Docker daemon at unix:///var/run/docker.sock (DOCKER_HOST); keeping its last answer and retrying",
				LastErrorAt: t0.Add(-4 * time.Second)},
			{Name: "file", Up: true, LastSuccess: t0.Add(-41 * time.Minute),
				LastError: "services/api.yaml: port 0 is out of range", LastErrorAt: t0.Add(-52 * time.Minute)},
		},
		Applies: []Apply{
			{Time: t0.Add(-2 * time.Second), Reason: "consul", Change: "web: +2 instances", How: metrics.Runtime, DurationSeconds: 0.0042},
			{Time: t0.Add(-95 * time.Second), Reason: "consul, docker", Change: "api: new service (3 instances); web: 1 now critical", How: metrics.Reloaded, DurationSeconds: 0.183},
			{Time: t0.Add(-3 * time.Minute), Reason: "docker", Change: "the configuration is the same; catalog: web: 1 instance changed", How: metrics.Unchanged, DurationSeconds: 0.0009},
			{Time: t0.Add(-7 * time.Minute), Reason: "SIGHUP", How: metrics.Refused, DurationSeconds: 0.021,
				Error: `template: /etc/seamless/haproxy.cfg.tmpl:12: function "servce" not defined`},
			{Time: t0.Add(-12 * time.Minute), Reason: "file", Change: "admin: new service (1 instance)", How: metrics.Failed, DurationSeconds: 1.52,
				Error: "reload failed, old workers keep serving: [ALERT] Binding [haproxy.cfg:41] for frontend admin: cannot bind socket (Address in use) [0.0.0.0:8443]"},
		},
		Reloads: []Reload{
			{Time: t0.Add(-95 * time.Second), Trigger: "discovery: consul, docker", Result: ReloadOK, DurationSeconds: 0.151},
			{Time: t0.Add(-12 * time.Minute), Trigger: "discovery: file", Result: ReloadRefused, DurationSeconds: 1.49,
				Error:  "HAProxy refused the new configuration",
				Alerts: []string{"[ALERT]    (412) : Binding [/var/lib/seamless/haproxy.cfg:41] for frontend admin: cannot bind socket (Address in use) [0.0.0.0:8443]"}},
		},
		ConfigFiles: []ConfigFile{{
			Path:   "/var/lib/seamless/haproxy.cfg",
			SHA256: "5f1c0f4bd1e57a3b0f22a8e8d1f1b0e8c9f8a0d6c3e2b7a1f4e5d6c7b8a9f0e1",
			Size:   18734, Modified: t0.Add(-95 * time.Second),
			RunningSHA256: "5f1c0f4bd1e57a3b0f22a8e8d1f1b0e8c9f8a0d6c3e2b7a1f4e5d6c7b8a9f0e1",
		}, {
			Path:   "/usr/local/etc/haproxy/extra.cfg",
			SHA256: "0b9e3d1c55aa41f2a8c7e6d5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a2910",
			Size:   512, Modified: t0.Add(-9 * time.Minute),
			RunningSHA256: "c4d2a6e0f19b83a7d5e4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2",
			DiffersSince:  t0.Add(-8 * time.Minute),
			DiffersReason: "[ALERT]    (77) : config : parsing [/usr/local/etc/haproxy/extra.cfg:3] : unknown keyword 'tiemout' in 'defaults' section",
		}},
		Config: Fingerprint{
			SHA256:        "e3a41c9f0d2b7a6c5e4f3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a",
			MembersSHA256: "9b1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f",
		},
		ConsulIndex: map[string]uint64{"dc1": 48213, "dc2": 977},
		Routes: []Route{
			{Match: "host web.example.com path /api", Service: "api", Backend: "http-api"},
			{Match: "host web.example.com path /", Service: "web", Backend: "http-web"},
			{Match: "tcp port 5432", Service: "db", Backend: "tcp-db"},
		},
		Backends: []Backend{
			{Name: "http-web", Status: "UP", Sessions: 14, Servers: []BackendServer{
				{Name: "s1", Address: "10.0.1.5:8080", State: "UP", Sessions: 9, Instance: "node-1/web-1", Health: "passing"},
				{Name: "s2", Address: "10.0.1.6:8080", State: "DRAIN", Sessions: 5, Instance: "node-2/web-2", Health: "critical"},
				{Name: "s3", Address: "10.0.1.7:8080", State: "MAINT", Sessions: 0, Instance: "node-3/web-3", Health: "maintenance"},
				{Name: "s4", State: "MAINT", Sessions: 0},
			}},
			{Name: "http-api", Status: "UP", Sessions: 2, Servers: []BackendServer{
				{Name: "s1", Address: "10.0.2.8:9000", State: "UP", Sessions: 2, Instance: "api-7f9c", Health: "warning"},
				{Name: "s2", Address: "10.0.2.9:9000", State: "DOWN", Sessions: 0, Instance: "api-d41e", Health: "passing"},
			}},
		},
		Skipped: []string{
			`service admin: tag seamless.http.host="admin" duplicates service web's route web.example.com/ (registered first)`,
			"service metrics: no seamless.* tags",
		},
		Certificates: []Certificate{
			{Name: "default", Source: "default", Hosts: []string{"seamless.invalid"}, Issuer: "CN=seamless.invalid",
				Serial: "5C0FFEE1", NotAfter: t0.Add(3650 * 24 * time.Hour), ServedSince: t0.Add(-41 * time.Minute),
				File: "/var/lib/seamless/certs/default.pem"},
			{Name: "shop", Source: "dir", Hosts: []string{"shop.example.com", "www.shop.example.com"},
				Issuer: "CN=R11,O=Let's Encrypt,C=US", Serial: "04A1B2C3D4E5F60718293A4B5C6D7E8F9012", NotAfter: t0.Add(61 * 24 * time.Hour),
				ServedSince: t0.Add(-2 * time.Second), File: "/etc/seamless/certs/shop.pem"},
			{Name: "web.example.com", Source: "acme", Hosts: []string{"web.example.com"}, Issuer: "CN=R10,O=Let's Encrypt,C=US",
				Serial: "03F2E1D0", NotAfter: t0.Add(12 * 24 * time.Hour), Expiring: true, ServedSince: t0.Add(-78 * 24 * time.Hour)},
		},
		HAProxy: HAProxy{
			Version:    "3.2.4-1",
			Master:     &Proc{Pid: 7, Reloads: 3, Version: "3.2.4-1"},
			Workers:    []Proc{{Pid: 412, Reloads: 0, Version: "3.2.4-1"}},
			OldWorkers: []Proc{{Pid: 388, Reloads: 1, Version: "3.2.4-1"}},
		},
	}
}

// serve serves rep as the status listener would, with the given checks.
func serve(t *testing.T, rep Report, healthy, ready error) string {
	t.Helper()
	h := handler(metrics.New().Registry, func() error { return healthy }, func() error { return ready },
		WithStatus(func(context.Context) Report { return rep }))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestStatusJSONGolden(t *testing.T) {
	url := serve(t, fixture(), nil, errors.New("source docker has not answered yet"))
	resp, err := http.Get(url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/status: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	golden := filepath.Join("testdata", "status.json")
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("/status differs from %s (go test -update rewrites it):\n%s", golden, got.String())
	}
}

func TestStatusReportsTheProbesOwnAnswers(t *testing.T) {
	for _, tc := range []struct {
		name             string
		healthy, ready   error
		wantH, wantR     bool
		wantHWhy, wantRW string
	}{
		{"healthy and ready", nil, nil, true, true, "", ""},
		{"healthy, first discovery pending", nil, errors.New("first discovery not done"), true, false, "", "first discovery not done"},
		{"unhealthy is not ready either, as /readyz", errors.New("haproxy master exited"), nil, false, false, "haproxy master exited", "haproxy master exited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A drop-in report: nothing but the mode; lists stay [].
			url := serve(t, Report{Mode: ModeDropIn, Healthy: true, Ready: true}, tc.healthy, tc.ready)
			var got map[string]any
			getJSON(t, url+"/status", &got)
			if got["healthy"] != tc.wantH || got["ready"] != tc.wantR {
				t.Errorf("healthy=%v ready=%v, want %v %v", got["healthy"], got["ready"], tc.wantH, tc.wantR)
			}
			if why, _ := got["unhealthy_reason"].(string); why != tc.wantHWhy {
				t.Errorf("unhealthy_reason %q, want %q", why, tc.wantHWhy)
			}
			if why, _ := got["unready_reason"].(string); why != tc.wantRW {
				t.Errorf("unready_reason %q, want %q", why, tc.wantRW)
			}
			for _, list := range []string{"sources", "applies", "config_files"} {
				if l, ok := got[list].([]any); !ok || len(l) != 0 {
					t.Errorf("%s = %#v, want []", list, got[list])
				}
			}
			hp := got["haproxy"].(map[string]any)
			for _, list := range []string{"workers", "old_workers"} {
				if l, ok := hp[list].([]any); !ok || len(l) != 0 {
					t.Errorf("haproxy.%s = %#v, want []", list, hp[list])
				}
			}
		})
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// hostile is a report in which everything that comes from outside tries
// to become markup.
func hostile() Report {
	r := fixture()
	const x = `<script>document.title="pwned"</script>`
	r.Hostname = `"><img src=x onerror=alert(1)>`
	r.Sources[1].Name = "docker" + x
	r.Sources[1].LastError = "dial unix /var/run/docker.sock: " + x
	r.Applies[0].Reason = x
	r.Applies[0].Change = `web</td></tr></table>` + x
	r.Applies[0].How = `runtime" onmouseover="alert(1)`
	r.Applies[3].Error = x
	r.ConfigFiles[0].Path = "/tmp/" + x
	r.ConfigFiles[0].SHA256 = `" onclick="alert(1)`
	r.HAProxy.Version = x
	r.ConsulIndex = map[string]uint64{"dc" + x: 1} // a datacenter's name is Consul's
	r.HAProxy.Error = "master CLI: " + x
	r.Backends[0].Servers[0].Name = x
	r.Backends[0].Servers[1].State = `DRAIN" onclick="alert(1)`
	r.Reloads[1].Alerts = []string{x}
	r.Skipped = append(r.Skipped, x)
	r.Routes[0].Match = x
	r.ConfigFiles[1].DiffersReason = x
	r.Certificates[1].Hosts[0] = x
	r.Certificates[1].Issuer = x
	r.Certificates[2].Serial = `" onclick="alert(1)`
	return r
}

func TestPageEscapesWhatItShows(t *testing.T) {
	url := serve(t, hostile(), errors.New("haproxy: "+`<script>alert(1)</script>`), nil)
	resp, err := http.Get(url + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	body := b.String()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("no restrictive Content-Security-Policy: %q", csp)
	}
	for _, bad := range []string{"<script", "<img", `" onmouseover=`, `" onclick=`, "</table><script"} {
		if strings.Contains(body, bad) {
			t.Errorf("the page contains %q unescaped", bad)
		}
	}
	for _, want := range []string{
		"&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;", // the text, shown as text
		"Unhealthy: haproxy: &lt;script&gt;alert(1)&lt;/script&gt;",
		"master CLI: &lt;script&gt;",
		"how-other", // an unknown How gets no class of its own
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

func TestPageShowsTheReport(t *testing.T) {
	url := serve(t, fixture(), nil, errors.New("source docker has not answered yet"))
	_, body := get(t, url+"/")
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`,
		"● healthy", "◌ not ready", "Not ready: source docker has not answered yet",
		"discovery mode", "seamless 1.4.0", "HAProxy 3.2.4-1",
		"<code>docker</code>", "Cannot connect to the Docker daemon", "4s ago",
		"2026-03-14 09:26:51Z", "web: &#43;2 instances", "4 ms", "1.52 s", "183 ms",
		`function &#34;servce&#34; not defined`,
		">412<", ">388<", "old worker",
		"/var/lib/seamless/haproxy.cfg", "5f1c0f4bd1e5…", "18.3 KiB",
		"Consul catalog at index <code>48213</code> (dc1) <code>977</code> (dc2)",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// Newest first, as given.
	if i, j := strings.Index(body, "web: &#43;2 instances"), strings.Index(body, "admin: new service"); i > j {
		t.Error("applies are not newest first")
	}
}

func TestStatusOnlyWhenAsked(t *testing.T) {
	srv := httptest.NewServer(handler(metrics.New().Registry, func() error { return nil }, func() error { return nil }))
	defer srv.Close()
	for _, path := range []string{"/status", "/"} {
		if code, _ := get(t, srv.URL+path); code != 404 {
			t.Errorf("%s without WithStatus: %d, want 404", path, code)
		}
	}
	url := serve(t, fixture(), nil, nil)
	if code, _ := get(t, url+"/nothing-here"); code != 404 {
		t.Errorf("/nothing-here: %d, want 404", code)
	}
}
