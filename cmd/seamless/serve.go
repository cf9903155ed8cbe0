package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/reaper"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/entrypoint/supervisor"
	"golang.org/x/sys/unix"
)

// serve is the long-running mode: HAProxy supervised until it exits.
func serve(ctx context.Context, cfg *config.Config, bin string, args []string, log *slog.Logger) int {
	// First of all: signals that arrive during start-up wait here.
	sigs := supervisor.Notify()
	// A stop signal before HAProxy runs (the discovery wait can be long)
	// ends the start-up at once.
	startCtx, abortStart := context.WithCancel(ctx)
	defer abortStart()
	watch := supervisor.WatchStart(sigs, abortStart)
	watching := true
	endWatch := func() os.Signal {
		if !watching {
			return nil
		}
		watching = false
		return watch.End()
	}
	defer endWatch()
	log.Info("starting", "version", versionLine(), "pid", os.Getpid())
	// HAProxy's external checks and program children run as seamless's
	// user (the image's "haproxy"): not dumpable, seamless's /proc files
	// are root's, so they cannot read CONSUL_HTTP_TOKEN in its environ.
	// HAProxy itself is dumpable again after exec.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Warn("cannot hide seamless's environment from processes of the same user", "err", err)
	}
	if err := os.MkdirAll(cfg.RunDir, 0o750); err != nil {
		log.Error("cannot create SEAMLESS_RUN_DIR", "dir", cfg.RunDir, "err", err)
		return exitUsage
	}
	master := filepath.Join(cfg.RunDir, "master.sock")
	cl, err := haproxy.ParseCommandLine(args, master)
	if err != nil {
		log.Error("bad haproxy command line", "err", err)
		return exitUsage
	}
	if strings.HasPrefix(cl.MasterSocket, master+",") && len(master) > haproxy.MaxSocketPath {
		// HAProxy would refuse it and exit, with no word of the variable.
		log.Error("SEAMLESS_RUN_DIR is too long: HAProxy listens on a socket path of at most "+strconv.Itoa(haproxy.MaxSocketPath)+
			" bytes, and its master CLI socket there would be longer; choose a shorter directory (or give haproxy -S)",
			"dir", cfg.RunDir, "socket", master, "bytes", len(master))
		return exitUsage
	}
	if len(cl.Dropped) > 0 {
		log.Warn("ignoring haproxy arguments that would defeat supervision", "args", cl.Dropped)
	}
	// HAProxy would block on a FIFO for ever, never healthy.
	var notRegular *haproxy.NotRegularError
	if _, err := haproxy.ExpandConfigFiles(cl.ConfigFiles); errors.As(err, &notRegular) && !cfg.Discovery() {
		log.Error("cannot start HAProxy on this configuration", "err", err)
		return exitUsage
	}
	if cfg.Discovery() {
		if len(cl.ConfigFiles) > 0 {
			log.Info("discovery mode: HAProxy runs the rendered configuration instead of the files on its command line",
				"replaced", cl.ConfigFiles)
		}
		cl = cl.WithConfig(filepath.Join(cfg.StateDir, renderedName))
	}

	// The reaper outlives everything else: it must still collect the
	// master's status and whatever its workers leave behind.
	rp := reaper.New(log)
	if err := reaper.BecomeSubreaper(); err != nil {
		log.Warn("cannot become a child subreaper; orphans will not be reaped here", "err", err)
	}
	reapCtx, stopReaper := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rp.Run(reapCtx) })
	defer func() { stopReaper(); wg.Wait() }()

	m := metrics.New()
	env := supervisor.HAProxyEnv(os.Environ())
	// Discovery writes the file HAProxy starts with, so it starts first;
	// the reloader it needs exists only later.
	var rl *reload.Reloader
	var checker *haproxy.Validator
	var disc *discovery
	var hc *httpsCerts
	if httpsEnabled(cfg) {
		// Before the first configuration, which names the certificates.
		hc, err = prepareCerts(cfg, cfg.StateDir, haproxy.NewMasterCLI(cl.MasterSocket),
			func(reason string) { disc.applier.Reload(reason) }, m.Registry, log)
		if err != nil {
			log.Error("HTTPS cannot start", "err", err)
			return exitUsage
		}
		defer hc.close()
	}
	// Closed once HAProxy serves its first configuration: the Consul
	// source's per-service queries wait for it (consul.Config.Serving).
	// version is HAProxy's from then.
	serving := make(chan struct{})
	var version atomic.Pointer[string]
	haproxyVersion := func() string {
		if v := version.Load(); v != nil {
			return *v
		}
		return ""
	}
	if cfg.Discovery() {
		// Until the reloader's validator (with the defaults and the
		// speed-up) exists, the first file is checked as it is.
		checker = &haproxy.Validator{Bin: bin, Args: cl.CheckArgs(), Env: env, Run: rp.Output}
		validate := func(ctx context.Context, cand string) error {
			return candidateValidator(checker, cl.ConfigFiles[0])(ctx, cand)
		}
		vouch := func(cand string, data []byte) error { return candidateVoucher(checker, cl.ConfigFiles[0])(cand, data) }
		disc, err = startDiscovery(startCtx, cfg, cl, validate, vouch, func() *reload.Reloader { return rl },
			haproxy.NewMasterCLI(cl.MasterSocket), m, hc.hostsFunc(), serving, haproxyVersion, log)
		if err != nil && startCtx.Err() != nil {
			if sig := endWatch(); sig != nil {
				return stoppedStarting(sig, log)
			}
		}
		if err != nil {
			log.Error("discovery cannot start", "err", err)
			return exitUsage
		}
		defer disc.stop()
	}
	extra, err := writeDefaults(cfg, cl, filepath.Join(cfg.RunDir, "defaults.cfg"), log)
	if err != nil {
		log.Error("cannot write defaults file", "err", err)
		return exitUsage
	}
	tap := haproxy.NewLogTap()
	tap.OnSocketTransferFailure = func(line string) {
		m.SocketTransferFailures.Inc()
		log.Error("HAProxy could not pass its listening sockets to the new worker and bound new ones; connections queued on the old sockets may have been reset. Check that the master CLI and the run directory are usable",
			"component", "haproxy", "line", line)
	}
	cli := haproxy.NewMasterCLI(cl.MasterSocket)
	validator := &haproxy.Validator{Bin: bin, Args: cl.CheckArgs(extra...), Env: env, Run: rp.Output, Files: cl.ConfigFiles}
	validator, err = haproxy.WithSpeedup(startCtx, validator, cl, extra, filepath.Join(cfg.RunDir, "check-speedup.cfg"))
	if err != nil {
		log.Warn("validating at full cost", "err", err)
	}
	// Before any reload, the addresses a new configuration adds are
	// bound once, so that a reload that would fail to bind is never sent.
	validator.GuardBinds()
	if cfg.Discovery() {
		validateOnce(validator)
	}
	checker = validator
	reloads := newReloadLog(cl.ConfigFiles, cfg.Discovery())
	rl = reload.New(cli, reloads.checker(validator), tap, m, log, cfg.ReloadTimeout)
	rl.OnDone = reloads.done
	m.WatchWorkers(countWorkers(cli, rl.Busy))
	m.WatchConfig(func() (string, string) {
		fp := runningFingerprint(cl.ConfigFiles, disc != nil, reloads)
		return fp.SHA256, fp.MembersSHA256
	})
	servingOnce := sync.OnceFunc(func() { close(serving) })
	opts := supervisor.Options{Bin: bin, Args: cl.RunArgs(extra...), Env: env, StopGrace: cfg.StopGrace, Signals: sigs,
		OnReady: func(v string) { version.Store(&v); servingOnce() }}
	ready := func() error { return nil }
	if disc != nil {
		opts.OnReload = disc.applier.Reload
		// A draining HAProxy runs what it ran: a runtime change to a
		// worker that soft-stops does not read back as sent, and the
		// reload it falls back to is refused while stopping, after
		// seconds of haproxy -c at 10,000 services.
		opts.OnStop = disc.halt
		ready = sourcesReady(disc.applier.Ready, disc.applier.Statuses)
		disc.run()
		if hc != nil {
			hc.run()
		}
	}
	opts.Output = os.Stderr
	if cfg.LogFormat == "json" {
		opts.Output = haproxyLines{log}
	}
	opts.Output = onceEach(stopsSummed(opts.Output))
	if sig := endWatch(); sig != nil {
		return stoppedStarting(sig, log)
	}
	sup := supervisor.New(opts, rp, rl, cli, tap, m, log)

	if cfg.StatusAddr != "" {
		srv, err := status.Listen(cfg.StatusAddr, m.Registry, sup.Healthy, ready, log,
			status.WithStatus(statusProvider(disc, cli, cl.ConfigFiles, reloads, hc)))
		if err != nil {
			log.Error("cannot listen on SEAMLESS_STATUS_ADDR", "addr", cfg.StatusAddr, "err", err)
			return exitUsage
		}
		statusCtx, stopStatus := context.WithCancel(context.Background())
		wg.Go(func() {
			if err := srv.Run(statusCtx); err != nil {
				log.Error("status endpoint failed", "err", err)
			}
		})
		defer stopStatus()
	}
	if cfg.DebugAddr != "" {
		srv, err := status.ListenDebug(cfg.DebugAddr, log)
		if err != nil {
			log.Error("cannot listen on SEAMLESS_DEBUG_ADDR", "addr", cfg.DebugAddr, "err", err)
			return exitUsage
		}
		debugCtx, stopDebug := context.WithCancel(context.Background())
		wg.Go(func() {
			if err := srv.Run(debugCtx); err != nil {
				log.Error("debug endpoint failed", "err", err)
			}
		})
		defer stopDebug()
	}
	return sup.Run(ctx)
}

// stoppedStarting ends a start-up that a stop signal interrupted: nothing
// was serving yet, so it is a clean stop (exit 0).
func stoppedStarting(sig os.Signal, log *slog.Logger) int {
	log.Info("stopped during start-up; HAProxy was not started", "signal", sig)
	return 0
}

// writeDefaults scans the user's configuration, warns about what makes
// reloads lossy, and writes the global defaults it lacks. It returns the
// extra HAProxy arguments that load them.
func writeDefaults(cfg *config.Config, cl *haproxy.CommandLine, path string, log *slog.Logger) ([]string, error) {
	have, err := haproxy.ScanConfig(cl.ConfigFiles)
	if err != nil {
		// HAProxy will name the problem itself when it loads the file.
		log.Warn("cannot scan the configuration", "err", err)
	}
	if err == nil && !have.IdleCloseOnResp {
		log.Warn("the configuration has no 'option idle-close-on-response': keep-alive clients that do not retry can fail at every reload; add it to the defaults section",
			"files", cl.ConfigFiles)
	}
	warnWithheldRefs(cl.ConfigFiles, log)
	wsock := workerSocket(filepath.Dir(path))
	content := haproxy.Defaults{HardStopAfter: cfg.HardStopAfter, MaxReloads: cfg.MaxReloads, WorkerSocket: wsock}.File(have)
	if content == "" {
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return nil, rmErr
		}
		return nil, nil
	}
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		return nil, err
	}
	log.Info("adding defaults the configuration does not set", "file", path,
		"hard_stop_after", cfg.HardStopAfter, "mworker_max_reloads", cfg.MaxReloads,
		"worker_socket", cmp.Or(wsock, "none: the runtime API goes through the master CLI"))
	return []string{"-f", path}, nil
}

// workerSocket is the worker's stats socket in dir (the run directory,
// beside the defaults file that declares it; haproxy.Runtime.Worker), or
// "" when its path cannot be one.
func workerSocket(dir string) string {
	if p := filepath.Join(dir, "worker.sock"); haproxy.SocketPathFits(p) {
		return p
	}
	return ""
}

// withheldRef finds "${NAME}" or "$NAME" where NAME is kept from HAProxy.
var withheldRef = regexp.MustCompile(`\$\{?((?:CONSUL|DOCKER|SEAMLESS)_[A-Za-z0-9_]*)`)

// warnWithheldRefs names the lines of the configuration that expect a
// variable HAProxy is not given (supervisor.HAProxyEnv): HAProxy reads it
// as empty.
func warnWithheldRefs(paths []string, log *slog.Logger) {
	// Only regular files: a FIFO would block this read for ever.
	files, _ := haproxy.ExpandConfigFiles(paths)
	for _, f := range files.Files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // HAProxy will say
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range withheldRef.FindAllStringSubmatch(line, -1) {
				log.Warn("the configuration uses a variable HAProxy is not given (CONSUL_*, DOCKER_* and SEAMLESS_* are withheld): it reads as empty; pass the value under another name",
					"file", f, "line", i+1, "variable", m[1])
			}
		}
	}
}

// check validates the configuration as serve would load it; in discovery
// mode, the configuration discovery would render now.
func check(ctx context.Context, cfg *config.Config, bin string, args []string, stdout, stderr io.Writer, log *slog.Logger) int {
	if cfg.Discovery() {
		return render(ctx, cfg, bin, args, true, stdout, stderr, log)
	}
	cl, err := haproxy.ParseCommandLine(args, filepath.Join(cfg.RunDir, "master.sock"))
	if err != nil {
		fmt.Fprintf(stderr, "seamless check: %v\n", err)
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "seamless-check-")
	if err != nil {
		fmt.Fprintf(stderr, "seamless check: %v\n", err)
		return exitNoRun
	}
	defer os.RemoveAll(dir)
	return checkFiles(ctx, cfg, bin, cl, dir, stdout, stderr, log)
}

// checkFiles runs haproxy -c on cl's files with seamless's defaults, which
// it writes into dir.
func checkFiles(ctx context.Context, cfg *config.Config, bin string, cl *haproxy.CommandLine, dir string, stdout, stderr io.Writer, log *slog.Logger) int {
	extra, err := writeDefaults(cfg, cl, filepath.Join(dir, "defaults.cfg"), log)
	if err != nil {
		fmt.Fprintf(stderr, "seamless check: %v\n", err)
		return exitNoRun
	}
	rp, stop := startReaper(log)
	defer stop()
	v := &haproxy.Validator{Bin: bin, Args: cl.CheckArgs(extra...), Env: supervisor.HAProxyEnv(os.Environ()), Run: rp.Output, Files: cl.ConfigFiles}
	err = v.Check(ctx)
	var ce *haproxy.ConfigError
	switch {
	case errors.As(err, &ce):
		fmt.Fprint(stderr, ce.Output)
		fmt.Fprintf(stderr, "seamless check: configuration is invalid (%s)\n", strings.Join(cl.ConfigFiles, ", "))
		return exitInvalid
	case err != nil:
		fmt.Fprintf(stderr, "seamless check: %v\n", err)
		return exitNoRun
	}
	fmt.Fprintf(stdout, "configuration is valid: %v\n", cl.ConfigFiles)
	return 0
}

func printVersion(ctx context.Context, bin string, stdout io.Writer) int {
	fmt.Fprintln(stdout, versionLine())
	rp, stop := startReaper(nil)
	defer stop()
	v, err := haproxy.Version(ctx, rp.Output, bin)
	if err != nil {
		fmt.Fprintf(stdout, "HAProxy: not found (%v)\n", err)
		return 0
	}
	fmt.Fprintf(stdout, "HAProxy %s (%s)\n", v, bin)
	return 0
}

// startReaper runs a reaper for the one-shot commands, which start children
// too.
func startReaper(log *slog.Logger) (*reaper.Reaper, func()) {
	rp := reaper.New(log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rp.Run(ctx) }()
	return rp, func() { cancel(); <-done }
}
