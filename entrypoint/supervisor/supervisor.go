// Package supervisor runs the HAProxy master as seamless's main child: it
// starts it in master-worker mode, turns signals into reloads and a
// graceful drain, and ends with the master's exit status.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/reaper"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"golang.org/x/sys/unix"
)

// Signals with a meaning of their own; every other catchable one in
// forwarded is passed to the master. SIGURG is the Go runtime's and SIGCHLD
// the reaper's, so neither is listed.
var (
	reloadSignals = []os.Signal{syscall.SIGHUP, syscall.SIGUSR2}
	// SIGPWR is how LXC and Incus stop a container.
	stopSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGPWR}
	// The master has no handler for SIGALRM, which would kill it.
	forwarded = []os.Signal{syscall.SIGUSR1, syscall.SIGQUIT, syscall.SIGWINCH,
		syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGCONT}
)

// hardStopWait is how long the master has to exit after SIGTERM before
// everything left in its process group is killed.
const hardStopWait = 2 * time.Second

// Options configure a Supervisor.
// Notify starts catching every signal the supervisor handles. Call it as
// early as possible and pass the channel in Options.Signals: until then the
// Go runtime's default applies, and a SIGHUP or SIGTERM during start-up
// (the configuration checks) would end seamless at once with status 2
// instead of becoming a reload or a drain.
func Notify() chan os.Signal {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, append(append(append([]os.Signal{}, reloadSignals...), stopSignals...), forwarded...)...)
	return sigs
}

type Options struct {
	Bin       string   // haproxy executable
	Args      []string // the master's arguments (CommandLine.RunArgs)
	Env       []string // filtered through HAProxyEnv
	StopGrace time.Duration
	Output    io.Writer      // where HAProxy's stdout and stderr are copied
	Signals   chan os.Signal // from Notify; nil: Run calls Notify itself
	// OnReload, when set, receives SIGHUP and SIGUSR2 instead of the
	// reloader: discovery re-reads its sources and template first.
	OnReload func(signal string)
	// OnReady, when set, is called once the first worker serves, with
	// the master's version as `show proc` prints it.
	OnReady func(version string)
	// OnStop, when set, is called once, as a stop begins and before
	// HAProxy is told to drain: what changes HAProxy's configuration
	// stops first. It must not block.
	OnStop func()
}

// Supervisor runs one HAProxy master.
type Supervisor struct {
	opts     Options
	reaper   *reaper.Reaper
	reloader *reload.Reloader
	cli      *haproxy.MasterCLI
	tap      *haproxy.LogTap
	metrics  *metrics.Metrics
	log      *slog.Logger

	master   atomic.Pointer[reaper.Child]
	stopping atomic.Bool
	ready    atomic.Bool
}

// New returns a Supervisor. The reaper must be running.
func New(opts Options, rp *reaper.Reaper, rl *reload.Reloader, cli *haproxy.MasterCLI, tap *haproxy.LogTap, m *metrics.Metrics, log *slog.Logger) *Supervisor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Output == nil {
		opts.Output = os.Stderr
	}
	return &Supervisor{opts: opts, reaper: rp, reloader: rl, cli: cli, tap: tap, metrics: m,
		log: log.With("component", "supervisor")}
}

// Healthy reports whether the master runs and is not being stopped.
func (s *Supervisor) Healthy() error {
	c := s.master.Load()
	switch {
	case c == nil:
		return errors.New("haproxy not started")
	case isDone(c):
		return errors.New("haproxy master exited")
	case s.stopping.Load():
		return errors.New("stopping")
	case !s.ready.Load():
		return errors.New("haproxy starting")
	}
	return nil
}

func isDone(c *reaper.Child) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// Run starts HAProxy and supervises it until the master exits, and returns
// the exit code for the process: the master's, or 128+signal. Cancelling
// ctx is a graceful stop, as SIGTERM is.
func (s *Supervisor) Run(ctx context.Context) int {
	sigs := s.opts.Signals
	if sigs == nil {
		sigs = Notify()
	}
	defer signal.Stop(sigs)

	master, copied, err := s.start()
	if err != nil {
		s.log.Error("cannot start haproxy", "err", err)
		return 127
	}
	s.master.Store(master)
	s.metrics.HAProxyUp.Set(1)
	s.log.Info("haproxy started", "pid", master.Pid, "args", s.opts.Args)

	// Every goroutine started here ends before Run returns.
	rctx, stopReloads := context.WithCancel(context.Background())
	defer stopReloads()
	reloaderDone := make(chan struct{})
	go func() { defer close(reloaderDone); s.reloader.Run(rctx) }()
	readyDone := make(chan struct{})
	go func() { defer close(readyDone); s.awaitReady(rctx) }()
	runCtx, cancelRun := context.WithCancel(context.Background())
	var drainWG sync.WaitGroup
	defer func() { cancelRun(); drainWG.Wait(); stopReloads(); <-reloaderDone; <-readyDone }()

	var grace, kill <-chan time.Time
	var draining <-chan error
	stop := func(why string) {
		if s.stopping.Swap(true) {
			return
		}
		s.log.Info("stopping: haproxy stops accepting and lets in-flight requests finish",
			"why", why, "grace", s.opts.StopGrace)
		if s.opts.OnStop != nil {
			s.opts.OnStop()
		}
		grace = time.After(s.opts.StopGrace)
		// A reload in flight is finished, not abandoned: HAProxy would
		// go on with it regardless, and the soft stop must follow it.
		s.reloader.Close()
		draining = s.softStop(runCtx, &drainWG, reloaderDone, master)
	}
	hardStop := func(why string) {
		s.log.Warn("stopping haproxy hard; connections still open are closed", "why", why)
		stopReloads()
		cancelRun() // no soft stop may follow the hard one
		_ = master.Signal(syscall.SIGTERM)
		grace, draining = nil, nil
		if kill == nil {
			kill = time.After(hardStopWait)
		}
	}
	ctxDone := ctx.Done()
	for {
		select {
		case <-master.Done():
			code := s.exited(master)
			s.waitCopied(copied)
			return code
		case <-ctxDone:
			ctxDone = nil
			stop("context cancelled")
		case err := <-draining:
			draining = nil
			if err != nil {
				hardStop(err.Error())
			}
		case <-grace:
			hardStop(fmt.Sprintf("drain did not finish within %s (SEAMLESS_STOP_GRACE)", s.opts.StopGrace))
		case <-kill:
			s.log.Error("haproxy did not exit after SIGTERM, killing it", "pid", master.Pid)
			_ = syscall.Kill(-master.Pid, syscall.SIGKILL)
		case sig := <-sigs:
			s.handle(sig.(syscall.Signal), master, stop, hardStop)
		}
	}
}

// softStop sends the master SIGUSR1 once it can act on it. A master that
// is re-executing (a reload in flight) or still starting loses or dies of
// the signal, so first the reload is allowed to end and the master must
// answer on its CLI with a worker. The result arrives on the channel.
func (s *Supervisor) softStop(ctx context.Context, wg *sync.WaitGroup, reloaderDone <-chan struct{}, master *reaper.Child) <-chan error {
	out := make(chan error, 1)
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, s.opts.StopGrace)
		defer cancel()
		select {
		case <-reloaderDone:
		case <-ctx.Done():
		}
		if _, err := s.cli.WaitWorkerReady(ctx); err != nil {
			out <- fmt.Errorf("master not answering, cannot drain: %w", err)
			return
		}
		out <- master.Signal(syscall.SIGUSR1)
	})
	return out
}

func (s *Supervisor) handle(sig syscall.Signal, master *reaper.Child, stop, hardStop func(string)) {
	name := unix.SignalName(sig)
	switch sig {
	case syscall.SIGHUP, syscall.SIGUSR2:
		if s.stopping.Load() {
			s.log.Info("ignoring reload request while stopping", "signal", name)
			return
		}
		if s.opts.OnReload != nil {
			s.opts.OnReload(name)
			return
		}
		s.reloader.Request(name)
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGPWR:
		if s.stopping.Load() {
			hardStop("second stop signal " + name)
			return
		}
		stop(name)
	default:
		// Before its handlers exist, many of these would kill or stop
		// the master with their default action.
		if !s.ready.Load() || s.reloader.Busy() {
			s.log.Warn("haproxy is starting or reloading, dropping signal", "signal", name)
			return
		}
		s.log.Info("forwarding signal to haproxy master", "signal", name)
		_ = master.Signal(sig)
	}
}

func (s *Supervisor) start() (*reaper.Child, <-chan struct{}, error) {
	path, err := exec.LookPath(s.opts.Bin)
	if err != nil {
		return nil, nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	// HAProxy gets its own process group: a terminal's Ctrl-C reaches only
	// us, and we decide between a drain and a hard stop. If seamless itself
	// is killed outside a container, the master must not live on unmanaged
	// and keep its ports; Go threads do not exit under a running program,
	// so the parent-death signal fires only when the process dies.
	c, err := s.reaper.Start(path, append([]string{s.opts.Bin}, s.opts.Args...), &syscall.ProcAttr{
		Env:   HAProxyEnv(s.opts.Env),
		Files: []uintptr{os.Stdin.Fd(), pw.Fd(), pw.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM},
	})
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, nil, err
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		defer pr.Close()
		s.tap.Copy(pr, s.opts.Output)
	}()
	return c, copied, nil
}

// awaitReady logs once the first worker serves.
func (s *Supervisor) awaitReady(ctx context.Context) {
	p, err := s.cli.WaitWorkerReady(ctx)
	if err != nil {
		return
	}
	s.ready.Store(true)
	s.metrics.LastReloadSuccess.SetToCurrentTime()
	s.metrics.Workers.WithLabelValues("current").Set(float64(len(p.Workers)))
	s.log.Info("haproxy ready", "version", p.Master.Version, "master", p.Master.Pid, "workers", len(p.Workers))
	if s.opts.OnReady != nil {
		s.opts.OnReady(p.Master.Version)
	}
}

// waitCopied lets HAProxy's last lines (often the reason it exited) reach
// the log. Workers that outlive the master keep the pipe open, hence the
// bound.
func (s *Supervisor) waitCopied(copied <-chan struct{}) {
	select {
	case <-copied:
	case <-time.After(time.Second):
	}
}

// exited reports the master's end, stops whatever it left behind, and
// returns the process's exit code.
func (s *Supervisor) exited(master *reaper.Child) int {
	st := master.Status()
	s.metrics.HAProxyUp.Set(0)
	if s.stopping.Load() {
		s.log.Info("haproxy stopped", "status", st.String())
	} else {
		s.log.Error("haproxy master exited on its own; exiting with its status so the restart policy applies",
			"status", st.String())
	}
	s.killGroup(master.Pid)
	return st.ExitCode()
}

// killGroup stops workers that outlived their master (they are in its
// process group), so that seamless never exits leaving HAProxy behind.
func (s *Supervisor) killGroup(pgid int) {
	if syscall.Kill(-pgid, 0) != nil {
		return
	}
	s.log.Warn("stopping haproxy processes left behind by the master", "pgid", pgid)
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(hardStopWait)
	for time.Now().Before(deadline) {
		if syscall.Kill(-pgid, 0) != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}
