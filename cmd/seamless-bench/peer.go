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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/consulproc"
)

// `seamless-bench peer`: seamless side by side with consul-template
// v0.41.1, the tool users would keep instead. For each catalog size a
// fresh Consul server gets services × instances registered (as `scale`
// does), and each tool in turn (or, with -together, all at once) runs
// against it through a counting reverse proxy of its own (proxy.go):
//
//	consul-template     the classic template (peerTemplate) to a file,
//	                    wait 0, no command
//	seamless, template  the same template (SEAMLESS_TEMPLATE), HAProxy 2.6,
//	                    SEAMLESS_WAIT=0
//	seamless, built-in  the built-in template, SEAMLESS_WAIT=0
//
// Then -changes single-instance changes, -interval apart on a fixed
// schedule (not waiting for the tools): instance j of service i moves to a
// new port, where a listener of its own answers; the sequence of (i, j) is
// drawn from -seed without repeats, the same for every tool. Measured per
// tool: from the Consul write returning to the new address in the rendered
// file (and, for the built-in, to a request through HAProxy answered by
// the new listener), Consul requests and bytes per change through its
// proxy, the tool's CPU and the Consul agent's per change, RSS and peak.

type peerOptions struct {
	keep                                      bool
	seamless, haproxy, consul, consulTemplate string
	sizes                                     []peerSize
	nodes                                     int
	changes                                   int
	interval                                  time.Duration
	seed                                      uint64
	together                                  bool
	tools                                     []peerTool
	env                                       envFlag
	every                                     time.Duration
	changeTimeout, timeout                    time.Duration
	nofile                                    uint64
	nofileInForce                             uint64 // what raiseNofile achieved
}

type peerSize struct{ services, instances int }

func (s peerSize) String() string { return fmt.Sprintf("%dx%d", s.services, s.instances) }

// peerResult is one row: a tool at a catalog size.
type peerResult struct {
	size                 peerSize
	tool                 peerTool
	together             bool
	register             time.Duration // the catalog written to Consul
	ready                time.Duration // the tool started → the whole catalog in its file
	asked                int
	rendered             []time.Duration // by change seen: write → in the file
	served               []time.Duration // built-in: write → served
	traffic              proxyCounts     // through its proxy, over the changes
	cpu                  time.Duration   // the tool's, over the changes
	haproxy              time.Duration   // seamless: HAProxy's (master, workers), over the changes
	agent                time.Duration   // the Consul agent's, over the changes
	agentTools           int             // tools sharing that agent
	window               time.Duration   // first write → last reading
	rssLoaded, rss, peak int64
	reads                int    // reads of the rendered file
	probes               int    // built-in: requests sent to see changes served
	applies              string // seamless: seamless_config_applies_total by result, over the changes
	maxConns             int    // the agent's http_max_conns_per_client
	logs                 string
	err                  error
}

func runPeer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parsePeerFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench peer: %v\n", err)
		return 2
	}
	return inBenchDir(ctx, o.timeout, o.keep, stderr, func(ctx context.Context, log *slog.Logger, root string) int {
		// consul-template holds a connection per service, and its proxy
		// one more to Consul for each, all in this process.
		need := uint64(1000)
		for _, s := range o.sizes {
			need = max(need, uint64(len(o.tools)*2*(s.services+16)+1000))
		}
		limit, err := raiseNofile(o.nofile)
		if err != nil && limit < need {
			log.Warn("cannot raise the file descriptor limit; the largest catalog may run out", "limit", limit, "want", o.nofile, "err", err)
		}
		o.nofileInForce = limit
		var defaults map[string]string
		if slices.Contains(o.tools, toolTemplate) || slices.Contains(o.tools, toolBuiltin) {
			if defaults, err = seamlessDefaults(ctx, o.seamless); err != nil {
				fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
				return 1
			}
		}
		var results []peerResult
		for _, size := range o.sizes {
			groups := [][]peerTool{o.tools}
			if !o.together {
				groups = nil
				for _, t := range o.tools {
					groups = append(groups, []peerTool{t})
				}
			}
			for _, tools := range groups {
				if ctx.Err() != nil {
					break
				}
				dir := filepath.Join(root, fmt.Sprintf("r%d", len(results)+1))
				names := make([]string, len(tools))
				for i, t := range tools {
					names[i] = t.key
				}
				rlog := log.With("run", filepath.Base(dir), "catalog", size.String(), "tools", strings.Join(names, ","))
				rs := peerRow(ctx, rlog, o, dir, defaults, size, tools)
				for _, r := range rs {
					if r.err != nil {
						rlog.Error("run failed", "tool", r.tool.key, "err", r.err)
					}
				}
				results = append(results, rs...)
			}
		}
		printPeerTable(stdout, o, results)
		if ctx.Err() != nil || slices.ContainsFunc(results, func(r peerResult) bool { return r.err != nil }) {
			return 1
		}
		return 0
	})
}

func parsePeerFlags(args []string, stderr io.Writer) (peerOptions, error) {
	fs := flag.NewFlagSet("seamless-bench peer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o peerOptions
	var sizes, tools string
	var nofile int
	fs.StringVar(&o.seamless, "seamless", "", "path to the seamless binary (required for the seamless tools)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "HAProxy binary")
	fs.StringVar(&o.consul, "consul", consulproc.DefaultBin(), "Consul agent binary")
	fs.StringVar(&o.consulTemplate, "consul-template", defaultConsulTemplate(), "consul-template binary ($SEAMLESS_CONSUL_TEMPLATE_BIN)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (logs, rendered files) also after a successful run")
	fs.StringVar(&sizes, "sizes", "100x10,1000x10", "catalogs, SERVICESxINSTANCES, comma-separated (a fresh Consul per row)")
	fs.IntVar(&o.nodes, "nodes", 100, "Consul nodes the instances are spread over")
	fs.IntVar(&o.changes, "changes", 40, "single-instance changes per row")
	fs.DurationVar(&o.interval, "interval", 1500*time.Millisecond, "time between changes (a fixed schedule)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the sequence of changed instances")
	fs.BoolVar(&o.together, "together", false, "run the tools at once on one Consul (default: each alone)")
	fs.StringVar(&tools, "tools", "ct,template,builtin", "tools: ct (consul-template), template (seamless with it), builtin (seamless's built-in template)")
	fs.Var(&o.env, "env", "a further SEAMLESS_* variable for seamless, `NAME=VALUE` (repeatable)")
	fs.DurationVar(&o.every, "poll", time.Millisecond, "interval of the requests through HAProxy that look for a change served (built-in)")
	fs.DurationVar(&o.changeTimeout, "change-timeout", 60*time.Second, "after the last change, how long the tools may take to show every change")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Minute, "time limit for the whole benchmark")
	fs.IntVar(&nofile, "nofile", 65536, "file descriptor limit for the benchmark and what it starts (raised if allowed)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for s := range strings.SplitSeq(sizes, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(s), "x")
		n, err1 := strconv.Atoi(a)
		m, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || n > 100_000 || m < 1 || m > 100 {
			return o, fmt.Errorf("-sizes: %q is not SERVICESxINSTANCES (1-100000 x 1-100)", s)
		}
		o.sizes = append(o.sizes, peerSize{n, m})
	}
	for k := range strings.SplitSeq(tools, ",") {
		i := slices.IndexFunc(peerTools, func(t peerTool) bool { return t.key == strings.TrimSpace(k) })
		if i < 0 {
			return o, fmt.Errorf("-tools: unknown tool %q (want ct, template or builtin)", k)
		}
		if !slices.Contains(o.tools, peerTools[i]) {
			o.tools = append(o.tools, peerTools[i])
		}
	}
	o.nofile = uint64(max(nofile, 0))
	switch {
	case o.nodes < 1 || o.nodes > 10_000:
		return o, errors.New("-nodes must be 1 to 10000")
	case o.changes < 1:
		return o, errors.New("-changes must be >= 1")
	case o.interval <= 0 || o.every <= 0 || o.changeTimeout <= 0 || o.timeout <= 0:
		return o, errors.New("-interval, -poll, -change-timeout and -timeout must be > 0")
	}
	for _, s := range o.sizes {
		if o.changes > s.services*s.instances {
			return o, fmt.Errorf("-changes %d: catalog %s has only %d instances to change once each", o.changes, s, s.services*s.instances)
		}
	}
	var err error
	if o.haproxy, err = exec.LookPath(o.haproxy); err != nil {
		return o, fmt.Errorf("-haproxy: %w", err)
	}
	if slices.Contains(o.tools, toolTemplate) || slices.Contains(o.tools, toolBuiltin) {
		if o.seamless, err = absBinary("-seamless", o.seamless); err != nil {
			return o, err
		}
	}
	if slices.Contains(o.tools, toolCT) {
		if o.consulTemplate == "" {
			return o, errors.New("-consul-template PATH is required (make consul-template builds it)")
		}
		if o.consulTemplate, err = absBinary("-consul-template", o.consulTemplate); err != nil {
			return o, err
		}
	}
	return o, nil
}

// defaultConsulTemplate is $SEAMLESS_CONSUL_TEMPLATE_BIN, else what
// `make consul-template` builds.
func defaultConsulTemplate() string {
	if bin := os.Getenv("SEAMLESS_CONSUL_TEMPLATE_BIN"); bin != "" {
		return bin
	}
	return "/var/cache/seamless/consul-template/consul-template-0.41.1"
}

// raiseNofile sets the file descriptor limit to n when it is lower, and
// returns the limit in force. The children inherit it (HAProxy sizes
// itself by it).
func raiseNofile(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= n {
		return lim.Cur, nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return lim.Cur, err
	}
	return n, nil
}

// peerChange is one change: instance inst of service svc moves to port,
// where the listener named name answers.
type peerChange struct {
	svc, inst int
	port      int
	name      string
}

// planChanges draws n distinct instances of l from seed.
func planChanges(l layout, n int, seed uint64, ports []int, names []string) []peerChange {
	rng := rand.New(rand.NewPCG(seed, 0x5ea4))
	perm := rng.Perm(l.services * l.instances)
	out := make([]peerChange, n)
	for k := range out {
		out[k] = peerChange{svc: perm[k] / l.instances, inst: perm[k] % l.instances, port: ports[k], name: names[k]}
	}
	return out
}

// maxConnsPerClient is the agent's http_max_conns_per_client for a row:
// every tool may hold a connection per service (consul-template does,
// S+1), all from 127.0.0.1 through the proxies; Consul's default is 200.
func maxConnsPerClient(l layout, tools int) int {
	return max(200, tools*(l.services+16)+100)
}

func peerRow(ctx context.Context, log *slog.Logger, o peerOptions, dir string, defaults map[string]string, size peerSize, tools []peerTool) []peerResult {
	results := make([]peerResult, len(tools))
	for i, t := range tools {
		results[i] = peerResult{size: size, tool: t, together: len(tools) > 1, agentTools: len(tools)}
	}
	fail := func(err error) []peerResult {
		for i := range results {
			if results[i].err == nil {
				results[i].err = err
			}
		}
		return results
	}
	// The named backends every instance starts at, and one listener per
	// change, answering its name.
	names := make([]string, size.instances+o.changes)
	for j := range size.instances {
		names[j] = "i" + strconv.Itoa(j)
	}
	for k := range o.changes {
		names[size.instances+k] = "c" + strconv.Itoa(k+1)
	}
	backends, err := startNamedBackends(names...)
	if err != nil {
		return fail(fmt.Errorf("backends: %w", err))
	}
	defer backends.stop()
	l := layout{services: size.services, instances: size.instances, nodes: o.nodes}
	for j := range size.instances {
		l.ports = append(l.ports, backends.ports[names[j]])
	}
	var ports []int
	for _, n := range names[size.instances:] {
		ports = append(ports, backends.ports[n])
	}
	changes := planChanges(l, o.changes, o.seed, ports, names[size.instances:])

	if err := os.MkdirAll(filepath.Join(dir, "consul"), 0o755); err != nil {
		return fail(err)
	}
	maxConns := maxConnsPerClient(l, len(tools))
	agent, err := consulproc.Start(ctx, consulproc.Options{Bin: o.consul, Dir: filepath.Join(dir, "consul"),
		HCL: []string{fmt.Sprintf("limits { http_max_conns_per_client = %d }", maxConns)}})
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := agent.Stop(); err != nil {
			log.Warn("stopping consul", "err", err)
		}
	}()
	client, err := agent.Client()
	if err != nil {
		return fail(err)
	}
	rctx, cancel := context.WithTimeout(ctx, loadTimeout)
	t0 := time.Now()
	err = registerAll(rctx, client, l.ops(), l.nodes)
	cancel()
	if err != nil {
		return fail(err)
	}
	register := time.Since(t0)
	log.Info("catalog registered", "instances", l.services*l.instances, "took", register.Round(time.Millisecond))
	for i := range results {
		results[i].register, results[i].maxConns = register, maxConns
	}

	setup := toolSetup{o: o, l: l, consul: agent.Addr(), defaults: defaults, ports: ports}
	wctx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	runs := make([]*toolRun, len(tools))
	defer func() {
		for i, t := range runs {
			if t == nil {
				continue
			}
			results[i].logs = t.logSummary()
			if err := t.stop(); err != nil {
				results[i].err = errors.Join(results[i].err, err)
			}
		}
	}()
	for i, tool := range tools {
		t, err := startTool(ctx, setup, tool, filepath.Join(dir, tool.key))
		if err != nil {
			results[i].err = err
			continue
		}
		runs[i] = t
		go func() {
			if err := t.file.run(wctx); err != nil {
				log.Warn("watching the rendered file", "tool", tool.key, "err", err)
			}
		}()
		log.Info("started", "tool", tool.key, "proxy", t.proxy.addr, "file", t.file.path)
	}
	for i, t := range runs {
		if t == nil {
			continue
		}
		if err := t.waitLoaded(ctx, loadTimeout); err != nil {
			results[i].err = err
			continue
		}
		ready, _, _, _ := t.file.state()
		results[i].ready = ready.Sub(t.started)
		log.Info("whole catalog rendered", "tool", t.tool.key, "took", results[i].ready.Round(time.Millisecond))
	}
	// Start-up garbage is collected within a couple of GC cycles, and
	// consul-template's start-up fetches settle; the pause paces the
	// reading, it waits for nothing in particular.
	if err := sleepUntil(ctx, time.Now().Add(2*time.Second)); err != nil {
		return fail(err)
	}
	live := func(i int) bool { return runs[i] != nil && results[i].err == nil }
	type reading struct {
		traffic proxyCounts
		cpu     time.Duration
		haproxy time.Duration
		applies map[string]float64
	}
	before := make([]reading, len(runs))
	for i, t := range runs {
		if !live(i) {
			continue
		}
		results[i].rssLoaded, _, _ = procMemory(t.pid())
		t.proxy.resetPeak()
		before[i].traffic = t.proxy.read()
		before[i].cpu, _ = t.cpu()
		before[i].haproxy = t.haproxyCPU()
		if t.d != nil {
			before[i].applies, _ = appliesByResult(ctx, t.d)
		}
	}
	agentBefore, _, err := procCPU(agent.Pid())
	if err != nil {
		return fail(err)
	}

	// The changes, on a fixed schedule.
	start := time.Now()
	written := make([]time.Time, len(changes))
	pctx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	probesDone := make(chan struct{}, len(changes)*len(runs))
	probing := 0
	for k, c := range changes {
		if err := sleepUntil(ctx, start.Add(time.Duration(k)*o.interval)); err != nil {
			return fail(err)
		}
		for i, t := range runs {
			if live(i) {
				t.file.arm(k)
				if t.tool == toolBuiltin {
					probing++
					go func() {
						defer func() { probesDone <- struct{}{} }()
						t.probeServed(pctx, k, l.host(c.svc), c.name, o.every, time.Now().Add(o.changeTimeout+time.Duration(len(changes)-k)*o.interval))
					}()
				}
			}
		}
		if err := moveInstance(ctx, client, l, c); err != nil {
			return fail(fmt.Errorf("change %d: consul write: %w", k+1, err))
		}
		written[k] = time.Now()
		for i := range results {
			results[i].asked++
		}
		if (k+1)%10 == 0 || k+1 == len(changes) {
			log.Info("progress", "changes", fmt.Sprintf("%d/%d", k+1, len(changes)), "last", fmt.Sprintf("%s instance %d → :%d", l.service(c.svc), c.inst, c.port))
		}
	}
	// Every change gets its interval; then wait for the slowest tool.
	if err := sleepUntil(ctx, start.Add(time.Duration(len(changes))*o.interval)); err != nil {
		return fail(err)
	}
	for i, t := range runs {
		if !live(i) {
			continue
		}
		err := poll(ctx, 20*time.Millisecond, o.changeTimeout, t.tool.title+" shows every change in its file", func() (bool, error) {
			_, seen, _, _ := t.file.state()
			return !slices.ContainsFunc(seen, time.Time.IsZero), t.alive()
		})
		if err != nil {
			results[i].err = t.withLog(fmt.Errorf("%w: %v", errNotSeen, err))
		}
	}
	for range probing {
		<-probesDone
	}
	agentAfter, _, err := procCPU(agent.Pid())
	if err != nil {
		return fail(err)
	}
	window := time.Since(start)
	for i, t := range runs {
		if runs[i] == nil {
			continue
		}
		r := &results[i]
		r.window = window
		r.agent = agentAfter - agentBefore
		r.traffic = t.proxy.read().sub(before[i].traffic)
		cpu, _ := t.cpu()
		r.cpu = cpu - before[i].cpu
		r.haproxy = t.haproxyCPU() - before[i].haproxy
		r.rss, r.peak, _ = procMemory(t.pid())
		_, seen, reads, _ := t.file.state()
		r.reads = reads
		served := t.servedAt()
		for k := range changes {
			if !seen[k].IsZero() {
				r.rendered = append(r.rendered, max(seen[k].Sub(written[k]), 0))
			}
			if t.tool == toolBuiltin && !served[k].IsZero() {
				r.served = append(r.served, max(served[k].Sub(written[k]), 0))
			}
		}
		if t.tool == toolBuiltin {
			t.servedMu.Lock()
			r.probes = t.probes
			t.servedMu.Unlock()
			if len(r.served) < len(changes) && r.err == nil {
				r.err = fmt.Errorf("%d of %d changes were not served through HAProxy in time", len(changes)-len(r.served), len(changes))
			}
		}
		if t.d != nil && r.err == nil {
			after, err := appliesByResult(ctx, t.d)
			if err == nil {
				r.applies = diffApplies(before[i].applies, after)
			}
		}
		if r.traffic.Errors > 0 && r.err == nil {
			r.err = fmt.Errorf("the counting proxy failed %d requests to Consul", r.traffic.Errors)
		}
		if len(r.served) > 0 {
			var ds []string
			for _, d := range r.served {
				ds = append(ds, fmtMs(d))
			}
			log.Info("served", "tool", t.tool.key, "by_change", strings.Join(ds, " "))
		}
		log.Info("row done", "tool", t.tool.key, "seen", fmt.Sprintf("%d/%d", len(r.rendered), len(changes)),
			"p50", fmtPct(r.rendered, 50), "requests", r.traffic.total().Requests, "kib", r.traffic.total().Body>>10)
	}
	return results
}

// moveInstance re-registers the instance of c at its new port, in one
// catalog write; its check stays as it was.
func moveInstance(ctx context.Context, c *api.Client, l layout, ch peerChange) error {
	op := &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: l.node(ch.svc, ch.inst),
		Service: api.AgentService{ID: l.id(ch.svc, ch.inst), Service: l.service(ch.svc), Address: "127.0.0.1",
			Port: ch.port, Tags: []string{l.hostTag(ch.svc)}}}}
	ok, resp, _, err := c.Txn().Txn(api.TxnOps{op}, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && !ok {
		err = fmt.Errorf("transaction rolled back: %v", resp.Errors)
	}
	return err
}

// appliesByResult reads seamless_config_applies_total by its result label.
func appliesByResult(ctx context.Context, d *discoveryRun) (map[string]float64, error) {
	code, body, err := getHTTP(ctx, "http://"+d.status+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/metrics answered %d", code)
	}
	out := map[string]float64{}
	const name = "seamless_config_applies_total{"
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), name)
		if !ok {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			continue
		}
		f := strings.Fields(rest[end+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out[parseLabels(rest[:end])["result"]] += v
	}
	return out, nil
}

// diffApplies formats after-before by result: "reloaded 40, runtime 0".
func diffApplies(before, after map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range after {
			if !yield(k) {
				return
			}
		}
	}) {
		if d := after[k] - before[k]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
