package haproxy

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Runtime changes servers of the current worker over the master CLI (the
// "@1" prefix) and reads their state back.
type Runtime struct {
	CLI *MasterCLI
}

// commandsPerConn bounds how many "@1 cmd;" a single CLI connection
// carries: the master forwards each prefixed command to the worker.
const commandsPerConn = 32

// runtimeErrors start the answers HAProxy gives to a refused command.
var runtimeErrors = []string{"No such", "Require", "Invalid", "Unknown command", "Permission denied",
	"Can't", "cannot", "Failed", "failed", "not allowed", "unsupported", "Unsupported"}

// Apply sends cmds (e.g. "set server web/s3 state ready") to the current
// worker, in order, and fails on the first answer that is an error. The
// caller checks the outcome with ServersState anyway: an answer is not a
// proof.
func (r Runtime) Apply(ctx context.Context, cmds []string) error {
	for len(cmds) > 0 {
		n := min(len(cmds), commandsPerConn)
		batch := cmds[:n]
		cmds = cmds[n:]
		var b strings.Builder
		for i, c := range batch {
			if strings.ContainsAny(c, ";\n") {
				return fmt.Errorf("runtime command %q: ';' and newlines are not allowed", c)
			}
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString("@1 " + c)
		}
		out, err := r.CLI.Do(ctx, b.String())
		if err != nil {
			return fmt.Errorf("runtime commands: %w", err)
		}
		for _, line := range strings.Split(out, "\n") {
			line = strings.TrimSpace(line)
			for _, e := range runtimeErrors {
				if strings.HasPrefix(line, e) {
					return fmt.Errorf("HAProxy refused a runtime command (%s): %s", strings.Join(batch, "; "), line)
				}
			}
		}
	}
	return nil
}

// ServerState is one server of `show servers state`.
type ServerState struct {
	Backend, Server string
	Address         string
	Port            int
	Weight          int // the current (user) weight
	Admin           int // srv_admin_state flags
	Op              int // srv_op_state: 0 stopped, 1 starting, 2 running, 3 stopping
}

// Admin state flags (HAProxy's SRV_ADMF_*).
const (
	adminMaintMask = 0x23 // forced, inherited, or resolution maintenance
	adminDrainMask = 0x18 // forced or inherited drain
)

// Mode is the server's administrative state as `set server ... state`
// names it: maint, drain or ready. A server disabled in the configuration
// and then set ready keeps a "configured in maintenance" flag that does not
// stop it.
func (s ServerState) Mode() string {
	switch {
	case s.Admin&adminMaintMask != 0:
		return "maint"
	case s.Admin&adminDrainMask != 0:
		return "drain"
	}
	return "ready"
}

// ServersState returns `show servers state` of the current worker, raw (to
// save as a server-state file) and parsed.
func (r Runtime) ServersState(ctx context.Context) (string, []ServerState, error) {
	out, err := r.CLI.Do(ctx, "@1 show servers state")
	if err != nil {
		return "", nil, fmt.Errorf("show servers state: %w", err)
	}
	states, err := ParseServersState(out)
	return out, states, err
}

// BackendServersState is ServersState for the named backends only, one
// `show servers state <backend>` each: what a runtime change touched,
// rather than every server of a configuration that may hold thousands.
func (r Runtime) BackendServersState(ctx context.Context, backends []string) ([]ServerState, error) {
	var all []ServerState
	for _, b := range backends {
		if b == "" || strings.ContainsAny(b, " \t;\n") {
			return nil, fmt.Errorf("show servers state: backend %q: not a backend name", b)
		}
		out, err := r.CLI.Do(ctx, "@1 show servers state "+b)
		if err != nil {
			return nil, fmt.Errorf("show servers state %s: %w", b, err)
		}
		states, err := ParseServersState(out)
		if err != nil {
			return nil, fmt.Errorf("backend %s: %w", b, err)
		}
		all = append(all, states...)
	}
	return all, nil
}

// ParseServersState reads the output of `show servers state` (format 1),
// by the column names of its header.
func ParseServersState(out string) ([]ServerState, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || strings.TrimSpace(lines[0]) != "1" {
		return nil, fmt.Errorf("show servers state: not format 1: %.80q", out)
	}
	col := map[string]int{}
	var states []ServerState
	for _, line := range lines[1:] {
		if h, ok := strings.CutPrefix(line, "# "); ok {
			for i, name := range strings.Fields(h) {
				col[name] = i
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		get := func(name string) (string, error) {
			i, ok := col[name]
			if !ok || i >= len(f) {
				return "", fmt.Errorf("show servers state: no column %s in %q", name, line)
			}
			return f[i], nil
		}
		num := func(name string) (int, error) {
			v, err := get(name)
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(v)
		}
		var s ServerState
		var errs [7]error
		s.Backend, errs[0] = get("be_name")
		s.Server, errs[1] = get("srv_name")
		s.Address, errs[2] = get("srv_addr")
		s.Port, errs[3] = num("srv_port")
		s.Weight, errs[4] = num("srv_uweight")
		s.Admin, errs[5] = num("srv_admin_state")
		s.Op, errs[6] = num("srv_op_state")
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		states = append(states, s)
	}
	return states, nil
}
