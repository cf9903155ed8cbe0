package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/consulproc"
)

// `seamless-bench propagation`: how long a change in Consul takes to reach
// the clients. A real Consul server, seamless (built-in template) and
// three backends registered as external nodes of service "web" with the
// tag seamless.http.host=127.0.0.1: alpha and beta, which the changes
// flip, and gamma, always critical, which keeps the service (its route and
// backend) in the catalog whatever the others do. Each change flips alpha
// or beta, in the cycle
//
//	alpha only → none → beta only → none → alpha only
//
// so that every change makes HAProxy answer something the previous
// configuration could not (a 503 when no instance passes, else the name of
// the one that does), and a single response proves the new configuration
// serves. Latency runs from the return of the Consul write to the first
// response that reflects it, polled every -poll with a new connection. A
// change is a check turning critical or passing (-kinds health) or the
// instance's node being deregistered or registered (register).
//
// Each row is one kind of change, SEAMLESS_SERVER_SLOTS (-slots: the
// default applies membership over the runtime API, 0 reloads for every
// change) and SEAMLESS_WAIT (-waits), with a fresh seamless. The next
// change is written once seamless has logged the previous one as applied,
// plus a pause.

type propOptions struct {
	keep                      bool
	seamless, haproxy, consul string
	changes                   int
	waits, slots              string // flag values, parsed against the binary's defaults
	env                       envFlag
	kinds                     []string
	every                     time.Duration
	gap                       time.Duration
	changeTimeout             time.Duration
	timeout                   time.Duration
	target                    time.Duration
}

// propRow is what a row runs with.
type propRow struct {
	kind        string // "health", "register"
	slots, wait variant
}

// propResult is one row of the table.
type propResult struct {
	propRow
	lat        []time.Duration // write → first response reflecting it
	pipeline   []time.Duration // the durations of seamless's "applied" records
	reload     []time.Duration // the reloads alone, where there were
	runtime    int             // changes applied over the runtime API
	asked      int
	reloadsOK  float64 // seamless_reloads_total over the row
	reloadsBad float64
	pollErrors int // probes that failed or answered neither old nor new
	logs       string
	err        error
}

func runPropagation(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parsePropFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench propagation: %v\n", err)
		return 2
	}
	return inBenchDir(ctx, o.timeout, o.keep, stderr, func(ctx context.Context, log *slog.Logger, root string) int {

		backends, err := startNamedBackends("alpha", "beta", "gamma")
		if err != nil {
			fmt.Fprintf(stderr, "seamless-bench: backends: %v\n", err)
			return 1
		}
		defer backends.stop()
		if err := os.Mkdir(filepath.Join(root, "consul"), 0o755); err != nil {
			fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
			return 1
		}
		log.Info("starting consul", "bin", o.consul)
		agent, err := consulproc.Start(ctx, consulproc.Options{Bin: o.consul, Dir: filepath.Join(root, "consul")})
		if err != nil {
			fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
			return 1
		}
		defer func() {
			if err := agent.Stop(); err != nil {
				log.Warn("stopping consul", "err", err)
			}
		}()
		client, err := agent.Client()
		if err != nil {
			fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
			return 1
		}

		defaults, err := seamlessDefaults(ctx, o.seamless)
		if err != nil {
			fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
			return 1
		}
		waits, err1 := parseVariants("SEAMLESS_WAIT", o.waits, defaults)
		slots, err2 := parseVariants("SEAMLESS_SERVER_SLOTS", o.slots, defaults)
		if err := errors.Join(err1, err2); err != nil {
			fmt.Fprintf(stderr, "seamless-bench propagation: %v\n", err)
			return 2
		}
		var results []propResult
		for _, kind := range o.kinds {
			for _, sl := range slots {
				for _, w := range waits {
					if ctx.Err() != nil {
						break
					}
					row := propRow{kind: kind, slots: sl, wait: w}
					f := &flipper{c: client, kind: kind, ports: backends.ports}
					r := propagationRow(ctx, log, o, filepath.Join(root, fmt.Sprintf("p%d", len(results)+1)), agent.Addr(), f, row)
					if r.err != nil {
						log.Error("run failed", "kind", kind, "slots", sl.label(), "wait", w.label(), "err", r.err)
					}
					results = append(results, r)
				}
			}
		}
		printPropTable(stdout, o, results)
		if ctx.Err() != nil || slices.ContainsFunc(results, func(r propResult) bool { return r.err != nil }) {
			return 1
		}
		return 0
	})
}

func parsePropFlags(args []string, stderr io.Writer) (propOptions, error) {
	fs := flag.NewFlagSet("seamless-bench propagation", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o propOptions
	var kinds string
	fs.StringVar(&o.seamless, "seamless", "", "path to the seamless binary (required)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "HAProxy binary")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (logs, configurations) also after a successful run")
	fs.StringVar(&o.consul, "consul", consulproc.DefaultBin(), "Consul agent binary")
	fs.IntVar(&o.changes, "changes", 100, "changes per row (p99 of 100 is the second slowest; of 50 or fewer, the slowest)")
	fs.Var(&o.env, "env", "a further SEAMLESS_* variable, or GOGC, GOMEMLIMIT or GOMAXPROCS, for seamless alone, `NAME=VALUE` (repeatable), e.g. SEAMLESS_LOG_LEVEL=debug")
	fs.StringVar(&o.waits, "waits", "default,0", "SEAMLESS_WAIT values, one row each (\"default\": the binary's own)")
	fs.StringVar(&o.slots, "slots", "default,0", "SEAMLESS_SERVER_SLOTS values, one row each (\"default\": the binary's own; 0 reloads for every change)")
	fs.StringVar(&kinds, "kinds", "health,register", "kinds of change: health (check passing/critical), register (register/deregister the node)")
	fs.DurationVar(&o.every, "poll", 2*time.Millisecond, "interval of the probes through HAProxy")
	fs.DurationVar(&o.gap, "gap", 300*time.Millisecond, "pause after a change has applied, before the next (plus up to half of it at random)")
	fs.DurationVar(&o.changeTimeout, "change-timeout", 15*time.Second, "time limit for one change to be served")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "time limit for the whole benchmark")
	fs.DurationVar(&o.target, "target", 250*time.Millisecond, "p99 to report against for SEAMLESS_WAIT=0")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.changes < 1 || o.every <= 0 || o.gap < 0 || o.changeTimeout <= 0 || o.timeout <= 0 {
		return o, errors.New("-changes must be >= 1, -poll, -change-timeout and -timeout > 0, -gap >= 0")
	}
	for k := range strings.SplitSeq(kinds, ",") {
		k = strings.TrimSpace(k)
		if k != "health" && k != "register" {
			return o, fmt.Errorf("-kinds: unknown kind %q (want health or register)", k)
		}
		o.kinds = append(o.kinds, k)
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

// absBinary resolves a required binary to an absolute path.
func absBinary(flagName, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%s PATH is required (make build: bin/seamless)", flagName)
	}
	p, err := exec.LookPath(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	return filepath.Abs(p)
}

// flipper writes the changes: one Consul write each.
type flipper struct {
	c     *api.Client
	kind  string
	ports map[string]int
	// passing is the state the last write left.
	passing map[string]bool
}

// set makes instance name passing or not: its check's status (health), or
// its node registered or gone (register).
func (f *flipper) set(ctx context.Context, name string, passing bool) error {
	if f.passing == nil {
		f.passing = map[string]bool{}
	}
	f.passing[name] = passing
	if f.kind == "register" && !passing {
		_, err := f.c.Catalog().Deregister(&api.CatalogDeregistration{Node: "node-" + name},
			(&api.WriteOptions{}).WithContext(ctx))
		return err
	}
	status := api.HealthPassing
	if !passing {
		status = api.HealthCritical
	}
	return f.register(ctx, name, status)
}

// register registers instance name of "web" with a check in status, as
// consul-esm registers external services: the node, the service and its
// check in one catalog write.
func (f *flipper) register(ctx context.Context, name, status string) error {
	node := "node-" + name
	_, err := f.c.Catalog().Register(&api.CatalogRegistration{
		Node: node, Address: "127.0.0.1",
		Service: &api.AgentService{ID: name, Service: "web", Address: "127.0.0.1", Port: f.ports[name],
			Tags: []string{"seamless.http.host=127.0.0.1"}},
		Check: &api.AgentCheck{Node: node, CheckID: "service:" + name, Name: "http", Status: status,
			ServiceID: name, ServiceName: "web"},
	}, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

// expect is what HAProxy answers in the flipper's state: the name of the
// one passing instance, or "503" when none passes (gamma never does).
func (f *flipper) expect() string {
	var up []string
	for _, n := range []string{"alpha", "beta"} {
		if f.passing[n] {
			up = append(up, n)
		}
	}
	switch len(up) {
	case 0:
		return "503"
	case 1:
		return up[0]
	}
	panic("both instances pass: the cycle lost its way")
}

// cycle is the order of the instances flipped: every change leaves at most
// one instance passing.
var cycle = []string{"alpha", "beta", "beta", "alpha"}

func propagationRow(ctx context.Context, log *slog.Logger, o propOptions, dir, consulAddr string, f *flipper, row propRow) (res propResult) {
	res = propResult{propRow: row}
	log = log.With("run", filepath.Base(dir), "kind", row.kind, "slots", row.slots.label(), "wait", row.wait.label())
	if err := os.Mkdir(dir, 0o755); err != nil {
		res.err = err
		return res
	}
	// The state every row starts from, written before seamless starts.
	for _, st := range []struct {
		name    string
		passing bool
	}{{"alpha", true}, {"beta", false}} {
		if err := f.set(ctx, st.name, st.passing); err != nil {
			res.err = err
			return res
		}
	}
	if err := f.register(ctx, "gamma", api.HealthCritical); err != nil {
		res.err = err
		return res
	}
	addrs, err := freeAddrs(3)
	if err != nil {
		res.err = err
		return res
	}
	d, err := startDiscovery(discoveryOpts{seamless: o.seamless, haproxy: o.haproxy, consul: consulAddr,
		dir: dir, addrs: addrs, env: rowEnv(o.env, row.slots, row.wait)})
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
	log.Info("starting seamless", "http", d.http, "dir", dir)
	if err := d.waitReady(ctx, readyTimeout); err != nil {
		res.err = err
		return res
	}
	if err := waitAnswer(ctx, d.http, f.expect(), readyTimeout); err != nil {
		res.err = d.withLog(err)
		return res
	}
	ok0, bad0, err := d.reloads(ctx)
	if err != nil {
		res.err = err
		return res
	}
	defer func() {
		if ok, bad, err := d.reloads(context.WithoutCancel(ctx)); err == nil {
			res.reloadsOK, res.reloadsBad = ok-ok0, bad-bad0
		}
	}()

	for i := range o.changes {
		inst := cycle[i%len(cycle)]
		before := f.expect()
		d.drainEvents()
		// Consul wakes its blocking queries as it answers the write, so
		// seamless may apply a change before the write has returned here:
		// its record is looked for from the start of the write.
		written := time.Now()
		if err := f.set(ctx, inst, !f.passing[inst]); err != nil {
			res.err = fmt.Errorf("change %d: consul write: %w", i+1, err)
			return res
		}
		t0 := time.Now()
		res.asked++
		want := f.expect()
		lat, strays, err := pollUntil(ctx, d.http, "127.0.0.1", o.every, t0.Add(o.changeTimeout), func(code int, body string) verdict {
			switch answer(code, body) {
			case want:
				return reflected
			case before:
				return pending
			}
			return stray
		})
		res.pollErrors += strays
		if err != nil {
			res.err = d.withLog(fmt.Errorf("change %d (%s %s, want %s): %w", i+1, f.kind, inst, want, err))
			return res
		}
		res.lat = append(res.lat, lat.Sub(t0))
		// The next change waits until seamless has finished with this one
		// (a reload is confirmed before it is logged): each is measured
		// alone.
		ev, err := d.nextApplied(ctx, written, o.changeTimeout)
		if err != nil {
			res.err = d.withLog(fmt.Errorf("change %d: %w", i+1, err))
			return res
		}
		res.pipeline = append(res.pipeline, ev.duration)
		if ev.runtime {
			res.runtime++
		}
		if ev.reload >= 0 {
			res.reload = append(res.reload, ev.reload)
		}
		log.Info("change", "n", i+1, "flip", inst, "want", want, "written", t0.Format("15:04:05.000"),
			"served", lat.Sub(t0).Round(100*time.Microsecond), "applied", ev.at.Sub(t0).Round(100*time.Microsecond),
			"runtime", ev.runtime, "apply_duration", ev.duration)
		jitter := time.Duration(rand.Int64N(int64(o.gap/2) + 1))
		if err := sleepUntil(ctx, time.Now().Add(o.gap+jitter)); err != nil {
			res.err = err
			return res
		}
	}
	return res
}

// waitAnswer waits until the frontend answers want, before any change.
func waitAnswer(ctx context.Context, addr, want string, timeout time.Duration) error {
	var last string
	err := poll(ctx, 10*time.Millisecond, timeout, "frontend answers "+want, func() (bool, error) {
		code, body, err := probe(ctx, addr, "127.0.0.1")
		if err != nil {
			return false, err
		}
		last = answer(code, body)
		return last == want, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last answer %q)", err, last)
	}
	return nil
}
