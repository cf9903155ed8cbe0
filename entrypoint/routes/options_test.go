package routes

import (
	"slices"
	"strings"
	"testing"
)

func TestNewValidatesOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		err  string // "" means accepted
	}{
		{name: "the defaults", opts: DefaultOptions()},
		{name: "a bare port", opts: Options{HTTPBind: "5001"}},
		{name: "an IPv4 host", opts: Options{HTTPBind: "127.0.0.1:5001", StatsBind: "127.0.0.1:8404"}},
		{name: "an IPv6 host", opts: Options{HTTPBind: "[::]:80", StatsBind: "[::1]:8404"}},
		{name: "a star host", opts: Options{HTTPBind: "*:80"}},
		{name: "stats disabled", opts: Options{HTTPBind: ":80", StatsBind: ""}},
		{name: "every health filter", opts: Options{HTTPBind: ":80", Health: []string{"passing", "warning", "critical", "maintenance", "any"}}},
		{name: "no HTTP bind", opts: Options{}, err: "SEAMLESS_HTTP_BIND is empty"},
		{name: "a word for a port", opts: Options{HTTPBind: "http"}, err: "SEAMLESS_HTTP_BIND: \"http\": not a port number"},
		{name: "port zero", opts: Options{HTTPBind: ":0"}, err: "SEAMLESS_HTTP_BIND: \":0\": port 0 is outside 1–65535"},
		{name: "a port out of range", opts: Options{HTTPBind: ":70000"}, err: "SEAMLESS_HTTP_BIND"},
		{name: "a host name", opts: Options{HTTPBind: "localhost:80"}, err: "SEAMLESS_HTTP_BIND: \"localhost:80\": the host must be an IP address"},
		{name: "IPv6 without brackets", opts: Options{HTTPBind: "::1:80"}, err: "SEAMLESS_HTTP_BIND: \"::1:80\" is not host:port"},
		{name: "a bad stats bind", opts: Options{HTTPBind: ":80", StatsBind: "stats"}, err: "SEAMLESS_STATS_BIND"},
		{name: "stats on the HTTP port", opts: Options{HTTPBind: ":80", StatsBind: "127.0.0.1:80"}, err: "SEAMLESS_STATS_BIND: port 80 is SEAMLESS_HTTP_BIND's too"},
		{name: "an unknown health state", opts: Options{HTTPBind: ":80", Health: []string{"healthy"}}, err: "SEAMLESS_CONSUL_HEALTH: \"healthy\" is not one of"},
		{name: "every error at once", opts: Options{HTTPBind: "x", StatsBind: "y", Health: []string{"z"}},
			err: "SEAMLESS_HTTP_BIND: \"x\": not a port number\nSEAMLESS_STATS_BIND: \"y\": not a port number\nSEAMLESS_CONSUL_HEALTH"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts, nil)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.err != "" && err == nil:
				t.Fatalf("New accepted %+v, want an error like %q", tt.opts, tt.err)
			case tt.err != "" && !strings.Contains(err.Error(), tt.err):
				t.Fatalf("New: %v\nwant it to say %q", err, tt.err)
			}
		})
	}
}

func TestBindString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"80", ":80"},
		{":80", ":80"},
		{"*:80", ":80"},
		{"0.0.0.0:80", "0.0.0.0:80"},
		{"[::]:80", "[::]:80"},
		{"[::ffff:127.0.0.1]:80", "127.0.0.1:80"},
		{"[2001:DB8::1]:80", "[2001:db8::1]:80"},
	}
	for _, tt := range tests {
		b, err := parseBind(tt.in)
		if err != nil || b.String() != tt.want {
			t.Errorf("parseBind(%q) = %q, %v; want %q", tt.in, b.String(), err, tt.want)
		}
	}
}

// seamless's own listeners (SEAMLESS_STATUS_ADDR, SEAMLESS_DEBUG_ADDR) are
// reserved like HAProxy's frontends: a seamless.tcp.port on one would
// fail to bind (and freeze every later change), so it is left out, naming
// the variable.
func TestSeamlessOwnPortsAreReserved(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"SEAMLESS_STATUS_ADDR", Options{HTTPBind: "127.0.0.1:18080", StatusAddr: ":18405"}},
		{"SEAMLESS_DEBUG_ADDR", Options{HTTPBind: "127.0.0.1:18080", DebugAddr: "127.0.0.1:18405"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, mustNew(t, tc.opts), catalog(
				inst("web", "web-1", "10.0.0.1", 8080, "seamless.http.path=/"),
				inst("db", "db-1", "10.0.0.2", 5432, "seamless.tcp.port=18405"),
			))
			if strings.Contains(string(out.Config), ":18405") {
				t.Errorf("the port became a listener:\n%s", out.Config)
			}
			if !slices.ContainsFunc(out.Skipped, func(s string) bool {
				return strings.Contains(s, "port 18405 is "+tc.name+"'s")
			}) {
				t.Errorf("skipped %q, want the tag left out naming %s", out.Skipped, tc.name)
			}
		})
	}
}
