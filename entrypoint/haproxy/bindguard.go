package haproxy

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// BindGuard finds, before a reload, the listening addresses that the new
// worker would fail to bind. HAProxy's -c never binds; at a reload, a bind
// that fails makes the new worker pause the running listeners while it
// retries, and new connections fail for seconds before it gives up.
//
// It probes, as seamless's own user, only the addresses the candidate
// adds: those the running configuration binds are HAProxy's already (the
// master binds as the user seamless runs as, before dropping privileges).
// The probe binds (without listening) with SO_REUSEADDR and SO_REUSEPORT
// as HAProxy does, so that an address HAProxy could share is not refused.
type BindGuard struct {
	getenv func(string) (string, bool)

	mu      sync.Mutex
	running map[string]bool // network + address
	ports   map[uint16]bool // ports of running, on any address
	checked []Bind          // the last candidate that passed
	passed  bool            // checked is set and not yet loaded
}

// NewBindGuard returns a guard whose running configuration is files
// (what HAProxy starts with). env is HAProxy's environment.
func NewBindGuard(files []string, env []string) *BindGuard {
	g := &BindGuard{getenv: lookup(env)}
	binds, _ := g.parse(files)
	g.setRunning(binds)
	return g
}

func lookup(env []string) func(string) (string, bool) {
	m := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func (g *BindGuard) parse(paths []string) ([]Bind, error) {
	files, err := ExpandConfigFiles(paths)
	if err != nil {
		return nil, err
	}
	return ParseBinds(files.Files, g.getenv)
}

func key(b Bind) string { return b.Network + " " + b.Addr.String() }

func (g *BindGuard) setRunning(binds []Bind) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running, g.ports = map[string]bool{}, map[uint16]bool{}
	g.add(binds)
}

// add replaces the maps rather than writing to them: Check reads the maps
// it took under the lock after releasing it (copy on write).
func (g *BindGuard) add(binds []Bind) {
	running, ports := maps.Clone(g.running), maps.Clone(g.ports)
	for _, b := range binds {
		running[key(b)] = true
		ports[b.Addr.Port()] = true
	}
	g.running, g.ports = running, ports
}

// BindError is a listening address of a candidate configuration that
// cannot be bound.
type BindError struct {
	Bind Bind
	Err  error
}

func (e *BindError) Error() string {
	return fmt.Sprintf("%s: cannot bind %s (%v): HAProxy would fail to start the new worker, pausing the running listeners meanwhile; the reload is not sent",
		e.Bind.Where(), e.Bind, e.Err)
}

// Check probes every address that files bind and the running
// configuration does not, and returns a *BindError for the first that
// cannot be bound. Addresses in .if blocks are not probed.
func (g *BindGuard) Check(files []string) error {
	g.mu.Lock()
	running, ports := g.running, g.ports
	g.passed = false
	g.mu.Unlock()
	binds, err := g.parse(files)
	if err != nil {
		return nil // HAProxy reports what it cannot read
	}
	for _, b := range binds {
		if b.Conditional || running[key(b)] {
			continue
		}
		err := probe(b)
		// Only the errors HAProxy's bind would meet too; and when the
		// running HAProxy holds the port on another address, the new
		// worker may take it over (after pausing the old one), so the
		// verdict is HAProxy's.
		if refusing(err) && !ports[b.Addr.Port()] {
			return &BindError{Bind: b, Err: err}
		}
	}
	g.mu.Lock()
	g.checked, g.passed = binds, true
	g.mu.Unlock()
	return nil
}

// Vouch records files as the candidate that passed, without probing: a
// configuration that differs from what runs only in its servers binds
// what runs. Without it, Loaded after that candidate's reload would take
// the binds of an earlier candidate HAProxy refused as running.
// contents are the files' bytes, in order; nil when they could not be
// read, and then the reload leaves what counts as running as it was.
func (g *BindGuard) Vouch(files []string, contents [][]byte) {
	var binds []Bind
	passed := false
	if contents != nil {
		var err error
		binds, err = parseBindContents(files, contents, g.getenv)
		passed = err == nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.checked, g.passed = binds, passed
}

// Loaded records that HAProxy took the candidate that passed the last
// Check. certain is false when the reload was sent but not confirmed: the
// candidate's addresses may run or not, so both count as running.
func (g *BindGuard) Loaded(certain bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.passed {
		return
	}
	if certain {
		g.running, g.ports = map[string]bool{}, map[uint16]bool{}
	}
	g.add(g.checked)
	g.passed = false
}

// probe binds b the way HAProxy would, and closes it at once. It does not
// listen: a socket that joined another process's SO_REUSEPORT group
// could be handed connections, which closing it would reset.
func probe(b Bind) error {
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(b.Addr.Port()), Addr: b.Addr.Addr().As4()})
	if b.Addr.Addr().Is6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(b.Addr.Port()), Addr: b.Addr.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	opts := [][2]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR}, {unix.SOL_SOCKET, unix.SO_REUSEPORT}}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o[0], o[1], 1); err != nil {
			return err
		}
	}
	if family == unix.AF_INET6 {
		v6only := 0
		if b.Network == "tcp6" {
			v6only = 1
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			return err
		}
	}
	return unix.Bind(fd, sa)
}

func refusing(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EACCES)
}
