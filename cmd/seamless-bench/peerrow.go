package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/consulproc"
)

// One row of `seamless-bench peer`: a catalog in a fresh Consul, the tools
// against it, the changes, the readings.

// peerChange is one change: instance inst of service svc moves to port,
// where the listener named name answers.
type peerChange struct {
	svc, inst int
	port      int
	name      string
}

// describe says what change c does, for the log.
func (c peerChange) describe(l layout, kind changeKind) string {
	switch kind {
	case changeAdd:
		return fmt.Sprintf("%s: an instance added at :%d", l.service(c.svc), c.port)
	case changeRemove:
		return fmt.Sprintf("%s instance %d removed", l.service(c.svc), c.inst)
	}
	return fmt.Sprintf("%s instance %d → :%d", l.service(c.svc), c.inst, c.port)
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
// S+1), all from 127.0.0.1 through the proxies, and as many again idle
// in the proxies' pools between a blocking query's answer and the next
// (five tools together at 1000x10 met the limit without them, and the
// agent answered 429); Consul's default is 200. Consul refuses to start
// when the limit and its own 20 descriptors exceed its file descriptor
// limit, nofile (0: unknown), so the room for idle connections shrinks
// to what nofile allows.
func maxConnsPerClient(l layout, tools int, nofile uint64) int {
	want := max(200, 2*tools*(l.services+16)+100)
	if nofile > consulOwnFDs+200 {
		want = min(want, int(nofile)-consulOwnFDs)
	}
	return want
}

// consulOwnFDs is what Consul 1.14 adds to http_max_conns_per_client
// when it checks the limit against its file descriptor limit, with room.
const consulOwnFDs = 50

// peerCatalog is a row's Consul with its catalog, the backends the
// instances start at and the listeners the changes move them to.
type peerCatalog struct {
	l        layout
	changes  []peerChange
	ports    []int // by change
	backends *namedBackends
	agent    *consulproc.Agent
	client   *api.Client
	register time.Duration
	maxConns int
}

func (c *peerCatalog) stop(log *slog.Logger) {
	if c.agent != nil {
		if err := c.agent.Stop(); err != nil {
			log.Warn("stopping consul", "err", err)
		}
	}
	if c.backends != nil {
		c.backends.stop()
	}
}

// newPeerCatalog starts the backends and a Consul for tools tools, and
// registers size in it. On error, what it started is stopped.
func newPeerCatalog(ctx context.Context, log *slog.Logger, o peerOptions, dir string, size peerSize, tools int) (c *peerCatalog, err error) {
	c = &peerCatalog{}
	defer func() {
		if err != nil {
			c.stop(log)
		}
	}()
	names := make([]string, size.instances+o.changes)
	for j := range size.instances {
		names[j] = "i" + strconv.Itoa(j)
	}
	for k := range o.changes {
		names[size.instances+k] = "c" + strconv.Itoa(k+1)
	}
	if c.backends, err = startNamedBackends(names...); err != nil {
		return c, fmt.Errorf("backends: %w", err)
	}
	c.l = layout{services: size.services, instances: size.instances, nodes: o.nodes}
	for j := range size.instances {
		c.l.ports = append(c.l.ports, c.backends.ports[names[j]])
	}
	for _, n := range names[size.instances:] {
		c.ports = append(c.ports, c.backends.ports[n])
	}
	c.changes = planChanges(c.l, o.changes, o.seed, c.ports, names[size.instances:])

	if err := os.MkdirAll(filepath.Join(dir, "consul"), 0o755); err != nil {
		return c, err
	}
	c.maxConns = maxConnsPerClient(c.l, tools, o.nofileInForce)
	c.agent, err = consulproc.Start(ctx, consulproc.Options{Bin: o.consul, Dir: filepath.Join(dir, "consul"),
		HCL: []string{fmt.Sprintf("limits { http_max_conns_per_client = %d }", c.maxConns)}})
	if err != nil {
		return c, err
	}
	if c.client, err = c.agent.Client(); err != nil {
		return c, err
	}
	rctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	t0 := time.Now()
	if err := registerAll(rctx, c.client, c.l.ops(), c.l.nodes); err != nil {
		return c, err
	}
	c.register = time.Since(t0)
	log.Info("catalog registered", "instances", c.l.services*c.l.instances, "took", c.register.Round(time.Millisecond))
	return c, nil
}

// toolReading is what is read of a tool before and after the changes.
type toolReading struct {
	traffic proxyCounts
	cpu     time.Duration
	haproxy time.Duration
	applies map[string]float64
}

func readTool(ctx context.Context, t *toolRun) toolReading {
	r := toolReading{traffic: t.proxy.read(), haproxy: t.haproxyCPU()}
	r.cpu, _ = t.cpu()
	if t.d != nil {
		r.applies, _ = appliesByResult(ctx, t.d)
	}
	return r
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
	cat, err := newPeerCatalog(ctx, log, o, dir, size, len(tools))
	if err != nil {
		return fail(err)
	}
	defer cat.stop(log)
	for i := range results {
		results[i].register, results[i].maxConns = cat.register, cat.maxConns
	}

	runs := startPeerTools(ctx, log, o, dir, defaults, cat, tools, results)
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
	// Start-up garbage is collected within a couple of GC cycles, and
	// consul-template's start-up fetches settle; the pause paces the
	// reading, it waits for nothing in particular.
	if err := sleepUntil(ctx, time.Now().Add(2*time.Second)); err != nil {
		return fail(err)
	}
	// seamless serves before it watches (its per-service queries wait
	// for HAProxy), and the agent then sets up a view per query: the
	// changes measure tools that watch, as consul-template does once it
	// has rendered.
	waited, settled, err := settleAgent(ctx, cat.agent.Pid(), settleTimeout)
	if err != nil {
		return fail(err)
	}
	if settled {
		log.Info("the Consul agent settled", "took", waited.Round(time.Millisecond))
	} else {
		log.Warn("the Consul agent did not settle; changing anyway", "after", waited.Round(time.Millisecond))
	}
	for i, t := range runs {
		if t != nil {
			results[i].settled, results[i].unsettled = time.Since(t.started), !settled
		}
	}
	live := func(i int) bool { return runs[i] != nil && results[i].err == nil }
	before := make([]toolReading, len(runs))
	for i, t := range runs {
		if live(i) {
			results[i].rssLoaded, results[i].peakLoaded, _ = procMemory(t.pid())
			t.proxy.resetPeak()
			before[i] = readTool(ctx, t)
		}
	}
	agentBefore, _, err := procCPU(cat.agent.Pid())
	if err != nil {
		return fail(err)
	}

	start := time.Now()
	written, err := writeChanges(ctx, log, o, cat, runs, live)
	for i := range results {
		results[i].asked = len(written)
	}
	if err != nil {
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
	for _, t := range runs {
		if t != nil {
			t.probing.Wait()
		}
	}
	agentAfter, _, err := procCPU(cat.agent.Pid())
	if err != nil {
		return fail(err)
	}
	window := time.Since(start)
	for i, t := range runs {
		if t == nil {
			continue
		}
		r := &results[i]
		r.window, r.agent = window, agentAfter-agentBefore
		finishPeerResult(ctx, log, r, t, before[i], written, o.probes(t.tool))
	}
	return results
}

// startPeerTools starts every tool and waits until each has the whole
// catalog in its file; a tool that fails has its error in results and
// may still need stopping (its entry is not nil).
func startPeerTools(ctx context.Context, log *slog.Logger, o peerOptions, dir string, defaults map[string]string,
	cat *peerCatalog, tools []peerTool, results []peerResult) []*toolRun {
	setup := toolSetup{o: o, l: cat.l, consul: cat.agent.Addr(), defaults: defaults, ports: cat.ports, changes: cat.changes}
	runs := make([]*toolRun, len(tools))
	for i, tool := range tools {
		t, err := startTool(ctx, setup, tool, filepath.Join(dir, tool.key))
		if err != nil {
			results[i].err = err
			continue
		}
		runs[i] = t
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
		if t.tool.serves() {
			results[i].readyServed = servedWhole(ctx, t, cat.l, o.every, time.Now().Add(loadTimeout))
			log.Info("whole catalog served", "tool", t.tool.key, "took", results[i].readyServed.Round(time.Millisecond))
		}
	}
	return runs
}

// writeChanges writes the changes on a fixed schedule, -interval apart,
// and returns when each write returned; then it waits out the last
// change's interval, so that every change has its own.
func writeChanges(ctx context.Context, log *slog.Logger, o peerOptions, cat *peerCatalog, runs []*toolRun, live func(int) bool) ([]time.Time, error) {
	l := cat.l
	start := time.Now()
	var written []time.Time
	for k, c := range cat.changes {
		if err := sleepUntil(ctx, start.Add(time.Duration(k)*o.interval)); err != nil {
			return written, err
		}
		// Armed before the write: a tool may render the change before the
		// write has returned here.
		for i, t := range runs {
			if !live(i) {
				continue
			}
			t.file.arm(k)
			if o.probes(t.tool) {
				deadline := probeDeadline(start.Add(time.Duration(len(cat.changes))*o.interval), time.Now(), o.changeTimeout)
				t.probing.Go(func() { t.probeServed(ctx, k, l.host(c.svc), c.name, o.every, deadline) })
			}
		}
		if err := changeInstance(ctx, cat.client, l, c, o.change); err != nil {
			return written, fmt.Errorf("change %d: consul write: %w", k+1, err)
		}
		written = append(written, time.Now())
		if (k+1)%10 == 0 || k+1 == len(cat.changes) {
			log.Info("progress", "changes", fmt.Sprintf("%d/%d", k+1, len(cat.changes)),
				"last", c.describe(l, o.change))
		}
	}
	return written, sleepUntil(ctx, start.Add(time.Duration(len(cat.changes))*o.interval))
}

// probeDeadline is when the probe of a change written at now gives up:
// timeout after the schedule's end, or after now when the writes fell
// behind the schedule (at 10,000 × 10 a registration takes Consul some
// 200 ms, not 20), so that a late change has its time too.
func probeDeadline(scheduleEnd, now time.Time, timeout time.Duration) time.Time {
	if now.After(scheduleEnd) {
		return now.Add(timeout)
	}
	return scheduleEnd.Add(timeout)
}

// finishPeerResult reads what tool t did over the changes into r.
func finishPeerResult(ctx context.Context, log *slog.Logger, r *peerResult, t *toolRun, before toolReading, written []time.Time, probed bool) {
	after := readTool(ctx, t)
	r.traffic = after.traffic.sub(before.traffic)
	r.cpu = after.cpu - before.cpu
	r.haproxy = after.haproxy - before.haproxy
	r.rss, r.peak, _ = procMemory(t.pid())
	_, seen, reads, _ := t.file.state()
	r.reads = reads
	served := t.servedAt()
	// Each change's, in order ("-" not seen): a p99 is one or two
	// changes, and which ones says why.
	var ds []string
	for k := range written {
		d := "-"
		if !seen[k].IsZero() {
			r.rendered = append(r.rendered, max(seen[k].Sub(written[k]), 0))
			d = fmtMs(r.rendered[len(r.rendered)-1])
		}
		ds = append(ds, d)
		if probed && !served[k].IsZero() {
			r.served = append(r.served, max(served[k].Sub(written[k]), 0))
		}
	}
	log.Info("in the file", "tool", t.tool.key, "by_change", strings.Join(ds, " "))
	if early := t.file.shownEarly(); len(early) > 0 && r.err == nil {
		r.err = fmt.Errorf("changes %v were in the file before they were written: the benchmark cannot see them there", early)
	}
	if probed {
		t.servedMu.Lock()
		r.probes = t.probes
		t.servedMu.Unlock()
		if len(r.served) < len(written) && r.err == nil {
			r.err = fmt.Errorf("%d of %d changes were not served through HAProxy in time", len(written)-len(r.served), len(written))
		}
		ds = ds[:0]
		for _, d := range r.served {
			ds = append(ds, fmtMs(d))
		}
		log.Info("served", "tool", t.tool.key, "by_change", strings.Join(ds, " "))
	}
	if t.d != nil && before.applies != nil && after.applies != nil {
		r.applies = diffApplies(before.applies, after.applies)
	}
	if r.traffic.Errors > 0 && r.err == nil {
		r.err = fmt.Errorf("the counting proxy failed %d requests to Consul", r.traffic.Errors)
	}
	log.Info("row done", "tool", t.tool.key, "seen", fmt.Sprintf("%d/%d", len(r.rendered), len(written)),
		"p50", fmtPct(r.rendered, 50), "requests", r.traffic.total().Requests, "kib", r.traffic.total().Body>>10)
}

// changeInstance makes change ch in one catalog write. A move
// re-registers the instance at its new port; its check stays as it was.
// An add registers a new instance of the service on the same node at that
// port (no check: passing). A remove deregisters the instance, and so its
// check.
func changeInstance(ctx context.Context, c *api.Client, l layout, ch peerChange, kind changeKind) error {
	id := l.id(ch.svc, ch.inst)
	if kind == changeAdd {
		id += "-added"
	}
	op := &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: l.node(ch.svc, ch.inst),
		Service: api.AgentService{ID: id, Service: l.service(ch.svc), Address: "127.0.0.1",
			Port: ch.port, Tags: []string{l.hostTag(ch.svc)}}}}
	if kind == changeRemove {
		op.Service.Verb, op.Service.Service = api.ServiceDelete, api.AgentService{ID: id, Service: l.service(ch.svc)}
	}
	ok, resp, _, err := c.Txn().Txn(api.TxnOps{op}, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && !ok {
		err = rolledBack(resp)
	}
	return err
}

// servedWhole probes the tool's HAProxy until its first and last
// service both answer, and returns how long after the tool's start; 0 if
// they did not by deadline.
func servedWhole(ctx context.Context, t *toolRun, l layout, every time.Duration, deadline time.Time) time.Duration {
	var last time.Time
	for _, i := range []int{0, l.services - 1} {
		at, _, err := pollUntil(ctx, t.http, l.host(i), every, deadline, func(code int, _ string) verdict {
			if code == http.StatusOK {
				return reflected
			}
			return pending
		})
		if err != nil {
			return 0
		}
		last = at
	}
	return last.Sub(t.started)
}

// settleTimeout bounds the wait for the Consul agent to settle.
const settleTimeout = time.Minute

// settleAgent waits, for at most limit, until the Consul agent at pid
// spends less than a tenth of a core over half a second. It returns how
// long it waited and whether the agent settled.
func settleAgent(ctx context.Context, pid int, limit time.Duration) (time.Duration, bool, error) {
	const window = 500 * time.Millisecond
	start := time.Now()
	for time.Since(start) < limit {
		before, _, err := procCPU(pid)
		if err != nil {
			return 0, false, err
		}
		if err := sleepUntil(ctx, time.Now().Add(window)); err != nil {
			return 0, false, err
		}
		after, _, err := procCPU(pid)
		if err != nil {
			return 0, false, err
		}
		if after-before < window/10 {
			return time.Since(start), true, nil
		}
	}
	return time.Since(start), false, nil
}
