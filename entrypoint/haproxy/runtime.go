package haproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Runtime changes servers of the current worker and reads their state
// back: over the worker's own stats socket when it reaches the current
// worker, else over the master CLI (the "@1" prefix).
type Runtime struct {
	CLI *MasterCLI
	// Worker, when set, is the worker's stats socket (Defaults.WorkerSocket).
	// The master forwards each "@1" command to the worker on a connection
	// of its own: while the worker health-checked 10,000 servers, 6 `set
	// server` commands took 16 ms at p50 through the master and 0.5 ms
	// on the worker's socket.
	Worker *WorkerSocket
	// Connected, when set, learns which way each connection that carried
	// commands went (ViaWorker or ViaMaster): a worker socket that is
	// declared but never used costs a dial and a `show proc` every time.
	Connected func(via string)
	// Generation, when set, is reload.Reloader.Generation: while it stays
	// even and the same, the worker socket trusts the worker it last found
	// current (its `show info` Pid still checked), rather than asking the
	// master's `show proc` on a connection of its own before every change
	// (at 100 services × 10, one of the two connections a change made). A
	// reload typed on the master CLI by hand does not move it: until the
	// new worker holds the socket, changes would reach the old one.
	Generation func() uint64
}

// The ways a runtime connection can go.
const (
	ViaWorker = "worker" // the worker's own stats socket
	ViaMaster = "master" // the master CLI, "@1"
)

// WorkerSocket is a stats socket that each worker binds at the same path,
// the newest taking it over. A new worker that took it may not be the one
// the master keeps (a reload that failed or is still loading), so every
// connection starts with `show info`, and its answers count only when
// that names the master's current worker.
type WorkerSocket struct {
	cli *MasterCLI

	mu    sync.Mutex
	known bool   // pid was the master's current worker at generation gen
	pid   int    //
	gen   uint64 //
}

// NewWorkerSocket returns the worker socket at path.
func NewWorkerSocket(path string) *WorkerSocket {
	return &WorkerSocket{cli: &MasterCLI{Network: "unix", Addr: path}}
}

// do sends cmds to the master's current worker over the socket. It
// reports false when they must go through the master instead: the socket
// is gone or refuses (then nothing was sent), or it reached another
// process (errElsewhere: the commands are idempotent, but that process
// took them).
// gen, when not nil, is Runtime.Generation.
func (w *WorkerSocket) do(ctx context.Context, master *MasterCLI, gen func() uint64, cmds []string) (string, bool, error) {
	g, steady := uint64(0), false
	if gen != nil {
		g = gen()
		steady = g%2 == 0
	}
	pid, known := w.current(steady, g)
	if !known {
		procs, err := master.ShowProc(ctx)
		if err != nil || len(procs.Workers) != 1 {
			return "", false, nil
		}
		pid = procs.Workers[0].Pid
	}
	out, err := w.cli.Do(ctx, "show info; "+strings.Join(cmds, "; "))
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT):
		w.forget()
		return "", false, nil
	case err != nil:
		w.forget()
		return "", true, err
	}
	// Each answer ends with an empty line; show info has none inside.
	info, rest, ok := strings.Cut(out, "\n\n")
	if !ok || infoPid(info) != pid {
		w.forget()
		return "", false, errElsewhere
	}
	if steady && gen() == g {
		w.remember(pid, g)
	}
	return rest, true, nil
}

// current is the worker last found current, if the generation g (steady:
// no reload in flight) is the one it was found at.
func (w *WorkerSocket) current(steady bool, g uint64) (int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pid, steady && w.known && w.gen == g
}

func (w *WorkerSocket) remember(pid int, g uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.known, w.pid, w.gen = true, pid, g
}

func (w *WorkerSocket) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.known = false
}

// infoPid is the Pid of `show info`, or 0.
func infoPid(out string) int {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Pid: "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// do sends cmds in one connection to the current worker.
func (r Runtime) do(ctx context.Context, cmds []string) (string, error) {
	var elsewhere bool
	if r.Worker != nil {
		out, used, err := r.Worker.do(ctx, r.CLI, r.Generation, cmds)
		if used {
			r.connected(ViaWorker)
			return out, err
		}
		elsewhere = errors.Is(err, errElsewhere)
	}
	r.connected(ViaMaster)
	prefixed := make([]string, len(cmds))
	for i, c := range cmds {
		prefixed[i] = "@1 " + c
	}
	out, err := r.CLI.Do(ctx, strings.Join(prefixed, "; "))
	if err != nil && elsewhere {
		err = fmt.Errorf("%w, after %w", err, errElsewhere)
	}
	return out, err
}

// errElsewhere: the commands reached a process that was not the master's
// current worker (one still loading may become it).
var errElsewhere = errors.New("the commands reached a process that was not the current worker")

func (r Runtime) connected(via string) {
	if r.Connected != nil {
		r.Connected(via)
	}
}

// commandsPerConn bounds how many commands a single CLI connection
// carries.
const commandsPerConn = 32

// runtimeErrors start the answers HAProxy gives to a refused command.
var runtimeErrors = []string{"No such", "Require", "Invalid", "Unknown command", "Permission denied",
	"Can't", "cannot", "Failed", "failed", "not allowed", "unsupported", "Unsupported"}

// ErrNotApplied means that no command reached HAProxy: what it runs is
// as before.
var ErrNotApplied = errors.New("no runtime command reached HAProxy")

// notApplied marks err, the failure of the first connection to carry
// commands, as ErrNotApplied when that connection was never made.
func notApplied(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" && !errors.Is(err, errElsewhere) {
		return fmt.Errorf("%w: %w", ErrNotApplied, err)
	}
	return err
}

// Apply sends cmds (e.g. "set server web/s3 state ready") to the current
// worker, in order, and fails on the first answer that is an error. The
// caller checks the outcome with ServersState anyway: an answer is not a
// proof. A failure before any command was sent is ErrNotApplied.
func (r Runtime) Apply(ctx context.Context, cmds []string) error {
	if err := commandsFit(cmds); err != nil {
		return fmt.Errorf("%w: %w", ErrNotApplied, err)
	}
	first := true
	for batch := range slices.Chunk(cmds, commandsPerConn) {
		out, err := r.do(ctx, batch)
		if err != nil && first {
			err = notApplied(err)
		}
		first = false
		if err != nil {
			return fmt.Errorf("runtime commands: %w", err)
		}
		if err := refused(batch, out); err != nil {
			return err
		}
	}
	return nil
}

// ApplyAndRead is Apply, then BackendServersState of backends: in one
// connection when they fit in one, since each connection to the worker
// costs a `show proc` on the master and a `show info` on the worker.
func (r Runtime) ApplyAndRead(ctx context.Context, cmds, backends []string) ([]ServerState, error) {
	if len(cmds)+len(backends) > commandsPerConn || len(cmds) == 0 {
		if err := r.Apply(ctx, cmds); err != nil {
			return nil, err
		}
		return r.BackendServersState(ctx, backends)
	}
	reads, err := stateCommands(backends)
	if err != nil {
		return nil, err
	}
	if err := commandsFit(cmds); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotApplied, err)
	}
	out, err := r.do(ctx, append(slices.Clip(cmds), reads...))
	if err != nil {
		return nil, fmt.Errorf("runtime commands: %w", notApplied(err))
	}
	answers := splitAnswers(out)
	if len(answers) != len(cmds)+len(reads) {
		return nil, fmt.Errorf("runtime commands and show servers state %s: %d answers, want %d: %.200q",
			strings.Join(backends, " "), len(answers), len(cmds)+len(reads), out)
	}
	if err := refused(cmds, strings.Join(answers[:len(cmds)], "\n")); err != nil {
		return nil, err
	}
	return parseStates(backends, answers[len(cmds):])
}

// commandsFit fails on a command that would run as two, or cut the line.
func commandsFit(cmds []string) error {
	for _, c := range cmds {
		if strings.ContainsAny(c, ";\n") {
			return fmt.Errorf("runtime command %q: ';' and newlines are not allowed", c)
		}
	}
	return nil
}

// refused fails when an answer in out (to cmds) is an error.
func refused(cmds []string, out string) error {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		for _, e := range runtimeErrors {
			if strings.HasPrefix(line, e) {
				return fmt.Errorf("HAProxy refused a runtime command (%s): %s", strings.Join(cmds, "; "), line)
			}
		}
	}
	return nil
}

// splitAnswers cuts the output of several commands into their answers:
// each ends with an empty line, and has none inside (`show servers state`,
// `set server`: an answer with nothing to say is the empty line alone).
func splitAnswers(out string) []string {
	var answers []string
	for out != "" {
		if rest, ok := strings.CutPrefix(out, "\n"); ok {
			answers, out = append(answers, ""), rest
			continue
		}
		answer, rest, _ := strings.Cut(out, "\n\n")
		answers, out = append(answers, answer+"\n"), rest
	}
	return answers
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
	out, err := r.do(ctx, []string{"show servers state"})
	if err != nil {
		return "", nil, fmt.Errorf("show servers state: %w", err)
	}
	states, err := ParseServersState(out)
	return out, states, err
}

// BackendServersState is ServersState for the named backends only, one
// `show servers state <backend>` each: what a runtime change touched,
// rather than every server of a configuration that may hold thousands.
// They go in one connection per commandsPerConn backends.
func (r Runtime) BackendServersState(ctx context.Context, backends []string) ([]ServerState, error) {
	var all []ServerState
	for batch := range slices.Chunk(backends, commandsPerConn) {
		cmds, err := stateCommands(batch)
		if err != nil {
			return nil, err
		}
		out, err := r.do(ctx, cmds)
		if err != nil {
			return nil, fmt.Errorf("show servers state %s: %w", strings.Join(batch, " "), err)
		}
		answers := splitAnswers(out)
		if len(answers) != len(batch) {
			return nil, fmt.Errorf("show servers state %s: %d answers, want %d: %.200q", strings.Join(batch, " "), len(answers), len(batch), out)
		}
		states, err := parseStates(batch, answers)
		if err != nil {
			return nil, err
		}
		all = append(all, states...)
	}
	return all, nil
}

// stateCommands are the `show servers state` of backends.
func stateCommands(backends []string) ([]string, error) {
	cmds := make([]string, len(backends))
	for i, b := range backends {
		if b == "" || strings.ContainsAny(b, " \t;\n") {
			return nil, fmt.Errorf("show servers state: backend %q: not a backend name", b)
		}
		cmds[i] = "show servers state " + b
	}
	return cmds, nil
}

// parseStates parses the answers to stateCommands(backends).
func parseStates(backends, answers []string) ([]ServerState, error) {
	var all []ServerState
	for i, b := range backends {
		states, err := ParseServersState(answers[i])
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
