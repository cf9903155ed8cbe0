// Command seamless-bench measures what reloading HAProxy costs the clients,
// and what discovery costs.
//
//	seamless-bench reload [flags]        reloads under load, four ways
//	seamless-bench propagation [flags]   Consul change → first request served accordingly
//	seamless-bench scale [flags]         1,000 services × 10 instances: render, haproxy -c,
//	                                     apply, RSS, Consul requests per change
//	seamless-bench peer [flags]          side by side with consul-template: change →
//	                                     rendered file (and served), Consul bytes and
//	                                     CPU per change, RSS
//	seamless-bench tls [flags]           HTTPS handshakes and requests while a
//	                                     certificate rotates, with and without reloads
//	seamless-bench soak [flags]          one seamless under continuous churn for
//	                                     -duration: leaks, lost requests, final config
//
// The discovery benchmarks are described in propagation.go, scale.go and
// peer.go, the TLS one in tls.go, the soak in soak.go.
//
// `reload`:
//
// It starts a small HTTP backend on 127.0.0.1, puts HAProxy in front of it
// in each chosen scenario and, while a bounded load runs through HAProxy,
// reloads it -reloads times, one request at least -interval after the
// previous and only once the previous has completed:
//
//	a  seamless: `seamless haproxy -f CFG`, reloaded by SIGHUP
//	b  master-worker as in the official image: `haproxy -W -db -S SOCK`, SIGUSR2
//	c  legacy daemons: `haproxy -D -p PIDFILE ... -sf PIDS`
//	d  hard restart: SIGTERM, wait for exit, start again
//
// Every other reload changes the config file. Each scenario runs once per
// client mode (a new connection per request, or keep-alive connections that
// never retry), and one table compares failed requests and reload latency.
// Progress goes to stderr, the table to stdout. All traffic stays on
// 127.0.0.1, and every process started is stopped at the end, also on
// ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/procfs"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) >= 2 {
		switch args[1] {
		case "reload":
			return runReload(ctx, args, stdout, stderr)
		case "propagation":
			return runPropagation(ctx, args[2:], stdout, stderr)
		case "scale":
			return runScale(ctx, args[2:], stdout, stderr)
		case "peer":
			return runPeer(ctx, args[2:], stdout, stderr)
		case "tls":
			return runTLS(ctx, args[2:], stdout, stderr)
		case "soak":
			return runSoak(ctx, args[2:], stdout, stderr)
		}
	}
	name := filepath.Base(args[0])
	fmt.Fprintf(stderr, "usage: %s reload|propagation|scale|peer|tls|soak [flags]  (see %s COMMAND -h)\n", name, name)
	return 2
}

func runReload(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args[2:], stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "bench")

	root, err := os.MkdirTemp("", "seamless-bench-")
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
		return 1
	}
	failed := false
	defer func() {
		// Last resort: every process we started names root in its command
		// line; one still running here was leaked by a scenario (or by
		// the seamless under test) and is reported and killed.
		for _, pid := range procfs.Mentioning(root) {
			log.Warn("killing leftover process", "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// Keep the configs and process logs of failed runs for a look.
		if failed {
			log.Info("keeping files of failed runs", "dir", root)
			return
		}
		os.RemoveAll(root)
	}()
	backend, stopBackend, err := startBackend()
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench: backend: %v\n", err)
		return 1
	}
	defer stopBackend()
	log.Info("backend listening", "addr", backend)

	// Whichever run comes first was measured up to 1.5x slower (cold
	// caches, the load generator's and the backend's first connections),
	// so a short unmeasured run of the first scenario goes before them.
	if o.warmup > 0 && len(o.scenarios) > 0 && len(o.modes) > 0 {
		w := o
		w.reloads = o.warmup
		log.Info("warming up", "run", o.scenarios[0].key+"-"+o.modes[0].String(), "reloads", w.reloads)
		wroot := filepath.Join(root, "warmup")
		if err := os.Mkdir(wroot, 0o755); err != nil {
			fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
			return 1
		}
		if r := runOne(ctx, log, w, wroot, backend, o.scenarios[0], o.modes[0]); r.err != nil {
			log.Warn("warm-up failed", "err", r.err)
		}
	}

	var results []runResult
	for _, spec := range o.scenarios {
		for _, mode := range o.modes {
			if ctx.Err() != nil {
				break
			}
			r := runOne(ctx, log, o, root, backend, spec, mode)
			if r.err != nil {
				log.Error("run failed", "run", spec.key+"-"+mode.String(), "err", r.err)
			}
			results = append(results, r)
		}
	}
	printTable(stdout, results)
	for _, r := range results {
		// An interrupted run is not worth keeping files for.
		failed = failed || (r.err != nil && ctx.Err() == nil)
	}
	if failed || ctx.Err() != nil {
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("seamless-bench reload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var modes, scenarios string
	fs.StringVar(&o.seamless, "seamless", "", "path to the seamless binary (required for scenario a)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "HAProxy binary")
	fs.IntVar(&o.reloads, "reloads", 200, "reloads per scenario and client mode")
	fs.DurationVar(&o.interval, "interval", 50*time.Millisecond, "minimum time between reload requests")
	fs.IntVar(&o.workers, "workers", 32, "concurrent clients")
	fs.IntVar(&o.warmup, "warmup", 20, "reloads of an unmeasured warm-up run before the first scenario (0: none)")
	fs.StringVar(&modes, "mode", "both", "client mode: both, newconn or keepalive")
	fs.StringVar(&scenarios, "scenarios", "a,b,c,d", "scenarios to run, comma-separated (a seamless, b master-worker, c legacy -sf, d hard restart)")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "time limit per scenario and client mode")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.reloads < 1 || o.warmup < 0 || o.workers < 1 || o.interval < 0 || o.timeout <= 0 {
		return o, errors.New("-reloads and -workers must be >= 1, -interval >= 0, -timeout > 0")
	}
	switch modes {
	case "both":
		o.modes = []loadgen.Mode{loadgen.NewConn, loadgen.KeepAlive}
	case "newconn":
		o.modes = []loadgen.Mode{loadgen.NewConn}
	case "keepalive":
		o.modes = []loadgen.Mode{loadgen.KeepAlive}
	default:
		return o, fmt.Errorf("-mode %q: want both, newconn or keepalive", modes)
	}
	for key := range strings.SplitSeq(scenarios, ",") {
		key = strings.TrimSpace(key)
		i := -1
		for j, s := range allScenarios {
			if s.key == key {
				i = j
			}
		}
		if i < 0 {
			return o, fmt.Errorf("-scenarios: unknown scenario %q (want a, b, c or d)", key)
		}
		o.scenarios = append(o.scenarios, allScenarios[i])
	}
	var err error
	if o.haproxy, err = exec.LookPath(o.haproxy); err != nil {
		return o, fmt.Errorf("-haproxy: %w", err)
	}
	for _, s := range o.scenarios {
		if s.key != "a" {
			continue
		}
		if o.seamless == "" {
			return o, errors.New("scenario a needs -seamless PATH (or choose -scenarios b,c,d)")
		}
		if o.seamless, err = exec.LookPath(o.seamless); err != nil {
			return o, fmt.Errorf("-seamless: %w", err)
		}
		if o.seamless, err = filepath.Abs(o.seamless); err != nil {
			return o, err
		}
	}
	return o, nil
}

// printTable writes one row per run, then the failure classes and errors.
func printTable(w io.Writer, results []runResult) {
	rows := [][]string{{"scenario", "client", "requests", "failed", "failed %", "reloads done", "reload p50", "reload p99"}}
	for _, r := range results {
		pct := 0.0
		if r.load.Requests > 0 {
			pct = 100 * float64(r.load.Failed) / float64(r.load.Requests)
		}
		rows = append(rows, []string{
			r.scenario, r.mode.String(),
			fmt.Sprint(r.load.Requests), fmt.Sprint(r.load.Failed), fmt.Sprintf("%.3f%%", pct),
			fmt.Sprintf("%d/%d", len(r.lat), r.asked),
			fmtPercentile(r.lat, 50), fmtPercentile(r.lat, 99),
		})
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, cell := range row {
			// Names left-aligned, numbers right-aligned.
			if i < 2 {
				cells[i] = fmt.Sprintf("%-*s", widths[i], cell)
			} else {
				cells[i] = fmt.Sprintf("%*s", widths[i], cell)
			}
		}
		fmt.Fprintln(w, strings.Join(cells, " | "))
	}
	for _, r := range results {
		if len(r.load.Errors) > 0 {
			fmt.Fprintf(w, "%s / %s failures: %s\n", r.scenario, r.mode, errorSummary(r.load.Errors))
		}
		if r.err != nil {
			first, _, _ := strings.Cut(r.err.Error(), "\n")
			fmt.Fprintf(w, "%s / %s error: %s\n", r.scenario, r.mode, first)
		}
	}
}

func fmtPercentile(ds []time.Duration, p float64) string {
	d, ok := percentile(ds, p)
	if !ok {
		return "-"
	}
	return d.Round(10 * time.Microsecond).String()
}
