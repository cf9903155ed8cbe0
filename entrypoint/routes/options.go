package routes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults of Options, for the configuration's `default` tags.
const (
	DefaultHTTPBind  = ":80"
	DefaultStatsBind = ":8404"
	DefaultHTTPSBind = ":443"
)

// Options configure the default configuration. The names in the comments
// are the environment variables they come from; New's errors name them.
type Options struct {
	// HTTPBind is where the HTTP frontend listens (SEAMLESS_HTTP_BIND):
	// host:port or a port; an empty host (":80") means every IPv4 address,
	// "[::]:80" every address. TCP frontends listen on the same host.
	HTTPBind string
	// HTTPSBind is where the HTTPS frontend listens (SEAMLESS_HTTPS_BIND),
	// in HTTPBind's forms; "" means no HTTPS frontend. It routes exactly
	// like the HTTP one, with the certificates of CrtList.
	HTTPSBind string
	// CrtList is the crt-list file of the HTTPS frontend (certs.Installer
	// writes it; its first line is the default certificate). Required
	// with HTTPSBind.
	CrtList string
	// ACMEMap, with HTTPSBind, is the HAProxy map of ACME HTTP-01 tokens
	// (token → key authorization, certs.Challenges keeps it) that the HTTP
	// frontend answers /.well-known/acme-challenge/ from; "" answers none.
	ACMEMap string
	// Hosts, with HTTPSBind, is called once HAProxy runs a rendering, with
	// the exact hosts its HTTP routes name (what ACME may order for).
	Hosts func([]string)
	// StatsBind is where the stats page (/haproxy?stats) and the
	// Prometheus exporter (/metrics) listen (SEAMLESS_STATS_BIND); ""
	// disables them.
	StatsBind string
	// StatusAddr is seamless's own status listener (SEAMLESS_STATUS_ADDR,
	// host:port, validated by config); its port is reserved like the
	// frontends'. "" reserves nothing.
	StatusAddr string
	// DebugAddr is seamless's profiling listener (SEAMLESS_DEBUG_ADDR),
	// reserved the same way. "" reserves nothing.
	DebugAddr string
	// Health filters the instances that become servers
	// (SEAMLESS_CONSUL_HEALTH, split by model.ParseHealth): "passing"
	// (also when empty), "passing,warning", "any", or any list of passing,
	// warning, critical and maintenance.
	Health []string
	// Slots is the least number of server slots per backend
	// (SEAMLESS_SERVER_SLOTS): membership then changes over the runtime
	// API; a backend that outgrows its slots gets twice as many with a
	// reload. 0 names servers after their instances, and every change
	// reloads.
	Slots int
	// NoHealthChecks declares servers without HAProxy's health checks
	// (SEAMLESS_HEALTH_CHECKS=false): health is then the source's alone,
	// and servers cost no file descriptor (fds.go). The zero value checks
	// every server.
	NoHealthChecks bool
	// PassiveChecks lets the checks watch real traffic too
	// (SEAMLESS_PASSIVE_CHECKS): a connection a server refuses or drops
	// takes it out of rotation until its checks pass. Without checks
	// nothing would bring it back, so it does nothing then (the config
	// package refuses the pair).
	PassiveChecks bool
	// DrainTimeout is how long a removed instance's slot drains before it
	// is freed (SEAMLESS_DRAIN_TIMEOUT).
	DrainTimeout time.Duration
	// StateFile, when set, is HAProxy's server-state-file: the runtime
	// state saved before a reload is loaded by the new worker.
	StateFile string
	// HostMapDir, when set, is where the exact hosts are written as a map
	// for HAProxy to look up, once there are many (hostmap.go); map files
	// of configurations HAProxy no longer runs are removed there.
	HostMapDir string
	hostMapMin int // 0: hostMapMin; tests set it lower
	// Table keeps slot assignments across renderers; nil: a new one.
	Table *SlotTable
	// Sources lists the sources by precedence (SEAMLESS_SOURCES): a route
	// conflict between services of two sources goes to the earlier one.
	Sources []string
	// Refusals counts what is left out; nil: not counted.
	Refusals *Refusals
	// Now is the clock of drains; nil: time.Now.
	Now func() time.Time
}

// DefaultOptions returns the options with their defaults.
func DefaultOptions() Options {
	return Options{HTTPBind: DefaultHTTPBind, StatsBind: DefaultStatsBind}
}

// bind is a validated listening address.
type bind struct {
	host string // "" (every IPv4 address) or an IP address
	port int
	// tls is set on the HTTP frontend's bind only: the HTTPS frontend
	// that routes like it, nil without one (see https.go).
	tls *httpsFrontend
}

// String is the address as a bind line takes it.
func (b bind) String() string {
	return b.hostPort(b.port)
}

func (b bind) hostPort(port int) string {
	p := strconv.Itoa(port)
	if strings.Contains(b.host, ":") {
		return "[" + b.host + "]:" + p
	}
	return b.host + ":" + p
}

// parseBind reads host:port, [ipv6]:port, :port, *:port or a bare port.
// The host must be an IP address: a name would be resolved only when
// HAProxy starts, and fail there.
func parseBind(v string) (bind, error) {
	hostStr, portStr := "", v
	if strings.ContainsAny(v, ":[]") {
		var err error
		if hostStr, portStr, err = net.SplitHostPort(v); err != nil {
			return bind{}, fmt.Errorf("%q is not host:port or a port", v)
		}
	}
	port, err := ParsePort(portStr)
	if err != nil {
		return bind{}, fmt.Errorf("%q: %v", v, err)
	}
	b := bind{port: port}
	if hostStr != "" && hostStr != "*" {
		ip, err := netip.ParseAddr(hostStr)
		if err != nil || ip.Zone() != "" {
			return bind{}, fmt.Errorf("%q: the host must be an IP address, or empty for every IPv4 address", v)
		}
		b.host = ip.Unmap().String()
	}
	return b, nil
}

var healthStates = []string{"passing", "warning", "critical", "maintenance", "any"}

// validate checks the options and returns the binds (stats has port 0 when
// disabled).
func (o Options) validate() (httpB, statsB bind, err error) {
	var errs []error
	if o.HTTPBind == "" {
		errs = append(errs, errors.New("SEAMLESS_HTTP_BIND is empty: the HTTP frontend needs an address such as :80"))
	} else if httpB, err = parseBind(o.HTTPBind); err != nil {
		errs = append(errs, fmt.Errorf("SEAMLESS_HTTP_BIND: %w", err))
	}
	if o.StatsBind != "" {
		if statsB, err = parseBind(o.StatsBind); err != nil {
			errs = append(errs, fmt.Errorf("SEAMLESS_STATS_BIND: %w", err))
		} else if statsB.port == httpB.port {
			errs = append(errs, fmt.Errorf("SEAMLESS_STATS_BIND: port %d is SEAMLESS_HTTP_BIND's too", statsB.port))
		}
	}
	if o.HTTPSBind != "" {
		httpB.tls, err = o.httpsFrontend(httpB.port, statsB.port)
		errs = append(errs, err)
	}
	for _, h := range o.Health {
		if !slices.Contains(healthStates, h) {
			errs = append(errs, fmt.Errorf("SEAMLESS_CONSUL_HEALTH: %q is not one of %s", h, strings.Join(healthStates, ", ")))
		}
	}
	return httpB, statsB, errors.Join(errs...)
}
