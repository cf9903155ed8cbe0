package config

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.RunDir != "/var/run/seamless" || c.StopGrace != 8*time.Second || c.StatusAddr != ":8405" {
		t.Errorf("defaults: %+v", c)
	}
	if c.ConsulWatches != 128 {
		t.Errorf("SEAMLESS_CONSUL_WATCHES defaults to %d, want 128: room under a Consul agent's default of 200 connections per client", c.ConsulWatches)
	}
	if c.ConsulQueryWait != 5*time.Minute {
		t.Errorf("SEAMLESS_CONSUL_QUERY_WAIT defaults to %s, want Consul's own 5m", c.ConsulQueryWait)
	}
	if c.StopGrace >= 10*time.Second {
		t.Error("the default drain must end before Docker's 10s stop timeout")
	}
}

func TestBadValuesNameTheVariable(t *testing.T) {
	tests := []struct{ key, value, want string }{
		{"SEAMLESS_STOP_GRACE", "soon", `SEAMLESS_STOP_GRACE="soon"`},
		{"SEAMLESS_STOP_GRACE", "-1s", "SEAMLESS_STOP_GRACE"},
		{"SEAMLESS_MAX_RELOADS", "many", `SEAMLESS_MAX_RELOADS="many"`},
		{"SEAMLESS_RUN_DIR", "relative/dir", "SEAMLESS_RUN_DIR"},
		{"SEAMLESS_STATUS_ADDR", "8405", "SEAMLESS_STATUS_ADDR"},
		{"SEAMLESS_LOG_FORMAT", "xml", "SEAMLESS_LOG_FORMAT"},
		{"SEAMLESS_LOG_LEVEL", "loud", "SEAMLESS_LOG_LEVEL"},
		{"SEAMLESS_RELOAD_TIMEOUT", "0s", "SEAMLESS_RELOAD_TIMEOUT"},
		{"SEAMLESS_CONSUL_WATCHES", "2", "SEAMLESS_CONSUL_WATCHES"},
		// Consul caps a blocking query's wait at 10m without a word.
		{"SEAMLESS_CONSUL_QUERY_WAIT", "11m", "SEAMLESS_CONSUL_QUERY_WAIT"},
		{"SEAMLESS_CONSUL_QUERY_WAIT", "0s", "SEAMLESS_CONSUL_QUERY_WAIT"},
		// ACME serves the built-in template's discovered hosts only.
		{"SEAMLESS_ACME_EMAIL", "ops@example.com", "SEAMLESS_ACME_EMAIL"},
		{"SEAMLESS_ACME_CA_BUNDLE", "roots.pem", "SEAMLESS_ACME_CA_BUNDLE"},
		{"SEAMLESS_ACME_EAB_KID", "kid-1", "SEAMLESS_ACME_EAB_KID"},
		// Consul KV prefixes go into KV paths as they are.
		{"SEAMLESS_CERTS_KV", "/tls/certs", "SEAMLESS_CERTS_KV"},
		{"SEAMLESS_CERTS_KV", "tls/certs/", "SEAMLESS_CERTS_KV"},
		{"SEAMLESS_CERTS_KV", "tls certs", "SEAMLESS_CERTS_KV"},
		{"SEAMLESS_ACME_KV", "seamless/acme", "SEAMLESS_ACME_KV"}, // without ACME
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.key, tt.value)
			_, err := Load()
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
		})
	}
}

// Passive checks take a server out on its traffic; only its checks bring
// it back.
func TestPassiveChecksWithoutHealthChecksIsRefused(t *testing.T) {
	t.Setenv("SEAMLESS_PASSIVE_CHECKS", "true")
	t.Setenv("SEAMLESS_HEALTH_CHECKS", "false")
	_, err := Load()
	if err == nil || !strings.Contains(err.Error(), "SEAMLESS_PASSIVE_CHECKS") || !strings.Contains(err.Error(), "SEAMLESS_HEALTH_CHECKS=true") {
		t.Fatalf("err = %v, want one naming both variables", err)
	}
	t.Setenv("SEAMLESS_HEALTH_CHECKS", "true")
	if c, err := Load(); err != nil || !c.PassiveChecks {
		t.Fatalf("with checks: %+v, %v", c.PassiveChecks, err)
	}
}

func TestEmptyStatusAddrDisables(t *testing.T) {
	t.Setenv("SEAMLESS_STATUS_ADDR", "")
	c, err := Load()
	if err != nil || c.StatusAddr != "" {
		t.Fatalf("got %+v, %v", c, err)
	}
}

func TestUsageListsEveryVariable(t *testing.T) {
	var b bytes.Buffer
	if err := Usage(&b); err != nil {
		t.Fatal(err)
	}
	for _, v := range Vars() {
		if v.Desc == "" {
			t.Errorf("%s has no description", v.Name)
		}
		if !strings.Contains(b.String(), v.Name) {
			t.Errorf("usage lacks %s", v.Name)
		}
	}
}

func TestUnknown(t *testing.T) {
	got := Unknown([]string{"SEAMLESS_STOP_GRAEC=1s", "SEAMLESS_RUN_DIR=/x", "PATH=/bin", "SEAMLESSX=1"})
	if len(got) != 1 || got[0] != "SEAMLESS_STOP_GRAEC" {
		t.Errorf("Unknown = %q", got)
	}
}

func TestParseWait(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Wait
		wantErr bool
	}{
		{in: "0", want: Wait{}},
		{in: "5s", want: Wait{5 * time.Second, 20 * time.Second}},
		{in: "200ms:2s", want: Wait{200 * time.Millisecond, 2 * time.Second}},
		{in: "2s:1s", wantErr: true},
		{in: "-1s", wantErr: true},
		{in: "soon", wantErr: true},
		{in: "1s:later", wantErr: true},
	} {
		var got Wait
		err := got.Decode(tc.in)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("Decode(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// The values the field test fed in: each was accepted and each broke
// something (a busy core, every reload failing, HAProxy refusing the
// generated defaults, "discovery with no sources").
func TestOutOfRangeValuesFromTheFieldAreRefused(t *testing.T) {
	for _, tt := range []struct{ key, value string }{
		{"SEAMLESS_SERVICES_RESCAN", "1ms"},
		{"SEAMLESS_RELOAD_TIMEOUT", "1ns"},
		{"SEAMLESS_STOP_GRACE", "1ns"},
		{"SEAMLESS_HARD_STOP_AFTER", "99999h"},
		{"SEAMLESS_SOURCES", ","},
		{"SEAMLESS_SOURCES", "consul,,file"},
		{"SEAMLESS_CONSUL_ADDRS", "127.0.0.1:8500,,127.0.0.1:8501"},
		{"SEAMLESS_CONSUL_ADDRS", "127.0.0.1:8500,consul-b"},
		{"SEAMLESS_CONSUL_ADDRS", "unix:///run/consul.sock,127.0.0.1:8500"},
		{"SEAMLESS_CONSUL_ADDRS", "127.0.0.1:8500,https://consul-b:8501"},
		{"SEAMLESS_CONSUL_MAX_STALE", "100ms"},
		{"SEAMLESS_CONSUL_SERVICES", "web"}, // without SEAMLESS_TEMPLATE
	} {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.key, tt.value)
			_, err := Load()
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.key) {
				t.Errorf("error %q does not name %s", err, tt.key)
			}
		})
	}
}

// Every number and duration has a documented range, read from its tags:
// both ends are accepted, one step beyond either is refused with an error
// that names the variable and the range. A new variable without a range
// fails here.
func TestEveryNumberHasARange(t *testing.T) {
	for _, v := range Vars() {
		if v.Type != "duration" && v.Type != "int" && v.Type != "min:max" {
			continue
		}
		if v.Min == "" || v.Max == "" {
			t.Errorf("%s (%s) has no range: give it min and max tags", v.Name, v.Type)
			continue
		}
		if !strings.Contains(v.Desc, "Range: "+v.Range()+".") {
			t.Errorf("%s: the description does not show the range: %q", v.Name, v.Desc)
		}
		beyond := func(s string, step int64) string {
			if v.Type == "int" {
				n, err := strconv.Atoi(s)
				if err != nil {
					t.Fatalf("%s: bad bound %q", v.Name, s)
				}
				return strconv.FormatInt(int64(n)+step, 10)
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				t.Fatalf("%s: bad bound %q", v.Name, s)
			}
			return (d + time.Duration(step)).String()
		}
		value := func(s string) string {
			if v.Type == "min:max" {
				return s + ":" + s
			}
			return s
		}
		cases := []struct {
			value string
			ok    bool
		}{
			{value(v.Min), true}, {value(v.Max), true},
			{value(beyond(v.Min, -1)), false}, {value(beyond(v.Max, 1)), false},
		}
		if v.Off != "" {
			cases = append(cases, struct {
				value string
				ok    bool
			}{value(v.Off), true})
		}
		for _, tc := range cases {
			t.Run(v.Name+"="+tc.value, func(t *testing.T) {
				t.Setenv(v.Name, tc.value)
				_, err := Load()
				switch {
				case tc.ok && err != nil:
					t.Errorf("refused: %v", err)
				case !tc.ok && err == nil:
					t.Errorf("accepted, outside %s", v.Range())
				case !tc.ok && (!strings.Contains(err.Error(), v.Name) || !strings.Contains(err.Error(), v.Range())):
					t.Errorf("error %q does not name %s and its range %s", err, v.Name, v.Range())
				}
			})
		}
	}
}

// ACME's keys under SEAMLESS_CERTS_KV would be read as certificates.
func TestKVPrefixesMustNotOverlap(t *testing.T) {
	t.Setenv("SEAMLESS_SOURCES", "consul")
	t.Setenv("SEAMLESS_ACME_EMAIL", "ops@example.com")
	t.Setenv("SEAMLESS_CERTS_KV", "tls")
	for _, acme := range []string{"tls", "tls/acme"} {
		t.Setenv("SEAMLESS_ACME_KV", acme)
		if _, err := Load(); err == nil || !strings.Contains(err.Error(), "SEAMLESS_ACME_KV") || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("SEAMLESS_ACME_KV=%s: %v", acme, err)
		}
	}
	t.Setenv("SEAMLESS_ACME_KV", "tls-acme")
	if _, err := Load(); err != nil {
		t.Errorf("separate prefixes: %v", err)
	}
}

func TestConsulAgents(t *testing.T) {
	t.Setenv("SEAMLESS_CONSUL_ADDRS", " 127.0.0.1:8500, http://consul-b:8501 ")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.ConsulAgents(), []string{"127.0.0.1:8500", "http://consul-b:8501"}; !slices.Equal(got, want) {
		t.Errorf("agents %q, want %q", got, want)
	}
	if c.ConsulMaxStale != 10*time.Second {
		t.Errorf("default maximum staleness %s, want 10s", c.ConsulMaxStale)
	}
}

// SEAMLESS_CONSUL_SERVICES is a list of names and shell patterns, for a
// template of the user's own; a bad pattern or an empty entry is refused.
func TestConsulServices(t *testing.T) {
	t.Setenv("SEAMLESS_TEMPLATE", "/etc/haproxy.tmpl")
	t.Setenv("SEAMLESS_CONSUL_SERVICES", " web, api-* ")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.ConsulServicePatterns(), []string{"web", "api-*"}; !slices.Equal(got, want) {
		t.Errorf("patterns %q, want %q", got, want)
	}
	for _, bad := range []string{"web,[", "web,,api"} {
		t.Setenv("SEAMLESS_CONSUL_SERVICES", bad)
		if _, err := Load(); err == nil || !strings.Contains(err.Error(), "SEAMLESS_CONSUL_SERVICES") {
			t.Errorf("%q: error %v, want one naming SEAMLESS_CONSUL_SERVICES", bad, err)
		}
	}
}
