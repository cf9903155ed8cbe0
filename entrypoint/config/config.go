// Package config is seamless's whole configuration: environment variables
// with the SEAMLESS_ prefix, read and validated once at start. The reference
// printed by `seamless env` is generated from the struct tags, so it cannot
// drift from the code.
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Prefix of every variable.
const Prefix = "SEAMLESS"

// Config is read from the environment.
type Config struct {
	Config        string        `envconfig:"CONFIG" default:"/usr/local/etc/haproxy/haproxy.cfg" desc:"HAProxy configuration file, used when seamless is started without a haproxy command line (and by 'seamless check' without arguments)."`
	HAProxyBin    string        `envconfig:"HAPROXY_BIN" default:"haproxy" desc:"HAProxy executable (looked up in PATH)."`
	RunDir        string        `envconfig:"RUN_DIR" default:"/var/run/seamless" desc:"Directory for the master CLI socket (master.sock), the worker's (worker.sock) and generated files; must be writable by the user seamless runs as. HAProxy listens on socket paths of at most 97 bytes: a longer master.sock path stops seamless at start (unless haproxy -S names another), a longer worker.sock is left out."`
	StatusAddr    string        `envconfig:"STATUS_ADDR" default:":8405" desc:"Listen address of the HTTP status endpoint (/healthz, /metrics). Empty disables it."`
	DebugAddr     string        `envconfig:"DEBUG_ADDR" desc:"Listen address of Go's profiler (/debug/pprof/), for measuring seamless itself: CPU and heap profiles, goroutines. It shows internals (no secrets, but names and addresses of services): bind it to 127.0.0.1. Empty (the default) disables it."`
	LogFormat     string        `envconfig:"LOG_FORMAT" default:"text" desc:"Log format: text or json. In json, HAProxy's own output lines become records too (component=haproxy)."`
	LogLevel      string        `envconfig:"LOG_LEVEL" default:"info" desc:"Log level: debug, info, warn or error."`
	StopGrace     time.Duration `envconfig:"STOP_GRACE" min:"100ms" max:"1h" default:"8s" desc:"On SIGTERM/SIGINT, how long in-flight requests may finish after HAProxy stops accepting before it is stopped hard. Keep it below the container runtime's stop timeout (Docker: 10s)."`
	ReloadTimeout time.Duration `envconfig:"RELOAD_TIMEOUT" min:"1s" max:"1h" default:"60s" desc:"How long a reload (validation, re-execution, new worker) may take before it is reported as not confirmed and counted as a failure. A reload HAProxy did not take yet (busy with an earlier one) is tried again instead."`
	HardStopAfter time.Duration `envconfig:"HARD_STOP_AFTER" min:"1s" max:"596h" off:"0" default:"5m" desc:"Default for HAProxy's hard-stop-after when the configuration has none: old workers still serving long connections are stopped this long after a reload. 0 adds nothing. At most 596h: HAProxy's timers end at 2147483647 ms."`
	MaxReloads    int           `envconfig:"MAX_RELOADS" min:"0" max:"10000" default:"50" desc:"Default for HAProxy's mworker-max-reloads when the configuration has none: a worker that survived this many reloads is stopped. 0 adds nothing."`

	Sources          string        `envconfig:"SOURCES" desc:"Discovery sources, comma-separated, in order of precedence: consul, docker, file. Empty (and no SEAMLESS_TEMPLATE): no discovery, HAProxy runs the configuration file as given."`
	Template         string        `envconfig:"TEMPLATE" desc:"Go text/template file, consul-template compatible, rendered into HAProxy's configuration. Empty: the built-in template driven by seamless.* tags. Re-read on SIGHUP."`
	StateDir         string        `envconfig:"STATE_DIR" default:"/var/lib/seamless" desc:"Where discovery keeps the rendered configuration HAProxy runs (haproxy.cfg), the map of its exact hosts once they are many (hosts-*.map), and each source's last snapshot, so that a restart while a source is down starts from its last known data. Mount a volume to keep it across containers."`
	Wait             Wait          `envconfig:"WAIT" min:"0" max:"10m" default:"200ms:2s" desc:"min:max quiescence before applying a discovery change (consul-template's wait): apply once nothing changed for min, but never later than max after the first change. A single value means min:4×min; 0 applies every change at once."`
	DiscoveryTimeout time.Duration `envconfig:"DISCOVERY_TIMEOUT" min:"100ms" max:"10m" default:"10s" desc:"At start, how long to wait for every source's first answer before starting HAProxy with what is known (a source's saved snapshot, else nothing of it). Discovery goes on in the background."`
	HTTPBind         string        `envconfig:"HTTP_BIND" default:":80" desc:"Built-in template: the HTTP frontend's bind address (host:port or :port), routing by seamless.http.host and seamless.http.path tags."`
	StatsBind        string        `envconfig:"STATS_BIND" default:":8404" desc:"Built-in template: HAProxy's stats page (/haproxy?stats) and Prometheus exporter (/metrics). Empty disables it."`
	HTTPSBind        string        `envconfig:"HTTPS_BIND" default:":443" desc:"Built-in template: the HTTPS frontend's bind address, routing exactly like the HTTP one, with HTTP/2 (ALPN) and Mozilla's intermediate TLS settings. Certificates come from SEAMLESS_CERTS_DIR, picked by SNI; a self-signed default certificate (made at first start, kept in SEAMLESS_STATE_DIR) answers other names. Empty disables it."`
	CertsDir         string        `envconfig:"CERTS_DIR" desc:"Built-in template: directory of certificates for the HTTPS frontend, watched: NAME.pem (certificate, chain and key in one file) or NAME.crt with NAME.key. Each is checked (key, chain order, dates, DNS names) and installed over HAProxy's runtime API without a reload; a bad one is refused with a log line naming it. Empty: the default certificate only."`
	CertsRescan      time.Duration `envconfig:"CERTS_RESCAN" min:"1s" max:"24h" default:"30s" desc:"Period of a full re-read of SEAMLESS_CERTS_DIR, in case a change notification was missed."`
	CertsKV          string        `envconfig:"CERTS_KV" desc:"Built-in template: a Consul KV prefix of certificates for the HTTPS frontend, watched with a blocking query. PREFIX/NAME holds one PEM bundle (certificate, chain and key), checked like a file of SEAMLESS_CERTS_DIR and installed as NAME over the runtime API without a reload; a bad one is refused with a log line naming its key, and while Consul cannot be read the certificates in use stay. A NAME that SEAMLESS_CERTS_DIR also has is the directory's. Consul's own variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...) or the first agent of SEAMLESS_CONSUL_ADDRS configure the connection. Holds private keys: see the README on ACLs. Empty: none."`
	ACMEEmail        string        `envconfig:"ACME_EMAIL" desc:"Built-in template: enables ACME. Every exact host a route names (seamless.http.host) that no certificate of SEAMLESS_CERTS_DIR covers gets a certificate from SEAMLESS_ACME_CA, with the HTTP-01 challenge answered by HAProxy's HTTP frontend (port 80 must reach SEAMLESS_HTTP_BIND); renewed two thirds into its lifetime, installed without a reload, kept in SEAMLESS_STATE_DIR/acme. This address is the account's contact; setting it accepts the CA's terms of service."`
	ACMECA           string        `envconfig:"ACME_CA" default:"https://acme-v02.api.letsencrypt.org/directory" desc:"ACME directory URL: Let's Encrypt by default; its staging environment (https://acme-staging-v02.api.letsencrypt.org/directory) for trials, whose certificates browsers do not trust."`
	ACMECABundle     string        `envconfig:"ACME_CA_BUNDLE" desc:"PEM file of the roots that the ACME server's own HTTPS certificate is verified with (a private ACME server). Empty: the system's roots."`
	ACMEEABKeyID     string        `envconfig:"ACME_EAB_KID" desc:"External account binding key ID, for ACME CAs that require one (with SEAMLESS_ACME_EAB_HMAC)."`
	ACMEEABHMAC      string        `envconfig:"ACME_EAB_HMAC" desc:"External account binding HMAC key, base64url, as the CA gives it (with SEAMLESS_ACME_EAB_KID)."`
	ACMEKV           string        `envconfig:"ACME_KV" desc:"ACME with several replicas: a Consul KV prefix that holds ACME's account and certificates instead of SEAMLESS_STATE_DIR/acme, shared by every replica. Orders are placed under a Consul lock (PREFIX/lock), so one replica orders each host and each renewal; every replica installs what is stored (PREFIX/certs/) and answers every replica's HTTP-01 challenges (PREFIX/challenges/). Holds private keys: see the README on ACLs. Empty: files, one replica."`
	ServicesDir      string        `envconfig:"SERVICES_DIR" default:"/etc/seamless/services" desc:"Source 'file': directory of service files, one YAML or JSON file per service, watched for changes."`
	ServicesRescan   time.Duration `envconfig:"SERVICES_RESCAN" min:"1s" max:"24h" default:"30s" desc:"Source 'file': period of a full re-read of SEAMLESS_SERVICES_DIR, in case a change notification was missed."`
	ConsulHealth     string        `envconfig:"CONSUL_HEALTH" default:"passing" desc:"Instances that receive traffic, by health: passing, passing,warning, or any. Also the default filter of the template function 'service'."`
	ConsulTag        string        `envconfig:"CONSUL_TAG" desc:"Source 'consul': only instances carrying this tag are discovered. Empty: all. Consul's own variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT, ...) configure the connection."`
	ConsulDatacenter string        `envconfig:"CONSUL_DATACENTER" desc:"Source 'consul': the datacenter to read. Empty: the agent's own."`
	ServerSlots      int           `envconfig:"SERVER_SLOTS" min:"0" max:"4096" default:"8" desc:"Built-in template: least number of server slots per backend. Instances joining, leaving, changing address, weight or health are applied over HAProxy's runtime API without a reload while they fit; a backend that outgrows its slots gets twice as many with one reload. 0: every change reloads."`
	HealthChecks     bool          `envconfig:"HEALTH_CHECKS" default:"true" desc:"Built-in template: HAProxy health-checks every server (free slots too), beside the source's health. Each checked server costs HAProxy one file descriptor, all reserved at start: 10,000 backends of 16 slots need 160,000. false: no server is checked, health is the source's alone (Consul's checks, Docker's healthcheck), and servers cost no file descriptor."`
	PassiveChecks    bool          `envconfig:"PASSIVE_CHECKS" default:"false" desc:"Built-in template: HAProxy's checks also watch real traffic: a server that refuses or drops a connection leaves rotation at once and the request is retried on another, until two checks pass again. Replicas that crash or stop before the catalog says so then cost no request; a backend with a single instance pays for it: while it restarts, requests get 503 instead of being retried on it. Needs SEAMLESS_HEALTH_CHECKS."`
	DrainTimeout     time.Duration `envconfig:"DRAIN_TIMEOUT" min:"0" max:"1h" default:"10s" desc:"Built-in template: how long a removed instance keeps its in-flight requests (HAProxy drain state) before its slot is freed; the slot is freed by the next apply after that, or a quarter of the timeout (at most 5 s) later."`
	DockerNetwork    string        `envconfig:"DOCKER_NETWORK" desc:"Source 'docker': the network whose container address is used. Empty: a container's only network (one on several networks is left out, with a log line). DOCKER_HOST and the other Docker client variables configure the connection; only read calls are made."`
	DockerRescan     time.Duration `envconfig:"DOCKER_RESCAN" min:"1s" max:"24h" default:"30s" desc:"Source 'docker': period of a full re-list of the containers, in case an event was missed."`
	ConsulStale      bool          `envconfig:"CONSUL_STALE" default:"false" desc:"Source 'consul': allow stale reads from any Consul server instead of the leader; spreads the load of many load-balancer replicas."`
	ConsulWatches    int           `envconfig:"CONSUL_WATCHES" min:"3" max:"100000" default:"128" desc:"Source 'consul': most blocking queries (HTTP connections to the agent) one datacenter's catalog may hold: one per watched service plus two (with the built-in template and Consul alone, only services with a seamless.* tag are watched). A catalog with more services to watch is read with one query for the whole catalog at every change, logged as a warning. Keep it under the agent's http_max_conns_per_client (default 200), with room for the KV watches."`
	ConsulQueryWait  time.Duration `envconfig:"CONSUL_QUERY_WAIT" min:"1s" max:"10m" default:"5m" desc:"Source 'consul': how long a blocking query waits for a change before Consul answers it unchanged and it is sent again (Consul's wait; its default, and its limit of 10m). At rest, each watched service's query costs the agent one answer per wait. A frozen or cut-off agent is noticed within seconds all the same, by a probe of /v1/status/leader every 5s; where that probe is not answered (a proxy in front of Consul), only after this wait, Consul's jitter of up to a sixteenth of it, and 15s. Keep it below the idle timeout of any proxy between seamless and Consul."`
	ConsulMaxStale   time.Duration `envconfig:"CONSUL_MAX_STALE" min:"1s" max:"24h" off:"0" default:"10s" desc:"Source 'consul': an answer from a Consul server that last heard from its leader longer ago than this (X-Consul-LastContact), or knows no leader, is not used: the last good data keeps serving, the source is stale (/readyz degraded, seamless_source_stale) and the query is retried. Only stale reads (SEAMLESS_CONSUL_STALE) can be that far behind. Default: two Raft election timeouts of Consul's default timing. 0: no bound."`
	ConsulAddrs      string        `envconfig:"CONSUL_ADDRS" desc:"Source 'consul': several Consul agents, comma-separated host:port or http(s)://host:port, in order of preference (the local agent first). Requests go to the first that accepts a connection and move to the next when it cannot be reached; the first is probed every 5s and used again once it answers with a leader. Empty: the one agent of CONSUL_HTTP_ADDR, which, when also set, must name the first agent of this list."`
	ConsulServices   string        `envconfig:"CONSUL_SERVICES" desc:"Source 'consul' with SEAMLESS_TEMPLATE: the services the template reads, comma-separated names or shell patterns (web, api-*): only these are watched, and count against SEAMLESS_CONSUL_WATCHES. The template function 'service' refuses any other name (the render fails and the running configuration stays), so a forgotten service is an error, never an empty backend; 'services' and 'node' list the watched ones only. Empty: every service is watched."`

	// The removal guard (entrypoint/discovery/guard).
	RemovalGuard int           `envconfig:"REMOVAL_GUARD" min:"0" max:"100" default:"50" desc:"Percent of a source's instances that one snapshot may remove at once: a larger removal, of more than one instance, is held for SEAMLESS_REMOVAL_HOLD with the instances in their last known state (a Consul restarted empty), then applied if the source still reports them gone. Meanwhile a held instance whose service still has instances that SEAMLESS_CONSUL_HEALTH routes is passed on critical (drained: a scale-down), unless that filter routes critical ones. 100: held only when all go. 0 disables the guard, and the hold of SEAMLESS_CERTS_KV certificates after a Consul reset."`
	RemovalHold  time.Duration `envconfig:"REMOVAL_HOLD" min:"1s" max:"1h" default:"30s" desc:"How long a removal held by SEAMLESS_REMOVAL_GUARD waits for the source to confirm it; longer while the source is down. Also how long after Consul's index went backwards instances it had removed and lists again are withheld (old state of a restored server), and how long SEAMLESS_CERTS_KV certificates stay served after Consul's index went backwards or one answer emptied the prefix."`

	// SEAMLESS_TEMPLATE options (entrypoint/template).
	TemplateDelimiters string `envconfig:"TEMPLATE_DELIMITERS" desc:"SEAMLESS_TEMPLATE: the left and right action delimiters, separated by a space, e.g. '[[ ]]' (consul-template's left_delimiter and right_delimiter). Empty: {{ }}."`
	TemplateRawMeta    bool   `envconfig:"TEMPLATE_RAW_META" default:"false" desc:"SEAMLESS_TEMPLATE: pass meta values holding control characters (a multi-line certificate inserted with indent) to the template as they are. false: such a meta key is left out, with a log line; the instance stays."`
}

// Source names.
const (
	SourceConsul = "consul"
	SourceDocker = "docker"
	SourceFile   = "file"
)

// Discovery reports whether configurations are rendered from sources and a
// template rather than read from a file.
func (c *Config) Discovery() bool { return c.Sources != "" || c.Template != "" }

// SourceList returns the sources in order.
func (c *Config) SourceList() []string {
	var out []string
	for s := range strings.SplitSeq(c.Sources, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ConsulAgents is SEAMLESS_CONSUL_ADDRS as a list; nil when unset.
func (c *Config) ConsulAgents() []string {
	var out []string
	for a := range strings.SplitSeq(c.ConsulAddrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// ConsulServicePatterns is SEAMLESS_CONSUL_SERVICES as a list; nil when
// unset.
func (c *Config) ConsulServicePatterns() []string {
	var out []string
	for p := range strings.SplitSeq(c.ConsulServices, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Wait is consul-template's quiescence, "min:max" or "min" alone (max is
// then 4×min); "0" applies every change at once.
type Wait struct {
	Min, Max time.Duration
}

// Decode implements envconfig.Decoder.
func (w *Wait) Decode(s string) error {
	lo, hi, two := strings.Cut(s, ":")
	minD, err := time.ParseDuration(strings.TrimSpace(lo))
	if err != nil {
		return fmt.Errorf("min: %v", err)
	}
	maxD := 4 * minD
	if two {
		if maxD, err = time.ParseDuration(strings.TrimSpace(hi)); err != nil {
			return fmt.Errorf("max: %v", err)
		}
	}
	switch {
	case minD < 0 || maxD < 0:
		return errors.New("durations must not be negative")
	case maxD < minD:
		return errors.New("max is shorter than min")
	}
	*w = Wait{Min: minD, Max: maxD}
	return nil
}

func (w Wait) String() string { return w.Min.String() + ":" + w.Max.String() }

// Load reads and validates the environment.
func Load() (*Config, error) {
	var c Config
	if err := envconfig.Process(Prefix, &c); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			err = fmt.Errorf("%s=%q: not a valid %s: %v", pe.KeyName, pe.Value, pe.TypeName, pe.Err)
			for _, v := range Vars() {
				if v.Name == pe.KeyName && v.Max != "" {
					err = fmt.Errorf("%w (range %s)", err, v.Range())
				}
			}
			return nil, err
		}
		return nil, err
	}
	return &c, c.validate()
}

// kvPrefix is what SEAMLESS_CERTS_KV and SEAMLESS_ACME_KV must look like:
// it goes into Consul's KV paths as is.
var kvPrefix = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)

func (c *Config) validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s_%s: "+format, append([]any{Prefix, key}, args...)...))
	}
	if !filepath.IsAbs(c.RunDir) {
		bad("RUN_DIR", "%q is not an absolute path", c.RunDir)
	}
	if c.StatusAddr != "" {
		if _, _, err := net.SplitHostPort(c.StatusAddr); err != nil {
			bad("STATUS_ADDR", "%q is not host:port (%v)", c.StatusAddr, err)
		}
	}
	if c.DebugAddr != "" {
		if _, _, err := net.SplitHostPort(c.DebugAddr); err != nil {
			bad("DEBUG_ADDR", "%q is not host:port (%v)", c.DebugAddr, err)
		}
	}
	if c.PassiveChecks && !c.HealthChecks {
		bad("PASSIVE_CHECKS", "needs SEAMLESS_HEALTH_CHECKS=true: a server that its traffic took out of rotation comes back only when its checks pass")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("LOG_FORMAT", "%q is neither text nor json", c.LogFormat)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("LOG_LEVEL", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	errs = append(errs, c.checkRanges()...)
	// Set but listing nothing is a mistake, not "discovery without sources".
	if c.Sources != "" && slices.ContainsFunc(strings.Split(c.Sources, ","), func(s string) bool { return strings.TrimSpace(s) == "" }) {
		bad("SOURCES", "%q has an empty entry; list sources by name, e.g. consul,file", c.Sources)
	}
	seen := map[string]bool{}
	for _, src := range c.SourceList() {
		switch {
		case src != SourceConsul && src != SourceDocker && src != SourceFile:
			bad("SOURCES", "unknown source %q (known: consul, docker, file)", src)
		case seen[src]:
			bad("SOURCES", "source %q is listed twice", src)
		}
		seen[src] = true
	}
	if !filepath.IsAbs(c.StateDir) {
		bad("STATE_DIR", "%q is not an absolute path", c.StateDir)
	}
	if c.CertsDir != "" && !filepath.IsAbs(c.CertsDir) {
		bad("CERTS_DIR", "%q is not an absolute path", c.CertsDir)
	}
	if c.ACMECABundle != "" && !filepath.IsAbs(c.ACMECABundle) {
		bad("ACME_CA_BUNDLE", "%q is not an absolute path", c.ACMECABundle)
	}
	switch {
	case c.ACMEEmail == "":
	case c.HTTPSBind == "":
		bad("ACME_EMAIL", "ACME needs the HTTPS frontend: SEAMLESS_HTTPS_BIND is empty")
	case c.Template != "":
		bad("ACME_EMAIL", "ACME serves the built-in template's hosts: SEAMLESS_TEMPLATE is set")
	case !c.Discovery():
		bad("ACME_EMAIL", "ACME serves the hosts discovery routes: SEAMLESS_SOURCES is empty")
	}
	for key, p := range map[string]string{"CERTS_KV": c.CertsKV, "ACME_KV": c.ACMEKV} {
		if p != "" && !kvPrefix.MatchString(p) {
			bad(key, "%q is not a Consul KV prefix: segments of letters, digits, '.', '_' or '-' joined by '/', with no leading or trailing '/'", p)
		}
	}
	switch a, b := c.CertsKV+"/", c.ACMEKV+"/"; {
	case c.ACMEKV != "" && c.ACMEEmail == "":
		bad("ACME_KV", "set without SEAMLESS_ACME_EMAIL, which enables ACME")
	case c.CertsKV != "" && c.ACMEKV != "" && (strings.HasPrefix(a, b) || strings.HasPrefix(b, a)):
		bad("ACME_KV", "%q and SEAMLESS_CERTS_KV %q overlap: ACME's keys are not certificate bundles; use two separate prefixes", c.ACMEKV, c.CertsKV)
	}
	if (c.ACMEEABKeyID == "") != (c.ACMEEABHMAC == "") {
		bad("ACME_EAB_KID", "set SEAMLESS_ACME_EAB_KID and SEAMLESS_ACME_EAB_HMAC together")
	}
	for _, st := range strings.Split(c.ConsulHealth, ",") {
		switch strings.TrimSpace(st) {
		case "passing", "warning", "critical", "maintenance", "any":
		default:
			bad("CONSUL_HEALTH", "%q: %q is not one of passing, warning, critical, maintenance, any", c.ConsulHealth, st)
		}
	}
	schemes := map[string]bool{}
	for _, a := range c.ConsulAgents() {
		scheme, hp, found := strings.Cut(a, "://")
		if !found {
			scheme, hp = "http", a
		}
		schemes[scheme] = true
		host, port, err := net.SplitHostPort(hp)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || host == "" || n < 1 || n > 65535 || (scheme != "http" && scheme != "https") {
			bad("CONSUL_ADDRS", "%q: agent %q is not host:port or http(s)://host:port", c.ConsulAddrs, a)
		}
	}
	if len(schemes) > 1 {
		bad("CONSUL_ADDRS", "%q mixes http and https; the agents share one TLS configuration", c.ConsulAddrs)
	}
	if c.ConsulAddrs != "" && slices.ContainsFunc(strings.Split(c.ConsulAddrs, ","), func(s string) bool { return strings.TrimSpace(s) == "" }) {
		bad("CONSUL_ADDRS", "%q has an empty entry; list agents as host:port, e.g. 127.0.0.1:8500,consul-b:8500", c.ConsulAddrs)
	}
	for _, p := range c.ConsulServicePatterns() {
		if _, err := path.Match(p, ""); err != nil {
			bad("CONSUL_SERVICES", "%q: %q is not a shell pattern: %v", c.ConsulServices, p, err)
		}
	}
	if c.ConsulServices != "" && slices.ContainsFunc(strings.Split(c.ConsulServices, ","), func(s string) bool { return strings.TrimSpace(s) == "" }) {
		bad("CONSUL_SERVICES", "%q has an empty entry; list services by name or pattern, e.g. web,api-*", c.ConsulServices)
	}
	if c.ConsulServices != "" && c.Template == "" {
		bad("CONSUL_SERVICES", "is for a template of your own (SEAMLESS_TEMPLATE); the built-in template watches the services with seamless.* tags on its own")
	}
	if _, _, err := c.Delims(); err != nil {
		bad("TEMPLATE_DELIMITERS", "%q: %v", c.TemplateDelimiters, err)
	}
	return errors.Join(errs...)
}

// Delims returns SEAMLESS_TEMPLATE_DELIMITERS as the left and right
// delimiters, "" and "" (Go's {{ }}) when unset.
func (c *Config) Delims() (left, right string, err error) {
	f := strings.Fields(c.TemplateDelimiters)
	switch {
	case len(f) == 0:
		return "", "", nil
	case len(f) != 2:
		return "", "", errors.New("want two delimiters separated by a space, e.g. \"[[ ]]\"")
	case f[0] == f[1]:
		return "", "", errors.New("the left and right delimiters must differ")
	}
	return f[0], f[1], nil
}

// Var describes one variable. Numbers and durations have a range: Min to
// Max, or exactly Off (which turns the feature off).
type Var struct {
	Name, Type, Default, Desc string
	Min, Max, Off             string
}

// Range is the documented range, "1s–1h" or "1s–596h, or 0"; "" without.
func (v Var) Range() string {
	if v.Max == "" {
		return ""
	}
	r := v.Min + "–" + v.Max
	if v.Off != "" {
		r += ", or " + v.Off
	}
	return r
}

// checkRanges checks every field that has a range (min and max tags; off,
// a value allowed besides). A field of a numeric type without one is a
// bug, reported as an error so that no variable goes unbounded.
func (c *Config) checkRanges() []error {
	var errs []error
	t, val := reflect.TypeOf(*c), reflect.ValueOf(*c)
	for i := range t.NumField() {
		f := t.Field(i)
		name := Prefix + "_" + f.Tag.Get("envconfig")
		lo, hi, off := f.Tag.Get("min"), f.Tag.Get("max"), f.Tag.Get("off")
		var values []int64
		switch x := val.Field(i).Interface().(type) {
		case time.Duration:
			values = []int64{int64(x)}
		case Wait:
			values = []int64{int64(x.Min), int64(x.Max)}
		case int:
			values = []int64{int64(x)}
		default:
			continue
		}
		parse := func(s string) (int64, error) {
			if f.Type.Kind() == reflect.Int {
				n, err := strconv.Atoi(s)
				return int64(n), err
			}
			d, err := time.ParseDuration(s)
			return int64(d), err
		}
		minV, err1 := parse(lo)
		maxV, err2 := parse(hi)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("%s: internal error: no valid range (min %q, max %q)", name, lo, hi))
			continue
		}
		v := Var{Min: lo, Max: hi, Off: off}
		for _, x := range values {
			if off != "" {
				if o, err := parse(off); err == nil && x == o {
					continue
				}
			}
			if x < minV || x > maxV {
				errs = append(errs, fmt.Errorf("%s=%v is outside %s", name, val.Field(i).Interface(), v.Range()))
				break
			}
		}
	}
	return errs
}

// Vars lists every variable, in declaration order.
func Vars() []Var {
	t := reflect.TypeOf(Config{})
	vars := make([]Var, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		v := Var{
			Name:    Prefix + "_" + f.Tag.Get("envconfig"),
			Type:    typeName(f.Type),
			Default: f.Tag.Get("default"),
			Desc:    f.Tag.Get("desc"),
			Min:     f.Tag.Get("min"),
			Max:     f.Tag.Get("max"),
			Off:     f.Tag.Get("off"),
		}
		if r := v.Range(); r != "" {
			v.Desc += " Range: " + r + "."
		}
		vars = append(vars, v)
	}
	return vars
}

func typeName(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return "duration"
	case reflect.TypeOf(Wait{}):
		return "min:max"
	}
	return t.Kind().String()
}

// Usage writes the reference of every variable.
func Usage(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tTYPE\tDEFAULT\tMEANING")
	for _, v := range Vars() {
		def := v.Default
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, v.Type, def, v.Desc)
	}
	return tw.Flush()
}

// Unknown returns SEAMLESS_ variables in environ that no field reads:
// usually a typo that would otherwise be silently ignored.
func Unknown(environ []string) []string {
	known := map[string]bool{}
	for _, v := range Vars() {
		known[v.Name] = true
	}
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, Prefix+"_") && !known[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
