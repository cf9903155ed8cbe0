package routes

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// HAProxy 2.6 asks at start for a file descriptor per server with a
// health check (a disabled slot's too), one per listener, and a fixed
// share besides; it raises its soft limit up to the hard one, and exits
// when that is too low ("Cannot raise FD limit to N, limit is M"). HAProxy
// 2.6.12 asked 217 for one bind and no check, 1,817 with 1,600 servers
// with checks, 227 with ten more binds; 217 still for 1,600 servers
// without checks (3.0.11 and 3.2.26 alike). The built-in configuration
// checks every server (default-server … check) unless
// SEAMLESS_HEALTH_CHECKS=false.
const (
	fdsFixed = 216
	// fdsSpare covers what HAProxy opens beside the configuration (the
	// master CLI, the runtime API's socket), so the estimate errs high.
	fdsSpare = 8
)

// fdLimit is the hard RLIMIT_NOFILE that HAProxy, a child of this
// process, inherits; a variable for tests.
var fdLimit = func() (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return lim.Max, nil
}

// FDError is a rendering HAProxy could not start with: it needs more file
// descriptors than the limit allows.
type FDError struct {
	Need, Limit     uint64
	Servers, Binds  int // Servers: those with a health check
	Slots, Backends int // Slots is SEAMLESS_SERVER_SLOTS; 0 without slots
}

func (e *FDError) Error() string {
	fix := "raise the limit (ulimit -n, docker run --ulimit nofile=N:N)"
	if e.Slots > 0 {
		fix = fmt.Sprintf("lower SEAMLESS_SERVER_SLOTS (now %d: %d servers for %d backends) or %s", e.Slots, e.Servers, e.Backends, fix)
	}
	if e.Servers > 0 {
		// Without checks a server costs no descriptor at all.
		fix = "set SEAMLESS_HEALTH_CHECKS=false (health from the source alone; servers then need none), " + fix
	}
	return fmt.Sprintf("HAProxy would need %d file descriptors (%d for servers with a health check, %d for listeners, %d for HAProxy itself), "+
		"more than the open-files limit of %d (RLIMIT_NOFILE, hard) it would run with: %s",
		e.Need, e.Servers, e.Binds, fdsFixed+fdsSpare, e.Limit, fix)
}

// fitFDs refuses a view whose servers and listeners HAProxy could not
// open within the file-descriptor limit.
func (r *Renderer) fitFDs(v view) error {
	limit, err := fdLimit()
	if err != nil || limit == unix.RLIM_INFINITY {
		return nil // unknown or none: HAProxy decides
	}
	e := FDError{Limit: limit, Binds: 1 + len(v.Listeners), Slots: r.slots, Backends: len(v.Backends)}
	if v.StatsBind != "" {
		e.Binds++
	}
	if v.HTTPS.Bind != "" {
		e.Binds++
	}
	for _, b := range v.Backends {
		if v.Checks {
			e.Servers += len(b.Servers)
		}
	}
	e.Need = uint64(e.Servers+e.Binds) + fdsFixed + fdsSpare
	if e.Need > limit {
		return &e
	}
	return nil
}
