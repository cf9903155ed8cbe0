package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/consulproc"
)

// `seamless-bench scale`: what a large catalog costs. For each -services
// count, a fresh Consul server gets services × instances registered in
// bulk (transactions), each service with its own host tag; then:
//
//	render      the built-in template for that catalog, in this process
//	            (routes.New(...).Render on model.NewState), median of -renders
//	haproxy -c  on that configuration, as seamless validates a candidate
//	apply       seamless (built-in template, SEAMLESS_WAIT as given) runs
//	            it; -changes times one instance of the middle service turns
//	            critical, then passing again: from the Consul write to the
//	            change served (polled through HAProxy) and to seamless's
//	            record of it applied (over the runtime API or with a reload)
//	RSS         seamless's VmRSS once the catalog is loaded, and after the
//	            changes; VmHWM is its peak
//	requests    seamless_consul_requests_total per change
//
// The in-process render uses the options seamless renders with (its
// defaults from `seamless env`, and what the row sets), and is compared
// with the haproxy.cfg seamless wrote. Rows repeat for each -slots value:
// with server slots a change goes over the runtime API, with 0 it reloads.
// Every instance is at 127.0.0.1 on one of -instances named backends, so
// that HAProxy's health checks pass. The smaller counts show what grows
// with the catalog and what does not.

type scaleOptions struct {
	keep                      bool
	seamless, haproxy, consul string
	services                  []int
	instances, nodes          int
	changes, renders, checks  int
	wait, slots               string // flag values, parsed against the binary's defaults
	env                       envFlag
	every, gap                time.Duration
	changeTimeout, timeout    time.Duration
	rssTarget                 int64
	renderTarget              time.Duration
}

type scaleResult struct {
	l           layout
	slots, wait variant
	cfgBytes    int
	register    time.Duration
	render      []time.Duration
	renderAlloc uint64
	check       []time.Duration
	ready       time.Duration // seamless started → /readyz
	same        string        // seamless's haproxy.cfg against the in-process render
	served      []time.Duration
	appliedAt   []time.Duration // write → the "applied" record
	pipeline    []time.Duration // the record's duration
	reload      []time.Duration // the reload alone, where there was one
	runtime     int             // changes applied over the runtime API
	rssLoaded   int64
	rssAfter    int64
	peak        int64
	heapLoaded  float64
	heapAfter   float64
	requests    float64 // Consul requests over the changes
	asked       int
	logs        string
	err         error
}

func runScale(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseScaleFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench scale: %v\n", err)
		return 2
	}
	return inBenchDir(ctx, o.timeout, o.keep, stderr, func(ctx context.Context, log *slog.Logger, root string) int {

		names := make([]string, o.instances)
		for j := range names {
			names[j] = "i" + strconv.Itoa(j)
		}
		backends, err := startNamedBackends(names...)
		if err != nil {
			fmt.Fprintf(stderr, "seamless-bench: backends: %v\n", err)
			return 1
		}
		defer backends.stop()
		ports := make([]int, len(names))
		for j, n := range names {
			ports[j] = backends.ports[n]
		}
		defaults, err := seamlessDefaults(ctx, o.seamless)
		if err != nil {
			fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
			return 1
		}
		waits, err1 := parseVariants("SEAMLESS_WAIT", o.wait, defaults)
		slots, err2 := parseVariants("SEAMLESS_SERVER_SLOTS", o.slots, defaults)
		if err := errors.Join(err1, err2); err != nil {
			fmt.Fprintf(stderr, "seamless-bench scale: %v\n", err)
			return 2
		}
		var results []scaleResult
		for _, sl := range slots {
			for _, n := range o.services {
				if ctx.Err() != nil {
					break
				}
				res := scaleResult{l: layout{services: n, instances: o.instances, nodes: o.nodes, ports: ports},
					slots: sl, wait: waits[0]}
				dir := filepath.Join(root, fmt.Sprintf("s%d", len(results)+1))
				r := scaleRow(ctx, log.With("run", filepath.Base(dir), "services", n, "slots", sl.label()), o, dir, defaults, res)
				if r.err != nil {
					log.Error("run failed", "services", n, "slots", sl.label(), "err", r.err)
				}
				results = append(results, r)
			}
		}
		printScaleTable(stdout, o, results)
		if ctx.Err() != nil || slices.ContainsFunc(results, func(r scaleResult) bool { return r.err != nil }) {
			return 1
		}
		return 0
	})
}

func parseScaleFlags(args []string, stderr io.Writer) (scaleOptions, error) {
	fs := flag.NewFlagSet("seamless-bench scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o scaleOptions
	var services string
	var rssMiB int
	fs.StringVar(&o.seamless, "seamless", "", "path to the seamless binary (required)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "HAProxy binary")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (logs, configurations) also after a successful run")
	fs.StringVar(&o.consul, "consul", consulproc.DefaultBin(), "Consul agent binary")
	fs.StringVar(&services, "services", "100,1000", "service counts, one row each (a fresh Consul per row)")
	fs.IntVar(&o.instances, "instances", 10, "instances per service")
	fs.IntVar(&o.nodes, "nodes", 100, "Consul nodes the instances are spread over")
	fs.IntVar(&o.changes, "changes", 10, "changes per row (one instance critical, then passing again, ...)")
	fs.IntVar(&o.renders, "renders", 9, "in-process renders timed per row")
	fs.IntVar(&o.checks, "checks", 3, "haproxy -c runs timed per row")
	fs.Var(&o.env, "env", "a further SEAMLESS_* variable, or GOGC, GOMEMLIMIT or GOMAXPROCS, for seamless alone, `NAME=VALUE` (repeatable), e.g. SEAMLESS_LOG_LEVEL=debug")
	fs.StringVar(&o.wait, "wait", "default", "SEAMLESS_WAIT for seamless (\"default\": the binary's own)")
	fs.StringVar(&o.slots, "slots", "default,0", "SEAMLESS_SERVER_SLOTS values, one set of rows each (\"default\": the binary's own; 0 reloads for every change)")
	fs.DurationVar(&o.every, "poll", 2*time.Millisecond, "interval of the probes through HAProxy")
	fs.DurationVar(&o.gap, "gap", time.Second, "pause after a change has applied, before the next")
	fs.DurationVar(&o.changeTimeout, "change-timeout", 30*time.Second, "time limit for one change to be served")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "time limit for the whole benchmark")
	fs.IntVar(&rssMiB, "rss-target", 64, "RSS target in MiB, reported against")
	fs.DurationVar(&o.renderTarget, "render-target", 50*time.Millisecond, "render time target, reported against")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.rssTarget = int64(rssMiB) << 20
	for s := range strings.SplitSeq(services, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 100_000 {
			return o, fmt.Errorf("-services: %q is not a count from 1 to 100000", s)
		}
		o.services = append(o.services, n)
	}
	switch {
	case o.instances < 1 || o.instances > 100:
		return o, errors.New("-instances must be 1 to 100")
	case o.nodes < 1 || o.nodes > 10_000:
		return o, errors.New("-nodes must be 1 to 10000")
	case o.changes < 1 || o.renders < 1 || o.checks < 1:
		return o, errors.New("-changes, -renders and -checks must be >= 1")
	case o.every <= 0 || o.gap < 0 || o.changeTimeout <= 0 || o.timeout <= 0:
		return o, errors.New("-poll, -change-timeout and -timeout must be > 0, -gap >= 0")
	case strings.Contains(o.wait, ","):
		return o, errors.New("-wait takes one value")
	}
	var err error
	if o.haproxy, err = exec.LookPath(o.haproxy); err != nil {
		return o, fmt.Errorf("-haproxy: %w", err)
	}
	if o.seamless, err = absBinary("-seamless", o.seamless); err != nil {
		return o, err
	}
	return o, nil
}

// loadTimeout bounds registering a catalog and seamless's start on it.
const loadTimeout = 5 * time.Minute

func scaleRow(ctx context.Context, log *slog.Logger, o scaleOptions, dir string, defaults map[string]string, row scaleResult) (res scaleResult) {
	res = row
	l := res.l
	if err := os.MkdirAll(filepath.Join(dir, "consul"), 0o755); err != nil {
		res.err = err
		return res
	}
	agent, err := consulproc.Start(ctx, consulproc.Options{Bin: o.consul, Dir: filepath.Join(dir, "consul")})
	if err != nil {
		res.err = err
		return res
	}
	defer func() {
		if err := agent.Stop(); err != nil {
			log.Warn("stopping consul", "err", err)
		}
	}()
	client, err := agent.Client()
	if err != nil {
		res.err = err
		return res
	}
	rctx, cancel := context.WithTimeout(ctx, loadTimeout)
	t0 := time.Now()
	err = registerAll(rctx, client, l.ops(), l.nodes)
	cancel()
	if err != nil {
		res.err = err
		return res
	}
	res.register = time.Since(t0)
	log.Info("catalog registered", "instances", l.services*l.instances, "took", res.register.Round(time.Millisecond))

	// Render and validate before seamless runs, on a quiet machine, with
	// the options seamless will render with.
	addrs, err := freeAddrs(3)
	if err != nil {
		res.err = err
		return res
	}
	env := rowEnv(o.env, res.slots, res.wait)
	ropts, err := routesOptions(defaults, env, addrs[0], addrs[1], filepath.Join(dir, "state"))
	if err != nil {
		res.err = err
		return res
	}
	cfg, ds, alloc, err := renderTiming(l.catalog(), ropts, o.renders)
	if err != nil {
		res.err = err
		return res
	}
	res.cfgBytes, res.render, res.renderAlloc = len(cfg), ds, alloc
	if res.check, err = checkTiming(ctx, o.haproxy, dir, cfg, o.checks); err != nil {
		res.err = err
		return res
	}
	p50, _ := percentile(res.render, 50)
	c50, _ := percentile(res.check, 50)
	log.Info("rendered and checked", "bytes", len(cfg), "render_p50", p50, "check_p50", c50)

	d, err := startDiscovery(discoveryOpts{seamless: o.seamless, haproxy: o.haproxy, consul: agent.Addr(),
		dir: dir, addrs: addrs, env: env})
	if err != nil {
		res.err = err
		return res
	}
	defer func() {
		res.logs = d.logSummary()
		if err := d.stop(); err != nil {
			res.err = errors.Join(res.err, err)
		}
	}()
	started := time.Now()
	if err := d.waitReady(ctx, loadTimeout); err != nil {
		res.err = err
		return res
	}
	res.ready = time.Since(started)
	if err := scaleLoaded(ctx, d, &res, cfg); err != nil {
		res.err = err
		return res
	}
	log.Info("seamless ready", "took", res.ready.Round(time.Millisecond), "rss", fmtMiB(res.rssLoaded), "config", res.same)

	before, err := d.metric(ctx, "seamless_consul_requests_total", nil)
	if err != nil {
		res.err = err
		return res
	}
	if err := scaleChanges(ctx, log, o, d, client, &res); err != nil {
		res.err = err
		return res
	}
	// The watch has re-issued its blocking query after the last change
	// (it waits 100 ms between requests) well within this pause.
	if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
		res.err = err
		return res
	}
	after, err := d.metric(ctx, "seamless_consul_requests_total", nil)
	if err != nil {
		res.err = err
		return res
	}
	res.requests = after - before
	if res.rssAfter, res.peak, err = d.memory(); err != nil {
		res.err = err
		return res
	}
	res.heapAfter, _ = d.metric(ctx, "go_memstats_heap_inuse_bytes", nil)
	return res
}

// scaleLoaded checks that seamless serves the catalog and runs what this
// process rendered, then reads its memory once the start-up has settled.
func scaleLoaded(ctx context.Context, d *discoveryRun, res *scaleResult, cfg []byte) error {
	host := res.l.host(res.l.services / 2)
	if err := poll(ctx, 10*time.Millisecond, readyTimeout, "frontend serves "+host, func() (bool, error) {
		code, body, err := probe(ctx, d.http, host)
		return err == nil && code == 200 && strings.HasPrefix(body, "i"), err
	}); err != nil {
		return d.withLog(err)
	}
	running, err := os.ReadFile(filepath.Join(d.stateDir, "haproxy.cfg"))
	switch {
	case err != nil:
		return err
	case bytes.Equal(running, cfg):
		res.same = "identical"
	default:
		res.same = fmt.Sprintf("DIFFERS (%d bytes vs %d in-process)", len(running), len(cfg))
	}
	// Start-up garbage is collected within a couple of GC cycles; the
	// pause paces the reading, it waits for nothing in particular.
	if err := sleepUntil(ctx, time.Now().Add(2*time.Second)); err != nil {
		return err
	}
	if res.rssLoaded, _, err = d.memory(); err != nil {
		return err
	}
	res.heapLoaded, _ = d.metric(ctx, "go_memstats_heap_inuse_bytes", nil)
	return nil
}

// scaleChanges turns instance 0 of the middle service critical and passing
// again in turn. Served means: passing, the first answer from i0; critical,
// as many answers in a row without i0 as the service has instances (round
// robin would have sent one of them to i0), timed at the last of them, so
// up to instances-1 probes late.
func scaleChanges(ctx context.Context, log *slog.Logger, o scaleOptions, d *discoveryRun, c *api.Client, res *scaleResult) error {
	l := res.l
	svc := l.services / 2
	host := l.host(svc)
	for i := range o.changes {
		status := api.HealthCritical
		if i%2 == 1 {
			status = api.HealthPassing
		}
		d.drainEvents()
		written := time.Now() // see propagationRow
		chk := l.check(svc, 0, status)
		tx, resp, _, err := c.Txn().Txn(api.TxnOps{{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: chk}}},
			(&api.QueryOptions{}).WithContext(ctx))
		if err == nil && !tx {
			err = rolledBack(resp)
		}
		if err != nil {
			return fmt.Errorf("change %d: consul write: %w", i+1, err)
		}
		t0 := time.Now()
		res.asked++
		without := 0
		at, _, err := pollUntil(ctx, d.http, host, o.every, t0.Add(o.changeTimeout), func(code int, body string) verdict {
			switch {
			case code != 200 || !strings.HasPrefix(body, "i"):
				without = 0
				return stray
			case status == api.HealthPassing:
				if body == "i0" {
					return reflected
				}
			case body == "i0":
				without = 0
			default:
				if without++; without >= l.instances {
					return reflected
				}
			}
			return pending
		})
		if err != nil {
			return d.withLog(fmt.Errorf("change %d (%s): %w", i+1, status, err))
		}
		res.served = append(res.served, at.Sub(t0))
		ev, err := d.nextApplied(ctx, written, o.changeTimeout)
		if err != nil {
			return d.withLog(fmt.Errorf("change %d: %w", i+1, err))
		}
		res.appliedAt = append(res.appliedAt, ev.at.Sub(t0))
		res.pipeline = append(res.pipeline, ev.duration)
		if ev.runtime {
			res.runtime++
		}
		if ev.reload >= 0 {
			res.reload = append(res.reload, ev.reload)
		}
		log.Info("change", "n", i+1, "status", status, "served", at.Sub(t0).Round(time.Millisecond),
			"applied", ev.at.Sub(t0).Round(time.Millisecond), "runtime", ev.runtime, "apply_duration", ev.duration)
		if err := sleepUntil(ctx, time.Now().Add(o.gap)); err != nil {
			return err
		}
	}
	return nil
}
