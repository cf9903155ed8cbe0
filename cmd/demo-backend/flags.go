package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// config is the validated command line.
type config struct {
	Listen string
	Name   string
	// On SIGTERM the backend serves at least Drain, then until no request
	// came for DrainIdle, and never longer than DrainMax.
	Drain, DrainIdle, DrainMax time.Duration

	// Consul is nil unless the instance registers itself.
	Consul *consulConfig
}

// consulConfig is what the registration needs.
type consulConfig struct {
	API             *api.Config // the agent's address, token, TLS...
	Service         string
	ID              string
	Tags            []string
	Address         string // advertised host (an IP address)
	Port            int
	CheckInterval   time.Duration
	DeregisterAfter time.Duration
	Resync          time.Duration
}

var errHelp = errors.New("help requested")

// defaultDrain outlasts seamless's propagation of a removal with its
// defaults: SEAMLESS_WAIT's max (2 s), then haproxy -c and a reload, which
// took up to a second on a loaded 2-core machine. Past it, the backend
// still serves while requests come (a load balancer slower than that, or
// a deregistration that had to be retried), up to defaultDrainMax: within
// the 10 s that docker stop gives by default, with time to finish.
const (
	defaultDrain     = 5 * time.Second
	defaultDrainIdle = time.Second
	defaultDrainMax  = 8 * time.Second
)

// tagList is a repeatable flag whose values may also be comma lists.
type tagList []string

func (l *tagList) String() string { return strings.Join(*l, ",") }

func (l *tagList) Set(s string) error {
	for t := range strings.SplitSeq(s, ",") {
		if t = strings.TrimSpace(t); t != "" && !slices.Contains(*l, t) {
			*l = append(*l, t)
		}
	}
	return nil
}

// parseFlags reads the command line. interfaceAddrs lists the machine's
// addresses, to find the one to advertise (net.InterfaceAddrs; tests pass
// their own).
func parseFlags(args []string, stderr io.Writer, interfaceAddrs func() ([]net.Addr, error)) (config, error) {
	fs := flag.NewFlagSet("demo-backend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg             config
		tags            tagList
		consulAddr      string
		register        bool
		advertise       string
		c               consulConfig
		checkInterval   = time.Second
		deregisterAfter = time.Minute
		resync          = 10 * time.Second
	)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:9001", "listen address")
	fs.StringVar(&cfg.Name, "name", "", "name to answer with (default: the host name when -listen has no host, as in a container; else the listen address)")
	fs.StringVar(&consulAddr, "consul", "", "register in the Consul agent at this address (host:port or URL); Consul's own variables (CONSUL_HTTP_TOKEN, CONSUL_CACERT, ...) apply")
	fs.BoolVar(&register, "register", false, "register in the Consul agent named by CONSUL_HTTP_ADDR (default 127.0.0.1:8500)")
	fs.StringVar(&c.Service, "service", "web", "Consul service name")
	fs.Var(&tags, "tags", "Consul tag; repeat the flag or give a comma-separated list (seamless.http.host=example.com,seamless.http.path=/api)")
	fs.StringVar(&c.ID, "id", "", "Consul service ID (default: SERVICE-ADDRESS-PORT)")
	fs.StringVar(&advertise, "advertise", "", "address registered in Consul, host or host:port (default: the -listen host, else the first non-loopback IPv4 address of this machine, as a container's)")
	fs.DurationVar(&checkInterval, "check-interval", checkInterval, "interval of Consul's HTTP check on /healthz")
	fs.DurationVar(&deregisterAfter, "deregister-after", deregisterAfter, "Consul removes the registration after its check was critical this long (a killed instance); Consul's minimum is 1m")
	fs.DurationVar(&resync, "resync", resync, "how often to verify that the registration is still there (an agent restarted in -dev mode forgets it) and register again")
	fs.DurationVar(&cfg.Drain, "drain", defaultDrain, "on SIGTERM, keep serving at least this long (after deregistering from Consul) so that the load balancer applies the change first (default 5s with Consul, 0 without: no drain)")
	fs.DurationVar(&cfg.DrainIdle, "drain-idle", defaultDrainIdle, "after -drain, keep serving until no request (but /healthz) came for this long; 0: stop at -drain")
	fs.DurationVar(&cfg.DrainMax, "drain-max", defaultDrainMax, "never drain longer than this after SIGTERM (default 8s, or -drain if longer; keep it below the container's stop timeout: docker stop's is 10s)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, errHelp
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	listenHost, listenPort, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return cfg, fmt.Errorf("-listen %q: %w", cfg.Listen, err)
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Listen
		if listenHost == "" {
			if h, err := os.Hostname(); err == nil && h != "" {
				cfg.Name = h
			}
		}
	}
	if cfg.Drain < 0 || cfg.DrainIdle < 0 {
		return cfg, fmt.Errorf("-drain %s and -drain-idle %s must not be negative", cfg.Drain, cfg.DrainIdle)
	}
	set := map[string]bool{} // the flags given on the command line
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["drain-max"] {
		cfg.DrainMax = max(cfg.DrainMax, cfg.Drain) // a longer -drain alone is what was asked for
	}
	if cfg.DrainMax < cfg.Drain {
		return cfg, fmt.Errorf("-drain-max %s is shorter than -drain %s", cfg.DrainMax, cfg.Drain)
	}
	if consulAddr == "" && !register {
		if !set["drain"] {
			cfg.Drain = 0
		}
		for _, name := range []string{"service", "tags", "id", "advertise", "check-interval", "deregister-after", "resync"} {
			if set[name] {
				return cfg, fmt.Errorf("-%s needs -consul ADDR or -register", name)
			}
		}
		return cfg, nil
	}

	c.API = api.DefaultConfig() // reads CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...
	from := "CONSUL_HTTP_ADDR"
	if consulAddr != "" {
		from = "-consul"
	} else {
		consulAddr = c.API.Address
	}
	if err := setConsulAddr(c.API, from, consulAddr); err != nil {
		return cfg, err
	}
	if c.Service == "" {
		return cfg, errors.New("-service is empty")
	}
	c.Tags = tags
	if checkInterval <= 0 || deregisterAfter <= 0 || resync <= 0 {
		return cfg, errors.New("-check-interval, -deregister-after and -resync must be positive")
	}
	c.CheckInterval, c.DeregisterAfter, c.Resync = checkInterval, deregisterAfter, resync

	port, err := strconv.Atoi(listenPort)
	if err != nil || port < 1 || port > 65535 {
		return cfg, fmt.Errorf("-listen %q: registering needs a fixed port", cfg.Listen)
	}
	c.Port = port
	host := advertise
	if h, p, err := net.SplitHostPort(advertise); err == nil {
		host = h
		if c.Port, err = strconv.Atoi(p); err != nil || c.Port < 1 || c.Port > 65535 {
			return cfg, fmt.Errorf("-advertise %q: bad port", advertise)
		}
	}
	if host == "" {
		if ip, err := netip.ParseAddr(listenHost); err == nil && !ip.IsUnspecified() {
			host = ip.String()
		} else if host, err = detectAddr(interfaceAddrs); err != nil {
			return cfg, err
		}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.IsUnspecified() || ip.Zone() != "" {
		return cfg, fmt.Errorf("-advertise %q: not an IP address this instance can be reached at", advertise)
	}
	c.Address = ip.Unmap().String()
	if c.ID == "" {
		c.ID = c.Service + "-" + c.Address + "-" + strconv.Itoa(c.Port)
	}
	cfg.Consul = &c
	return cfg, nil
}

// setConsulAddr takes an agent address as Consul's CONSUL_HTTP_ADDR: host:port,
// or a URL whose scheme picks http or https. from names where it came from.
func setConsulAddr(c *api.Config, from, addr string) error {
	scheme, rest, found := strings.Cut(addr, "://")
	switch {
	case !found:
		c.Address = addr
	case scheme == "http" || scheme == "https":
		c.Scheme, c.Address = scheme, strings.TrimSuffix(rest, "/")
	default:
		return fmt.Errorf("%s %q: scheme must be http or https", from, addr)
	}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		return fmt.Errorf("%s %q: want host:port: %w", from, addr, err)
	}
	return nil
}

// detectAddr picks the address a container is reached at on its network:
// the first global unicast IPv4 address, else the first such IPv6 one.
func detectAddr(interfaceAddrs func() ([]net.Addr, error)) (string, error) {
	addrs, err := interfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("listing this machine's addresses for -advertise: %w", err)
	}
	var v6 string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || !ip.IsGlobalUnicast() {
			continue
		}
		if ip = ip.Unmap(); ip.Is4() {
			return ip.String(), nil
		}
		if v6 == "" {
			v6 = ip.String()
		}
	}
	if v6 != "" {
		return v6, nil
	}
	return "", errors.New("no address to advertise found (no non-loopback interface address): give -advertise")
}
