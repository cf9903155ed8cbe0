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
	"path/filepath"
	"reflect"
	"sort"
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
	RunDir        string        `envconfig:"RUN_DIR" default:"/var/run/seamless" desc:"Directory for the master CLI socket and generated files; must be writable by the user seamless runs as."`
	StatusAddr    string        `envconfig:"STATUS_ADDR" default:":8405" desc:"Listen address of the HTTP status endpoint (/healthz, /metrics). Empty disables it."`
	LogFormat     string        `envconfig:"LOG_FORMAT" default:"text" desc:"Log format: text or json. In json, HAProxy's own output lines become records too (component=haproxy)."`
	LogLevel      string        `envconfig:"LOG_LEVEL" default:"info" desc:"Log level: debug, info, warn or error."`
	StopGrace     time.Duration `envconfig:"STOP_GRACE" default:"8s" desc:"On SIGTERM/SIGINT, how long in-flight requests may finish after HAProxy stops accepting before it is stopped hard. Keep it below the container runtime's stop timeout (Docker: 10s)."`
	ReloadTimeout time.Duration `envconfig:"RELOAD_TIMEOUT" default:"60s" desc:"How long a reload (validation, re-execution, new worker) may take before it is reported as not confirmed and counted as a failure. A reload HAProxy did not take yet (busy with an earlier one) is tried again instead."`
	HardStopAfter time.Duration `envconfig:"HARD_STOP_AFTER" default:"5m" desc:"Default for HAProxy's hard-stop-after when the configuration has none: old workers still serving long connections are stopped this long after a reload. 0 adds nothing."`
	MaxReloads    int           `envconfig:"MAX_RELOADS" default:"50" desc:"Default for HAProxy's mworker-max-reloads when the configuration has none: a worker that survived this many reloads is stopped. 0 adds nothing."`
}

// Load reads and validates the environment.
func Load() (*Config, error) {
	var c Config
	if err := envconfig.Process(Prefix, &c); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s=%q: not a valid %s: %v", pe.KeyName, pe.Value, pe.TypeName, pe.Err)
		}
		return nil, err
	}
	return &c, c.validate()
}

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
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("LOG_FORMAT", "%q is neither text nor json", c.LogFormat)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("LOG_LEVEL", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	if c.StopGrace <= 0 {
		bad("STOP_GRACE", "%s must be positive", c.StopGrace)
	}
	if c.ReloadTimeout <= 0 {
		bad("RELOAD_TIMEOUT", "%s must be positive", c.ReloadTimeout)
	}
	if c.HardStopAfter < 0 {
		bad("HARD_STOP_AFTER", "%s must not be negative", c.HardStopAfter)
	}
	if c.MaxReloads < 0 {
		bad("MAX_RELOADS", "%d must not be negative", c.MaxReloads)
	}
	return errors.Join(errs...)
}

// Var describes one variable.
type Var struct {
	Name, Type, Default, Desc string
}

// Vars lists every variable, in declaration order.
func Vars() []Var {
	t := reflect.TypeOf(Config{})
	vars := make([]Var, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		vars = append(vars, Var{
			Name:    Prefix + "_" + f.Tag.Get("envconfig"),
			Type:    typeName(f.Type),
			Default: f.Tag.Get("default"),
			Desc:    f.Tag.Get("desc"),
		})
	}
	return vars
}

func typeName(t reflect.Type) string {
	if t == reflect.TypeOf(time.Duration(0)) {
		return "duration"
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
