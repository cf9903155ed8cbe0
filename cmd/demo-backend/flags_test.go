package main

import (
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// containerAddrs is what a container on a compose network sees.
func containerAddrs() ([]net.Addr, error) {
	return []net.Addr{
		&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)},
		&net.IPNet{IP: net.ParseIP("::1"), Mask: net.CIDRMask(128, 128)},
		&net.IPNet{IP: net.ParseIP("fe80::42:acff:fe12:5"), Mask: net.CIDRMask(64, 128)},
		&net.IPNet{IP: net.ParseIP("172.18.0.5"), Mask: net.CIDRMask(16, 32)},
		&net.IPNet{IP: net.ParseIP("10.0.1.9"), Mask: net.CIDRMask(24, 32)},
	}, nil
}

func loopbackOnly() ([]net.Addr, error) {
	return []net.Addr{&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)}}, nil
}

func v6Only() ([]net.Addr, error) {
	return []net.Addr{
		&net.IPNet{IP: net.ParseIP("::1"), Mask: net.CIDRMask(128, 128)},
		&net.IPNet{IP: net.ParseIP("2001:db8::5"), Mask: net.CIDRMask(64, 128)},
	}, nil
}

func TestFlags(t *testing.T) {
	// Consul's variables on the machine running the tests must not leak in.
	t.Setenv("CONSUL_HTTP_ADDR", "")
	t.Setenv("CONSUL_HTTP_SSL", "")
	host, _ := os.Hostname()

	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		addrs func() ([]net.Addr, error)
		check func(t *testing.T, c config)
	}{
		{
			name: "without consul flags nothing registers, nothing drains and the listen address names the backend",
			args: []string{"-listen", "127.0.0.1:9001"},
			check: func(t *testing.T, c config) {
				if c.Consul != nil || c.Name != "127.0.0.1:9001" || c.Drain != 0 {
					t.Errorf("got %+v", c)
				}
			},
		},
		{
			name: "without consul a drain is what -drain says",
			args: []string{"-listen", "127.0.0.1:9001", "-drain", "3s"},
			check: func(t *testing.T, c config) {
				if c.Consul != nil || c.Drain != 3*time.Second {
					t.Errorf("got %+v", c)
				}
			},
		},
		{
			name: "a drain idles 1s and is bounded at 8s by default, or at a longer -drain",
			args: []string{"-listen", "127.0.0.1:9001", "-drain", "12s"},
			check: func(t *testing.T, c config) {
				if c.DrainIdle != time.Second || c.DrainMax != 12*time.Second {
					t.Errorf("idle %s, max %s, want 1s and 12s", c.DrainIdle, c.DrainMax)
				}
			},
		},
		{
			name: "the drain's idle time and bound are configurable",
			args: []string{"-listen", "127.0.0.1:9001", "-drain", "2s", "-drain-idle", "0", "-drain-max", "30s"},
			check: func(t *testing.T, c config) {
				if c.Drain != 2*time.Second || c.DrainIdle != 0 || c.DrainMax != 30*time.Second {
					t.Errorf("drain %s, idle %s, max %s", c.Drain, c.DrainIdle, c.DrainMax)
				}
			},
		},
		{
			name: "a listen address without host (a container) answers with the host name",
			args: []string{"-listen", ":8080"},
			check: func(t *testing.T, c config) {
				if c.Name != host {
					t.Errorf("name %q, want the host name %q", c.Name, host)
				}
			},
		},
		{
			name:  "in a container the first non-loopback IPv4 address is advertised",
			args:  []string{"-listen", ":8080", "-consul", "consul:8500"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				r := c.Consul
				if r.Address != "172.18.0.5" || r.Port != 8080 || r.ID != "web-172.18.0.5-8080" || r.Service != "web" {
					t.Errorf("got %+v", r)
				}
				if r.API.Address != "consul:8500" || r.API.Scheme != "http" {
					t.Errorf("agent %s://%s", r.API.Scheme, r.API.Address)
				}
				if r.CheckInterval != time.Second || r.DeregisterAfter != time.Minute || r.Resync != 10*time.Second || c.Drain != 5*time.Second || c.DrainMax != 8*time.Second {
					t.Errorf("check %s, deregister after %s, resync %s, drain %s, drain max %s", r.CheckInterval, r.DeregisterAfter, r.Resync, c.Drain, c.DrainMax)
				}
			},
		},
		{
			name:  "tags repeat and take comma lists; duplicates and blanks go",
			args:  []string{"-listen", ":8080", "-consul", "consul:8500", "-tags", "seamless.http.host=localhost, seamless.http.host=127.0.0.1", "-tags", "a", "-tags", "a,,"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				want := []string{"seamless.http.host=localhost", "seamless.http.host=127.0.0.1", "a"}
				if !slices.Equal(c.Consul.Tags, want) {
					t.Errorf("tags %q, want %q", c.Consul.Tags, want)
				}
			},
		},
		{
			name:  "a listen IP is what is advertised",
			args:  []string{"-listen", "127.0.0.1:9002", "-consul", "127.0.0.1:8500", "-service", "api", "-id", "api-1"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				if r := c.Consul; r.Address != "127.0.0.1" || r.Port != 9002 || r.ID != "api-1" || r.Service != "api" {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			name:  "-advertise with a port overrides the listen port (a published or forwarded port)",
			args:  []string{"-listen", ":8080", "-consul", "consul:8500", "-advertise", "10.1.2.3:18080"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				if r := c.Consul; r.Address != "10.1.2.3" || r.Port != 18080 || r.ID != "web-10.1.2.3-18080" {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			name:  "an IPv6-only machine advertises its global IPv6 address",
			args:  []string{"-listen", "[::]:8080", "-consul", "consul:8500"},
			addrs: v6Only,
			check: func(t *testing.T, c config) {
				if r := c.Consul; r.Address != "2001:db8::5" {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			name:  "-register takes the agent from CONSUL_HTTP_ADDR",
			args:  []string{"-listen", ":8080", "-register"},
			env:   map[string]string{"CONSUL_HTTP_ADDR": "https://consul.internal:8501"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				if a := c.Consul.API; a.Address != "consul.internal:8501" || a.Scheme != "https" {
					t.Errorf("agent %s://%s", a.Scheme, a.Address)
				}
			},
		},
		{
			name:  "-consul as a URL picks the scheme",
			args:  []string{"-listen", ":8080", "-consul", "https://consul:8501/"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				if a := c.Consul.API; a.Address != "consul:8501" || a.Scheme != "https" {
					t.Errorf("agent %s://%s", a.Scheme, a.Address)
				}
			},
		},
		{
			name:  "check, deregistration, resync and drain are configurable",
			args:  []string{"-listen", ":8080", "-consul", "consul:8500", "-check-interval", "250ms", "-deregister-after", "2m", "-resync", "1s", "-drain", "0"},
			addrs: containerAddrs,
			check: func(t *testing.T, c config) {
				if r := c.Consul; r.CheckInterval != 250*time.Millisecond || r.DeregisterAfter != 2*time.Minute || r.Resync != time.Second || c.Drain != 0 {
					t.Errorf("got %+v, drain %s", r, c.Drain)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			addrs := tt.addrs
			if addrs == nil {
				addrs = loopbackOnly
			}
			c, err := parseFlags(tt.args, io.Discard, addrs)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestFlagErrors(t *testing.T) {
	t.Setenv("CONSUL_HTTP_ADDR", "")
	tests := []struct {
		name  string
		args  []string
		addrs func() ([]net.Addr, error)
		want  string
	}{
		{"a Consul flag without -consul or -register", []string{"-tags", "seamless.http.host=x"}, nil, "-tags needs -consul ADDR or -register"},
		{"an unknown scheme", []string{"-consul", "ftp://consul:8500"}, nil, "scheme must be http or https"},
		{"an agent without a port", []string{"-consul", "consul"}, nil, "want host:port"},
		{"a random listen port cannot be registered", []string{"-listen", "127.0.0.1:0", "-consul", "consul:8500"}, nil, "registering needs a fixed port"},
		{"a name is not an address to advertise", []string{"-listen", ":8080", "-consul", "consul:8500", "-advertise", "web1"}, nil, "not an IP address"},
		{"nothing to advertise", []string{"-listen", ":8080", "-consul", "consul:8500"}, loopbackOnly, "give -advertise"},
		{"an interface listing that fails", []string{"-listen", ":8080", "-consul", "consul:8500"}, func() ([]net.Addr, error) { return nil, errors.New("boom") }, "boom"},
		{"a negative drain", []string{"-drain", "-1s"}, nil, "negative"},
		{"a negative idle drain", []string{"-drain-idle", "-1s"}, nil, "negative"},
		{"a drain bound below the drain", []string{"-drain", "5s", "-drain-max", "2s"}, nil, "-drain-max 2s is shorter than -drain 5s"},
		{"a zero check interval", []string{"-listen", ":8080", "-consul", "consul:8500", "-check-interval", "0"}, containerAddrs, "must be positive"},
		{"an empty service", []string{"-listen", ":8080", "-consul", "consul:8500", "-service", ""}, containerAddrs, "-service is empty"},
		{"a bad listen address", []string{"-listen", "9001"}, nil, "-listen"},
		{"a stray argument", []string{"web"}, nil, `unexpected argument "web"`},
		{"an unknown flag", []string{"-bogus"}, nil, "not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addrs := tt.addrs
			if addrs == nil {
				addrs = containerAddrs
			}
			_, err := parseFlags(tt.args, io.Discard, addrs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	if code := run(t.Context(), []string{"demo-backend", "-h"}, io.Discard, io.Discard); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
	if code := run(t.Context(), []string{"demo-backend", "-tags", "x"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("bad usage: exit %d, want 2", code)
	}
}
