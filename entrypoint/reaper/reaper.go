// Package reaper is the one place in the process that waits for children.
//
// As PID 1 (or as a child subreaper) every orphan in the container becomes our
// child: HAProxy's old workers when the master dies, whatever `haproxy -c`
// leaves behind, grandchildren of anything we start. Exactly one goroutine
// calls wait4(-1); a child started through Start has its exit status handed
// to whoever started it, everything else is reaped and logged. Nothing else in
// the process may call Wait on a child (os/exec would race with wait4(-1) and
// lose statuses), which is why Start wraps syscall.ForkExec instead.
package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Status is how a child ended.
type Status struct {
	Pid  int
	Wait syscall.WaitStatus
}

// ExitCode follows tini: the child's exit code, or 128+signal if a signal
// killed it.
func (s Status) ExitCode() int {
	switch {
	case s.Wait.Exited():
		return s.Wait.ExitStatus()
	case s.Wait.Signaled():
		return 128 + int(s.Wait.Signal())
	default:
		return 1
	}
}

func (s Status) String() string {
	switch {
	case s.Wait.Exited():
		return fmt.Sprintf("exited with code %d", s.Wait.ExitStatus())
	case s.Wait.Signaled():
		return fmt.Sprintf("killed by signal %s", unix.SignalName(s.Wait.Signal()))
	default:
		return fmt.Sprintf("wait status %#x", uint32(s.Wait))
	}
}

// Child is a process started through Reaper.Start.
type Child struct {
	Pid  int
	r    *Reaper
	done chan struct{}
	st   Status
}

// Done is closed once the child has been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Status is valid after Done is closed.
func (c *Child) Status() Status { <-c.done; return c.st }

// Wait blocks until the child is reaped or ctx ends.
func (c *Child) Wait(ctx context.Context) (Status, error) {
	select {
	case <-c.done:
		return c.st, nil
	case <-ctx.Done():
		return Status{}, ctx.Err()
	}
}

// Signal sends sig to the child unless it has already been reaped (its pid
// could then belong to somebody else). Reaping happens under the same lock,
// so a child that is not done is still ours to signal.
func (c *Child) Signal(sig syscall.Signal) error {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	select {
	case <-c.done:
		return os.ErrProcessDone
	default:
		return syscall.Kill(c.Pid, sig)
	}
}

// Reaper owns wait4(-1).
type Reaper struct {
	log *slog.Logger

	mu       sync.Mutex
	children map[int]*Child
	orphans  int
}

// New returns a Reaper; log may be nil.
func New(log *slog.Logger) *Reaper {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reaper{log: log.With("component", "reaper"), children: map[int]*Child{}}
}

// BecomeSubreaper makes orphaned descendants our children when we are not
// PID 1, so that the same single reaper sees them outside a container too.
func BecomeSubreaper() error {
	if os.Getpid() == 1 {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	return nil
}

// afterFork lets a test hold a new child between fork and registration.
var afterFork func(pid int)

// Start forks and execs argv0. The registry lock is held across the fork so
// that the reaper cannot hand the exit status of a fast child to nobody.
func (r *Reaper) Start(argv0 string, argv []string, attr *syscall.ProcAttr) (*Child, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv0, err)
	}
	if afterFork != nil {
		afterFork(pid)
	}
	c := &Child{Pid: pid, r: r, done: make(chan struct{})}
	r.children[pid] = c
	return c, nil
}

// Orphans is the number of processes reaped that nobody started through us.
func (r *Reaper) Orphans() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.orphans
}

// Run reaps children until ctx ends. SIGCHLD wakes it; a slow tick is the
// backstop for coalesced signals.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
	}
}

// reapAll reaps every exited child. A child is first only looked at
// (WNOWAIT), then reaped and handed over under the lock: its pid cannot be
// reused by a newly started child, nor signalled by Child.Signal, while its
// status is on its way.
func (r *Reaper) reapAll() {
	for {
		pid := exited()
		if pid <= 0 {
			return
		}
		r.mu.Lock()
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		c, ok := r.children[pid]
		if err == nil {
			if ok {
				delete(r.children, pid)
				c.st = Status{Pid: pid, Wait: ws}
				close(c.done)
			} else {
				r.orphans++
			}
		}
		r.mu.Unlock()
		if err == nil && !ok {
			r.log.Debug("reaped orphan", "pid", pid, "status", Status{Pid: pid, Wait: ws}.String())
		}
	}
}

// siginfo is the part of Linux's siginfo_t that waitid fills for a child.
type siginfo struct {
	signo, errno, code int32
	_                  int32
	pid                int32
	_                  [108]byte
}

// exited returns the pid of an exited child without reaping it, or 0.
func exited() int {
	for {
		var si siginfo
		_, _, e := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&si)),
			unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return int(si.pid) // 0 when no child has exited yet
		case syscall.EINTR:
			continue
		default:
			return 0 // ECHILD: no children at all
		}
	}
}
