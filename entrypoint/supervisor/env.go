package supervisor

import (
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// WithheldPrefixes name the variables HAProxy never gets: seamless's own
// and its clients' (the Consul token, the Docker endpoint and its TLS
// files). The master's environment is readable in /proc/PID/environ and
// passes to every process HAProxy starts (external checks, program
// sections).
var WithheldPrefixes = []string{"CONSUL_", "DOCKER_", "SEAMLESS_"}

// HAProxyEnv returns environ as HAProxy is given it, for the master and for
// `haproxy -c` alike: without the withheld variables and without HAProxy's
// own control variables (haproxy.CleanEnv). A configuration that needs one
// of these values takes it under another name.
func HAProxyEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range haproxy.CleanEnv(environ) {
		if !Withheld(kv) {
			out = append(out, kv)
		}
	}
	return out
}

// Withheld reports whether the variable (NAME or NAME=value) is kept from
// HAProxy.
func Withheld(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	for _, p := range WithheldPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
