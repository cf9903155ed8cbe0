package haproxy

import (
	"context"
	"fmt"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/reaper"
)

// Runner runs a command to completion; reaper.Reaper.Output is the one used
// in the process, since nothing else may wait for children.
type Runner func(ctx context.Context, argv []string, env []string) ([]byte, reaper.Status, error)

// controlVars are the variables HAProxy sets for itself across re-executions
// of the master. Inherited by `haproxy -c` they would make it believe it is
// a re-executed master (client-native learnt this the hard way).
var controlVars = []string{
	"HAPROXY_MWORKER", "HAPROXY_STARTUPLOGS_FD", "HAPROXY_PROCESSES",
	"HAPROXY_CLI", "HAPROXY_MASTER_CLI", "HAPROXY_LOCALPEER", "HAPROXY_CFGFILES",
	"HAPROXY_SOCKETS", "HAPROXY_STARTUP_VERSION", "HAPROXY_BRANCH",
}

// CleanEnv returns env without HAProxy's own control variables.
func CleanEnv(env []string) []string {
	out := make([]string, 0, len(env))
next:
	for _, kv := range env {
		for _, p := range controlVars {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// ConfigError is a configuration that `haproxy -c` refused.
type ConfigError struct {
	// Alerts are HAProxy's [ALERT] lines; they name file and line.
	Alerts []string
	Output string
	Code   int
}

func (e *ConfigError) Error() string {
	if len(e.Alerts) == 0 {
		return fmt.Sprintf("haproxy -c exited with code %d: %s", e.Code, strings.TrimSpace(e.Output))
	}
	return "invalid configuration: " + strings.Join(e.Alerts, "; ")
}

// Validator runs `haproxy -c` on a command line.
type Validator struct {
	Bin  string
	Args []string // from CommandLine.CheckArgs
	Env  []string
	Run  Runner
}

// Check returns nil for a valid configuration (warnings allowed), a
// *ConfigError for an invalid one, or another error when haproxy could not
// be run at all.
func (v *Validator) Check(ctx context.Context) error {
	out, st, err := v.Run(ctx, append([]string{v.Bin}, v.Args...), CleanEnv(v.Env))
	if err != nil {
		return fmt.Errorf("haproxy -c: %w", err)
	}
	if st.ExitCode() == 0 {
		return nil
	}
	return &ConfigError{Alerts: Alerts(string(out)), Output: string(out), Code: st.ExitCode()}
}

// Alerts picks HAProxy's [ALERT] lines out of its output, without the
// "(pid) :" decoration.
func Alerts(out string) []string {
	var alerts []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "[ALERT]") {
			continue
		}
		l = strings.TrimSpace(l[strings.Index(l, "[ALERT]")+len("[ALERT]"):])
		if i := strings.Index(l, ") : "); strings.HasPrefix(l, "(") && i > 0 {
			l = l[i+len(") : "):]
		}
		alerts = append(alerts, l)
	}
	return alerts
}

// Version runs `haproxy -v` and returns the version, e.g. "2.6.12-1+deb12u4".
func Version(ctx context.Context, run Runner, bin string) (string, error) {
	out, st, err := run(ctx, []string{bin, "-v"}, CleanEnv(nil))
	if err != nil {
		return "", err
	}
	if st.ExitCode() != 0 {
		return "", fmt.Errorf("%s -v: %s", bin, st)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(first)
	for i, w := range f {
		if strings.EqualFold(w, "version") && i+1 < len(f) {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("%s -v: unexpected output %q", bin, first)
}
