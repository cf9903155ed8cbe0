package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/procfs"
)

// Bounds on waiting for processes. A reload that HAProxy loses (a signal
// arriving mid-reload) shows up as a timeout and is not counted as done.
const (
	readyTimeout  = 15 * time.Second
	reloadTimeout = 15 * time.Second
	// stopGrace exceeds the config's hard-stop-after, so old workers
	// finish on their own before anything is killed.
	stopGrace = 40 * time.Second
	// pollEvery is how often completion of a reload is checked.
	pollEvery = 2 * time.Millisecond
)

// scenario is one way of running HAProxy and reloading it.
type scenario interface {
	// start runs HAProxy with the config at env.cfgPath and returns once
	// the frontend serves.
	start(ctx context.Context) error
	// reload asks for a reload of the config file and waits until it is
	// complete, returning how long that took.
	reload(ctx context.Context) (time.Duration, error)
	// stop ends every process the scenario started. It must be safe to
	// call after a failed or partial start.
	stop() error
}

// runEnv is what a scenario gets for one run: private paths and addresses.
type runEnv struct {
	dir      string // private temp dir; its path also marks our processes
	cfgPath  string
	logPath  string
	log      *os.File
	frontend string // 127.0.0.1:port HAProxy binds
	haproxy  string // HAProxy binary
	seamless string // seamless binary (scenario a)
}

// scenarioSpec names a scenario and builds it for a run.
type scenarioSpec struct {
	key   string // flag value: a, b, c or d
	title string
	build func(*runEnv) scenario
}

var allScenarios = []scenarioSpec{
	{"a", "a seamless", func(e *runEnv) scenario { return &seamlessRun{env: e} }},
	{"b", "b master-worker", func(e *runEnv) scenario { return &masterWorker{env: e} }},
	{"c", "c legacy -sf", func(e *runEnv) scenario { return &legacy{env: e} }},
	{"d", "d hard restart", func(e *runEnv) scenario { return &hardRestart{env: e} }},
}

// waitServing waits until the frontend answers 200, failing early if alive
// reports that a process we depend on is gone.
func (e *runEnv) waitServing(ctx context.Context, alive func() error) error {
	err := poll(ctx, 10*time.Millisecond, readyTimeout, "frontend ready", func() (bool, error) {
		if err := alive(); err != nil {
			return false, err
		}
		return frontendServes(ctx, e.frontend)
	})
	return e.withLog(err)
}

// withLog appends the end of the run's process log to err.
func (e *runEnv) withLog(err error) error {
	if err == nil {
		return nil
	}
	if t := tail(e.logPath, 15); t != "" {
		return fmt.Errorf("%w\n--- %s (last lines)\n%s", err, e.logPath, t)
	}
	return err
}

// masterWorker is scenario b: the official image's way, `haproxy -W -db`
// with a master CLI, reloaded by SIGUSR2 to the master.
type masterWorker struct {
	env     *runEnv
	p       *proc
	sock    string
	reloads int // the master's reload counter after the last reload
	failed  int
}

func (s *masterWorker) start(ctx context.Context) error {
	s.sock = filepath.Join(s.env.dir, "master.sock")
	p, err := startProc("haproxy master", s.env.log, nil,
		s.env.haproxy, "-W", "-db", "-S", s.sock, "-f", s.env.cfgPath)
	if err != nil {
		return err
	}
	s.p = p
	var info haproxy.Procs
	err = poll(ctx, 10*time.Millisecond, readyTimeout, "master CLI ready", func() (bool, error) {
		if err := p.alive(); err != nil {
			return false, err
		}
		info, err = showProc(ctx, s.sock)
		return err == nil && len(info.Workers) > 0, err
	})
	if err != nil {
		return s.env.withLog(err)
	}
	s.reloads, s.failed = info.Master.Reloads, info.Master.Failed
	return s.env.waitServing(ctx, p.alive)
}

func (s *masterWorker) reload(ctx context.Context) (time.Duration, error) {
	info, lat, err := signalAndWaitReload(ctx, s.env, s.p, syscall.SIGUSR2, s.sock, s.reloads)
	if err != nil {
		return 0, err
	}
	s.reloads = info.Master.Reloads
	if info.Master.Failed > s.failed {
		s.failed = info.Master.Failed
		return 0, fmt.Errorf("master reports a failed reload (failed: %d)", info.Master.Failed)
	}
	return lat, nil
}

// signalAndWaitReload sends sig to p and times it until the master CLI at
// sock reports a reload counter above before: the same probe for every
// master-worker scenario. While the master re-executes its CLI refuses or
// resets connections; polling goes on through those.
func signalAndWaitReload(ctx context.Context, env *runEnv, p *proc, sig syscall.Signal, sock string, before int) (haproxy.Procs, time.Duration, error) {
	t0 := time.Now()
	if err := p.signal(sig); err != nil {
		return haproxy.Procs{}, 0, err
	}
	var info haproxy.Procs
	err := poll(ctx, pollEvery, reloadTimeout, "master reload counter", func() (bool, error) {
		if err := p.alive(); err != nil {
			return false, err
		}
		var err error
		info, err = showProc(ctx, sock)
		return err == nil && info.Master.Reloads > before, err
	})
	lat := time.Since(t0)
	if err != nil {
		return info, 0, env.withLog(err)
	}
	return info, lat, nil
}

func (s *masterWorker) stop() error {
	if s.p == nil {
		return nil
	}
	return s.p.stop(syscall.SIGTERM, stopGrace)
}

// legacy is scenario c: daemons replaced with `-sf`, as consul-template
// setups did. The new process binds its own sockets beside the old ones.
type legacy struct {
	env     *runEnv
	pidfile string
}

func (s *legacy) start(ctx context.Context) error {
	s.pidfile = filepath.Join(s.env.dir, "haproxy.pid")
	if err := s.run(ctx); err != nil {
		return err
	}
	return s.env.waitServing(ctx, s.alive)
}

// run starts a daemon, replacing the pids in the pidfile if there are any,
// and returns when the launching command has returned.
func (s *legacy) run(ctx context.Context) error {
	args := []string{"-D", "-p", s.pidfile, "-f", s.env.cfgPath}
	if old, err := readPidfile(s.pidfile); err == nil && len(old) > 0 {
		args = append(args, "-sf")
		for _, pid := range old {
			args = append(args, strconv.Itoa(pid))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.env.haproxy, args...)
	cmd.Stdout, cmd.Stderr = s.env.log, s.env.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return s.env.withLog(fmt.Errorf("haproxy %v: %w", args, err))
	}
	return nil
}

// alive fails when no process of the pidfile runs any more.
func (s *legacy) alive() error {
	pids, _ := readPidfile(s.pidfile)
	for _, pid := range pids {
		if procfs.Mentions(pid, s.env.dir) {
			return nil
		}
	}
	return fmt.Errorf("haproxy daemon %v: %w", pids, errExited)
}

func (s *legacy) reload(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	err := s.run(ctx)
	return time.Since(t0), err
}

func (s *legacy) stop() error { return stopDaemonsIn(s.pidfile, s.env.dir, stopGrace) }

// hardRestart is scenario d: what a PID 1 that dies on HUP gives. HAProxy
// is terminated and started again, closing its listener in between.
type hardRestart struct {
	env *runEnv
	p   *proc
}

func (s *hardRestart) launch() error {
	p, err := startProc("haproxy", s.env.log, nil, s.env.haproxy, "-db", "-f", s.env.cfgPath)
	if err != nil {
		return err
	}
	s.p = p
	return nil
}

func (s *hardRestart) start(ctx context.Context) error {
	if err := s.launch(); err != nil {
		return err
	}
	return s.env.waitServing(ctx, s.p.alive)
}

func (s *hardRestart) reload(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	if err := s.p.stop(syscall.SIGTERM, reloadTimeout); err != nil {
		return 0, err
	}
	if err := s.launch(); err != nil {
		return 0, err
	}
	err := poll(ctx, time.Millisecond, reloadTimeout, "frontend accepts", func() (bool, error) {
		if err := s.p.alive(); err != nil {
			return false, err
		}
		return acceptsTCP(s.env.frontend), nil
	})
	if err != nil {
		return 0, s.env.withLog(err)
	}
	return time.Since(t0), nil
}

func (s *hardRestart) stop() error {
	if s.p == nil {
		return nil
	}
	return s.p.stop(syscall.SIGTERM, stopGrace)
}

// isFatal reports whether a reload error should end the run.
func isFatal(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, errExited)
}
