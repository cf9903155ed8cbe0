package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv/freeport"
)

// What the discovery benchmarks share: seamless in discovery mode as a
// child, whose JSON log is read as it is written; named backends; reading
// /metrics and /proc.

// The messages of seamless's log records for a change it applied, with a
// reload or over HAProxy's runtime API. Their duration attribute covers
// render, and haproxy -c and the confirmed reload or the runtime commands
// (not the SEAMLESS_WAIT quiescence before).
const (
	appliedReload  = "applied with a reload"
	appliedRuntime = "applied over the runtime API, no reload"
)

// applied is one such record.
type applied struct {
	at       time.Time     // the record's time (seamless's clock, ours too)
	duration time.Duration // its duration attribute
	runtime  bool          // over the runtime API
	why      string        // what triggered it: "consul", "drain finished", ...
	// reload is the duration of the "reloaded" record before it: the
	// reload alone, from the master CLI's reload to a confirmed worker;
	// -1 without one.
	reload time.Duration
}

// discoveryOpts start seamless with SEAMLESS_SOURCES=consul and the
// built-in template.
type discoveryOpts struct {
	seamless, haproxy string
	consul            string // CONSUL_HTTP_ADDR
	dir               string // private: run and state directories, the log
	// addrs are SEAMLESS_HTTP_BIND, SEAMLESS_STATS_BIND and
	// SEAMLESS_STATUS_ADDR, from freeAddrs(3).
	addrs []string
	// env are further SEAMLESS_* variables (SEAMLESS_WAIT, ...).
	env map[string]string
}

// discoveryRun is a running seamless in discovery mode.
type discoveryRun struct {
	p        *proc
	status   string // SEAMLESS_STATUS_ADDR
	http     string // SEAMLESS_HTTP_BIND
	stateDir string
	logPath  string

	events chan applied
	// seamless's own records at WARN and ERROR, and HAProxy's output lines
	// (every one, and its [ALERT]s).
	warns, errs     atomic.Int64
	haproxy, alerts atomic.Int64
	firstErr        atomic.Pointer[string]
	readerDone      chan struct{}
	pipe            *os.File // the read end of seamless's stdout and stderr
}

// startDiscovery starts seamless and returns at once; waitReady waits.
func startDiscovery(o discoveryOpts) (*discoveryRun, error) {
	d := &discoveryRun{
		status:     o.addrs[2],
		http:       o.addrs[0],
		stateDir:   filepath.Join(o.dir, "state"),
		logPath:    filepath.Join(o.dir, "seamless.log"),
		events:     make(chan applied, 256),
		readerDone: make(chan struct{}),
	}
	runDir := filepath.Join(o.dir, "run")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	env := o.environ(d.stateDir, runDir)
	logf, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	d.pipe = pr
	p, err := startProc("seamless", pw, env, o.seamless, "haproxy")
	pw.Close() // the child has its own
	if err != nil {
		pr.Close()
		logf.Close()
		return nil, err
	}
	d.p = p
	go func() {
		defer close(d.readerDone)
		defer logf.Close()
		d.readLog(pr, logf)
	}()
	return d, nil
}

// environ is the environment seamless runs with, with its state and run
// directories. Nothing of the benchmark's own environment that seamless or
// its Consul client would read passes: a token or a SEAMLESS_* meant for
// something else.
func (o discoveryOpts) environ(stateDir, runDir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SEAMLESS_") && !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"SEAMLESS_SOURCES=consul",
		"CONSUL_HTTP_ADDR="+o.consul,
		"SEAMLESS_HTTP_BIND="+o.addrs[0],
		// No HTTPS frontend: its default :443 would collide between
		// benchmarks, and no benchmark here measures it.
		"SEAMLESS_HTTPS_BIND=",
		"SEAMLESS_STATS_BIND="+o.addrs[1],
		"SEAMLESS_STATUS_ADDR="+o.addrs[2],
		"SEAMLESS_STATE_DIR="+stateDir,
		"SEAMLESS_RUN_DIR="+runDir,
		"SEAMLESS_LOG_FORMAT=json",
		"SEAMLESS_HAPROXY_BIN="+o.haproxy,
	)
	// Later entries win (os/exec keeps the last of a duplicate name): o.env
	// may replace SEAMLESS_SOURCES.
	for _, k := range slices.Sorted(maps.Keys(o.env)) {
		env = append(env, k+"="+o.env[k])
	}
	return env
}

// readLog copies seamless's output to the log file and picks out the
// records the benchmarks time. Sends never block: a benchmark that stopped
// listening loses events, not the log.
func (d *discoveryRun) readLog(r io.Reader, logf io.Writer) {
	reload := time.Duration(-1)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		logf.Write(append(line, '\n'))
		var rec struct {
			Time      time.Time       `json:"time"`
			Level     string          `json:"level"`
			Msg       string          `json:"msg"`
			Component string          `json:"component"`
			Why       string          `json:"why"`
			Duration  json.RawMessage `json:"duration"`
		}
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		if rec.Component == "haproxy" {
			d.haproxy.Add(1)
			if strings.HasPrefix(rec.Msg, "[ALERT]") {
				d.alerts.Add(1)
			}
			continue
		}
		switch rec.Level {
		case "WARN":
			d.warns.Add(1)
		case "ERROR":
			if d.errs.Add(1) == 1 {
				msg := rec.Msg
				d.firstErr.Store(&msg)
			}
		}
		switch rec.Msg {
		case "reloaded":
			reload = parseLogDuration(rec.Duration)
		case appliedReload, appliedRuntime:
			ev := applied{at: rec.Time, duration: parseLogDuration(rec.Duration), runtime: rec.Msg == appliedRuntime,
				why: rec.Why, reload: -1}
			if !ev.runtime {
				ev.reload = reload
			}
			select {
			case d.events <- ev:
			default:
			}
			reload = -1
		}
	}
}

// parseLogDuration reads slog's JSON form of a duration (nanoseconds) or a
// string such as "215ms"; -1 when it is neither.
func parseLogDuration(raw json.RawMessage) time.Duration {
	var ns int64
	if json.Unmarshal(raw, &ns) == nil {
		return time.Duration(ns)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if d, err := time.ParseDuration(s); err == nil {
			return d
		}
	}
	return -1
}

// drainEvents forgets the events read so far.
func (d *discoveryRun) drainEvents() {
	for {
		select {
		case <-d.events:
		default:
			return
		}
	}
}

// nextApplied returns the first record of a change applied because of
// Consul and not older than since, waiting up to timeout. Applies for
// other reasons (a drain that finished) are skipped.
func (d *discoveryRun) nextApplied(ctx context.Context, since time.Time, timeout time.Duration) (applied, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev := <-d.events:
			if !ev.at.Before(since) && strings.Contains(ev.why, "consul") {
				return ev, nil
			}
		case <-d.p.done:
			return applied{}, d.p.alive()
		case <-t.C:
			return applied{}, fmt.Errorf("no record of the change applied in seamless's log within %v", timeout)
		case <-ctx.Done():
			return applied{}, ctx.Err()
		}
	}
}

// waitReady waits until /readyz answers 200: every source answered and a
// complete configuration runs.
func (d *discoveryRun) waitReady(ctx context.Context, timeout time.Duration) error {
	err := poll(ctx, 20*time.Millisecond, timeout, "seamless /readyz", func() (bool, error) {
		if err := d.p.alive(); err != nil {
			return false, err
		}
		code, body, err := getHTTP(ctx, "http://"+d.status+"/readyz")
		if err != nil {
			return false, err
		}
		if code != http.StatusOK {
			return false, fmt.Errorf("/readyz answered %d: %.80q", code, body)
		}
		return true, nil
	})
	return d.withLog(err)
}

// metric sums the samples of name in seamless's /metrics whose labels
// include match.
func (d *discoveryRun) metric(ctx context.Context, name string, match map[string]string) (float64, error) {
	code, body, err := getHTTP(ctx, "http://"+d.status+"/metrics")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("/metrics answered %d", code)
	}
	return metricSum(body, name, match)
}

// reloads is seamless_reloads_total: confirmed, and every other result.
func (d *discoveryRun) reloads(ctx context.Context) (ok, other float64, err error) {
	return reloadCounts(ctx, d.status)
}

// memory reads seamless's VmRSS and VmHWM (its peak) from /proc.
func (d *discoveryRun) memory() (rss, peak int64, err error) {
	return procMemory(d.p.pid())
}

// stop stops seamless (HAProxy with it) and waits for its output to end.
func (d *discoveryRun) stop() error {
	if d.p == nil {
		return nil
	}
	err := d.p.stop(syscall.SIGTERM, stopGrace)
	select {
	case <-d.readerDone:
	case <-time.After(5 * time.Second):
		// Something it started still holds the pipe; the sweep at the end
		// kills it.
		d.pipe.Close()
	}
	return err
}

// logSummary says how many warnings and errors seamless logged.
func (d *discoveryRun) logSummary() string {
	s := fmt.Sprintf("%d warnings, %d errors", d.warns.Load(), d.errs.Load())
	if p := d.firstErr.Load(); p != nil {
		s += fmt.Sprintf(" (first: %q)", *p)
	}
	return s + fmt.Sprintf("; HAProxy's output: %d lines, %d [ALERT]", d.haproxy.Load(), d.alerts.Load())
}

func (d *discoveryRun) withLog(err error) error {
	if err == nil {
		return nil
	}
	if t := tail(d.logPath, 10); t != "" {
		return fmt.Errorf("%w\n--- %s (last lines)\n%s", err, d.logPath, t)
	}
	return err
}

// benchRoot makes the private directory of a benchmark. cleanup kills what
// is left of the processes started under it (all name it in their command
// line) and removes it, unless keep, when its logs are worth a look.
// inBenchDir runs body with a logger, the whole-run time limit and a fresh
// directory, removed afterwards unless keep is set or body failed (other
// than by running out of time): its logs and configurations then stay.
func inBenchDir(ctx context.Context, timeout time.Duration, keep bool, stderr io.Writer,
	body func(ctx context.Context, log *slog.Logger, root string) int) int {
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "bench")
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	root, cleanup, err := benchRoot(log)
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
		return 1
	}
	code := body(ctx, log, root)
	cleanup(keep || (code != 0 && ctx.Err() == nil))
	return code
}

func benchRoot(log *slog.Logger) (root string, cleanup func(keep bool), err error) {
	root, err = os.MkdirTemp("", "seamless-bench-")
	if err != nil {
		return "", nil, err
	}
	return root, func(keep bool) {
		for _, pid := range procfs.Mentioning(root) {
			log.Warn("killing leftover process", "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if keep {
			log.Info("keeping the run's files", "dir", root)
			return
		}
		os.RemoveAll(root)
	}, nil
}

// seamlessDefaults runs `seamless env` and returns every variable's
// default, so that the benchmark knows what a seamless binary does without
// being told (SEAMLESS_SERVER_SLOTS, for one, is newer than others).
func seamlessDefaults(ctx context.Context, bin string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "env")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SEAMLESS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s env: %w", bin, err)
	}
	defaults := map[string]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[0], "SEAMLESS_") {
			continue
		}
		if f[2] == `""` {
			f[2] = ""
		}
		defaults[f[0]] = f[2]
	}
	if _, ok := defaults["SEAMLESS_WAIT"]; !ok {
		return nil, fmt.Errorf("%s env: no SEAMLESS_WAIT in its output; is it seamless?", bin)
	}
	return defaults, nil
}

// freeAddrs returns n distinct loopback addresses whose ports were free a
// moment ago (freeport.Get: below the ephemeral range, so that HAProxy's
// health checks cannot take one as a source port, and never one twice).
func freeAddrs(n int) ([]string, error) {
	ports, err := freeport.Get(n)
	if err != nil {
		return nil, err
	}
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return addrs, nil
}
