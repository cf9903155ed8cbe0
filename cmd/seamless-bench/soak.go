package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/consulproc"
)

// `seamless-bench soak`: one seamless (sources consul and file, a template
// of its own) under continuous, seeded churn for -duration, with a paced
// load through it to services that never change:
//
//   - every -every, one random change: a Consul service registered or
//     deregistered whole (under a name never used before, so names churn
//     too), an instance added or removed, a TTL check flipped between
//     passing and critical, a service file written, replaced, removed or
//     made malformed (and fixed at the next step);
//   - every -template-every, the template edited and seamless sent SIGHUP;
//   - -consul-restarts times, evenly spread, the `consul agent -dev` stopped
//     and started again: it comes back empty, seamless's guard holds the
//     removals, and the soak registers again what should exist.
//
// Every -sample it reads seamless's RSS, goroutines (/metrics), open fds,
// the HAProxy processes and zombies below it, and the failed requests. At
// the end it prints the table with each column's least-squares slope per
// minute, and checks: no failed request, every template edit served, no
// reload that failed, and the configuration running equal, byte for byte,
// to what a fresh `seamless render` (same environment, an empty state
// directory) makes of the final catalog and directory. Then it removes
// every churned service, waits for the configuration to equal a fresh
// render again, and for seamless's goroutines (one watch per service) and
// fds to come back to the first reading's, like for like at the catalog of
// the start: it fails if they do not within 2 minutes.

type soakOptions struct {
	keep                      bool
	seamless, haproxy, consul string
	duration, every           time.Duration
	templateEvery, sample     time.Duration
	restarts                  int
	seed                      uint64
	burst                     int
	burstEvery                time.Duration
	settle                    time.Duration
	env                       envFlag
}

func parseSoakFlags(args []string, stderr io.Writer) (soakOptions, error) {
	fs := flag.NewFlagSet("seamless-bench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o soakOptions
	fs.StringVar(&o.seamless, "seamless", "", "path to the seamless binary (required)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "HAProxy binary")
	fs.StringVar(&o.consul, "consul", consulproc.DefaultBin(), "Consul agent binary (run as `consul agent -dev`)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (logs, configurations) also after a successful run")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the churn runs")
	fs.DurationVar(&o.every, "every", time.Second, "interval of the random changes")
	fs.DurationVar(&o.templateEvery, "template-every", 20*time.Second, "interval of the template edits with SIGHUP")
	fs.IntVar(&o.restarts, "consul-restarts", 3, "Consul restarts (empty), evenly spread over the run")
	fs.DurationVar(&o.sample, "sample", time.Minute, "interval of the readings")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the random changes")
	fs.IntVar(&o.burst, "burst", 5, "requests per burst of each load loop (3 stable services × 2 client modes)")
	fs.DurationVar(&o.burstEvery, "burst-every", 100*time.Millisecond, "interval of the bursts")
	fs.DurationVar(&o.settle, "settle", 2*time.Minute, "time limit for the configuration to equal a fresh render after the churn")
	fs.Var(&o.env, "env", "a further SEAMLESS_* variable, or GOGC, GOMEMLIMIT or GOMAXPROCS, for seamless alone, `NAME=VALUE` (repeatable)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.duration <= 0 || o.every <= 0 || o.templateEvery <= 0 || o.sample <= 0 || o.restarts < 0 ||
		o.burst < 1 || o.burstEvery <= 0 || o.settle <= 0 {
		return o, errors.New("-duration, -every, -template-every, -sample, -burst-every and -settle must be > 0, -burst >= 1, -consul-restarts >= 0")
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

func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseSoakFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench soak: %v\n", err)
		return 2
	}
	// The whole run's bound: the churn, the two settlings, and starting
	// and stopping everything.
	timeout := o.duration + 2*o.settle + 7*time.Minute
	return inBenchDir(ctx, timeout, o.keep, stderr, func(ctx context.Context, log *slog.Logger, root string) int {
		r := &soakRun{o: o, log: log, root: root, stdout: stdout}
		if err := r.run(ctx); err != nil {
			fmt.Fprintf(stderr, "seamless-bench soak: %v\n", err)
			return 1
		}
		if len(r.failures) > 0 {
			return 1
		}
		return 0
	})
}

// soakRun is one soak: what it started and what it found.
type soakRun struct {
	o      soakOptions
	log    *slog.Logger
	root   string
	stdout io.Writer

	agent    *devAgent
	world    *world
	d        *discoveryRun
	opts     discoveryOpts
	tmpl     string // SEAMLESS_TEMPLATE
	version  int    // of the template
	loads    loads
	samples  []soakSample
	failures []string // the checks that failed
}

func (r *soakRun) run(ctx context.Context) error {
	ports, stopBackends, err := r.backends()
	if err != nil {
		return err
	}
	defer stopBackends()
	for _, d := range []string{"consul", "services", "seamless"} {
		if err := os.Mkdir(filepath.Join(r.root, d), 0o755); err != nil {
			return err
		}
	}
	if r.agent, err = newDevAgent(r.o.consul, filepath.Join(r.root, "consul")); err != nil {
		return err
	}
	defer func() {
		if err := r.agent.close(); err != nil {
			r.log.Warn("stopping consul", "err", err)
		}
	}()
	r.log.Info("starting consul -dev", "bin", r.o.consul, "addr", r.agent.addr())
	if err := r.agent.start(ctx); err != nil {
		return err
	}
	c, err := r.agent.client()
	if err != nil {
		return err
	}
	r.world = newWorld(r.o.seed, ports, &soakFx{c: c, dir: filepath.Join(r.root, "services")})
	if err := r.world.setup(ctx); err != nil {
		return fmt.Errorf("registering the stable services: %w", err)
	}
	if err := r.startSeamless(ctx); err != nil {
		return err
	}
	defer func() {
		if err := r.d.stop(); err != nil {
			r.log.Warn("stopping seamless", "err", err)
		}
		r.log.Info("seamless's log", "summary", r.d.logSummary())
	}()

	lctx, stopLoads := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopLoads()
		wg.Wait()
	}()
	r.startLoads(lctx, &wg)

	if err := r.churn(ctx); err != nil {
		return err
	}
	converged, err := r.converge(ctx, "final")
	if err != nil {
		return err
	}
	// Back to the catalog of the start: what seamless holds then can be
	// compared with its first reading, like for like (goroutines follow
	// the services watched).
	if err := r.world.unchurn(ctx); err != nil {
		return fmt.Errorf("removing the churned services: %w", err)
	}
	unchurned, err := r.converge(ctx, "unchurned")
	if err != nil {
		return err
	}
	end, back, isBack, err := r.backToStart(ctx)
	if err != nil {
		return err
	}
	stopLoads()
	wg.Wait()
	requests, failed := r.loads.totals()
	_, badReloads, err := r.d.reloads(ctx)
	if err != nil {
		return err
	}
	configErrors, err := r.d.metric(ctx, "seamless_config_errors_total", nil)
	if err != nil {
		return err
	}

	fmt.Fprintf(r.stdout, "seamless soak: %v of churn, seed %d: %s\n", r.o.duration, r.o.seed, r.actions())
	printSoakTable(r.stdout, r.samples)
	fmt.Fprintf(r.stdout, "requests %d, failed %d", requests, failed)
	if failed > 0 {
		fmt.Fprintf(r.stdout, " (%s)", r.loads.failures())
		r.failures = append(r.failures, fmt.Sprintf("%d failed requests", failed))
	}
	fmt.Fprintf(r.stdout, "; reloads that failed %.0f; configurations refused %.0f; template versions %d\n",
		badReloads, configErrors, r.version)
	if badReloads > 0 {
		r.failures = append(r.failures, fmt.Sprintf("%.0f reloads did not succeed", badReloads))
	}
	if configErrors > 0 {
		r.failures = append(r.failures, fmt.Sprintf("%.0f rendered configurations refused", configErrors))
	}
	if converged >= 0 {
		fmt.Fprintf(r.stdout, "final configuration equals a fresh render of the final catalog, %v after the churn stopped\n",
			converged.Round(100*time.Millisecond))
	}
	if unchurned >= 0 {
		first := r.samples[0]
		fmt.Fprintf(r.stdout, "back at the start's catalog (%d services, %d instances; a fresh render's configuration %v after the churned services went):\n",
			end.services, end.instances, unchurned.Round(100*time.Millisecond))
		fmt.Fprintf(r.stdout, "  %v later: goroutines %.0f (start %.0f), fds %d (start %d), haproxy procs %d (start %d), rss %.1f MiB (start %.1f)\n",
			back.Round(time.Second), end.goroutines, first.goroutines, end.fds, first.fds, end.haproxy, first.haproxy,
			float64(end.rss)/(1<<20), float64(first.rss)/(1<<20))
		if !isBack {
			r.failures = append(r.failures, fmt.Sprintf("at the start's catalog, goroutines %.0f and fds %d not back to the start's %.0f and %d (+%d, +%d) within 2 minutes",
				end.goroutines, end.fds, first.goroutines, first.fds, slackGoroutines, slackFds))
		}
	}
	fmt.Fprintf(r.stdout, "seamless's log: %s\n", r.d.logSummary())
	for _, l := range alerts(r.d.logPath, 10) {
		fmt.Fprintf(r.stdout, "  %s\n", l)
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(r.stdout, "FAIL: %s\n", strings.Join(r.failures, "; "))
	} else {
		fmt.Fprintln(r.stdout, "PASS")
	}
	return nil
}

// backends starts the pool every instance points at.
func (r *soakRun) backends() ([]int, func(), error) {
	names := make([]string, soakMaxInstances*2)
	for i := range names {
		names[i] = fmt.Sprintf("b%d", i)
	}
	b, err := startNamedBackends(names...)
	if err != nil {
		return nil, nil, fmt.Errorf("backends: %w", err)
	}
	ports := make([]int, len(names))
	for i, n := range names {
		ports[i] = b.ports[n]
	}
	return ports, b.stop, nil
}

func (r *soakRun) startSeamless(ctx context.Context) error {
	addrs, err := freeAddrs(3)
	if err != nil {
		return err
	}
	r.tmpl = filepath.Join(r.root, "soak.tmpl")
	r.version = 1
	if err := writeConfig(r.tmpl, soakTemplate(addrs[0], r.version)); err != nil {
		return err
	}
	env := map[string]string{
		"SEAMLESS_SOURCES":      "consul,file",
		"SEAMLESS_SERVICES_DIR": filepath.Join(r.root, "services"),
		"SEAMLESS_TEMPLATE":     r.tmpl,
	}
	for k, v := range r.o.env {
		env[k] = v
	}
	r.opts = discoveryOpts{seamless: r.o.seamless, haproxy: r.o.haproxy, consul: r.agent.addr(),
		dir: filepath.Join(r.root, "seamless"), addrs: addrs, env: env}
	if r.d, err = startDiscovery(r.opts); err != nil {
		return err
	}
	r.log.Info("starting seamless", "http", r.d.http, "dir", r.opts.dir)
	if err := r.d.waitReady(ctx, readyTimeout); err != nil {
		return err
	}
	for _, st := range stableServices {
		path := "/" + st.name + "/"
		if err := poll(ctx, 20*time.Millisecond, readyTimeout, "seamless serves "+path, func() (bool, error) {
			if err := r.d.p.alive(); err != nil {
				return false, err
			}
			code, body, err := getHTTP(ctx, "http://"+r.d.http+path)
			if err != nil {
				return false, err
			}
			return code == 200, fmt.Errorf("%s answered %d: %.80q", path, code, body)
		}); err != nil {
			return r.d.withLog(err)
		}
	}
	return nil
}

// startLoads starts a keep-alive and a new-connection loop to each stable
// service, bounded by the run's length at the bursts' pace.
func (r *soakRun) startLoads(ctx context.Context, wg *sync.WaitGroup) {
	bursts := int64((r.o.duration+2*r.o.settle)/r.o.burstEvery) + 1
	for _, st := range stableServices {
		for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.NewConn} {
			l := &pacedLoad{target: r.d.http, path: "/" + st.name + "/", mode: mode,
				burst: r.o.burst, every: r.o.burstEvery, maxRequests: bursts * int64(r.o.burst)}
			r.loads = append(r.loads, l)
			wg.Go(func() {
				if err := l.run(ctx); err != nil {
					r.log.Error("load", "path", l.path, "mode", mode, "err", err)
				}
			})
		}
	}
}

// churn runs the changes for the run's duration, reading a sample every
// -sample and one at the end.
func (r *soakRun) churn(ctx context.Context) error {
	start := time.Now()
	var restarts []time.Duration
	for k := 1; k <= r.o.restarts; k++ {
		restarts = append(restarts, r.o.duration*time.Duration(k)/time.Duration(r.o.restarts+1))
	}
	nextSample, nextTemplate := time.Duration(0), r.o.templateEvery
	t := time.NewTicker(r.o.every)
	defer t.Stop()
	for {
		now := time.Since(start)
		if now >= nextSample {
			if err := r.takeSample(ctx, now); err != nil {
				return err
			}
			nextSample += r.o.sample
		}
		if now >= r.o.duration {
			break
		}
		var err error
		switch {
		case len(restarts) > 0 && now >= restarts[0]:
			restarts = restarts[1:]
			err = r.restartConsul(ctx)
		case now >= nextTemplate:
			nextTemplate += r.o.templateEvery
			err = r.editTemplate(ctx)
		default:
			var kind string
			kind, err = r.world.step(ctx)
			if err != nil {
				err = fmt.Errorf("%s: %w", kind, err)
			}
		}
		if err != nil {
			return err
		}
		if err := r.d.p.alive(); err != nil {
			return r.d.withLog(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	// The directory ends with what the world says: a malformed edit left
	// by the last step would keep the last good content in seamless but
	// nothing in a fresh render.
	if err := r.world.fixBad(); err != nil {
		return err
	}
	if last := r.samples[len(r.samples)-1].at; time.Since(start)-last > r.o.every {
		return r.takeSample(ctx, time.Since(start))
	}
	return nil
}

func (r *soakRun) takeSample(ctx context.Context, at time.Duration) error {
	s, err := r.reading(ctx, at)
	if err != nil {
		return err
	}
	r.samples = append(r.samples, s)
	return nil
}

// reading is a sample at the time at (since the churn began), logged.
func (r *soakRun) reading(ctx context.Context, at time.Duration) (soakSample, error) {
	s, err := readSample(ctx, r.d)
	if err != nil {
		return s, r.d.withLog(fmt.Errorf("reading a sample: %w", err))
	}
	s.at = at
	s.services, s.instances, _ = r.world.counts()
	s.requests, s.failed = r.loads.totals()
	r.log.Info("sample", "minute", fmt.Sprintf("%.1f", at.Minutes()), "rss_mib", s.rss>>20, "goroutines", s.goroutines,
		"fds", s.fds, "haproxy", s.haproxy, "zombies", s.zombies, "requests", s.requests, "failed", s.failed)
	return s, nil
}

// Slack of the reading at the start's catalog: a scrape or an apply in
// flight at either reading.
const (
	slackGoroutines = 3
	slackFds        = 1
)

// backToStart reads seamless every second until its goroutines and fds are
// back to the first reading's, within the slack, and returns that reading
// and how long it took; after 2 minutes, the last reading and false. The
// connections of the watches that ended stay in the Consul client's idle
// pool until its idle timeout (90 s) closes them.
func (r *soakRun) backToStart(ctx context.Context) (soakSample, time.Duration, bool, error) {
	first := r.samples[0]
	t0 := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s, err := r.reading(ctx, -1)
		if err != nil {
			return s, 0, false, err
		}
		if s.goroutines <= first.goroutines+slackGoroutines && s.fds <= first.fds+slackFds {
			return s, time.Since(t0), true, nil
		}
		if time.Since(t0) > 2*time.Minute {
			return s, time.Since(t0), false, nil
		}
		select {
		case <-ctx.Done():
			return s, 0, false, ctx.Err()
		case <-t.C:
		}
	}
}

// editTemplate writes the next version of the template, sends SIGHUP and
// waits until the running configuration is of that version.
func (r *soakRun) editTemplate(ctx context.Context) error {
	r.version++
	if err := writeConfig(r.tmpl, soakTemplate(r.d.http, r.version)); err != nil {
		return err
	}
	if err := r.d.p.signal(syscall.SIGHUP); err != nil {
		return err
	}
	want := []byte(fmt.Sprintf("# seamless soak template, version %d\n", r.version))
	err := poll(ctx, 20*time.Millisecond, 30*time.Second, fmt.Sprintf("template version %d runs", r.version), func() (bool, error) {
		if err := r.d.p.alive(); err != nil {
			return false, err
		}
		b, err := os.ReadFile(filepath.Join(r.d.stateDir, "haproxy.cfg"))
		return bytes.HasPrefix(b, want), err
	})
	if err != nil {
		r.failures = append(r.failures, err.Error())
		r.log.Error("template edit", "err", err)
	}
	r.world.done["template edit + HUP"]++
	return nil
}

// restartConsul stops the dev agent, starts it again empty and registers
// the Consul part of the world again.
func (r *soakRun) restartConsul(ctx context.Context) error {
	down, err := r.agent.restart(ctx)
	if err != nil {
		return fmt.Errorf("restarting consul: %w", err)
	}
	if err := r.world.reregister(ctx); err != nil {
		return err
	}
	r.world.done["consul restart"]++
	r.log.Info("consul restarted empty, world registered again", "down", down.Round(time.Millisecond))
	return nil
}

// converge waits until the configuration seamless runs equals a fresh
// render of the catalog and directory as they are, and returns how long
// that took; -1 (and a failed check) when it did not within -settle.
func (r *soakRun) converge(ctx context.Context, what string) (time.Duration, error) {
	t0 := time.Now()
	var running, fresh []byte
	err := poll(ctx, time.Second, r.o.settle, what+" configuration equals a fresh render", func() (bool, error) {
		if err := r.d.p.alive(); err != nil {
			return false, err
		}
		var err error
		if fresh, err = r.freshRender(ctx); err != nil {
			return false, err
		}
		if running, err = os.ReadFile(filepath.Join(r.d.stateDir, "haproxy.cfg")); err != nil {
			return false, err
		}
		return bytes.Equal(running, fresh), nil
	})
	if errors.Is(err, errExited) {
		return -1, r.d.withLog(err)
	}
	if err != nil {
		_ = os.WriteFile(filepath.Join(r.root, what+"-fresh-render.cfg"), fresh, 0o644)
		_ = os.WriteFile(filepath.Join(r.root, what+"-running.cfg"), running, 0o644)
		r.failures = append(r.failures, fmt.Sprintf("%v (first difference: %s; both kept in %s)", err, firstDiff(running, fresh), r.root))
		return -1, nil
	}
	return time.Since(t0), nil
}

// freshRender runs `seamless render` with seamless's own environment but
// empty state and run directories: no saved snapshot, no held removal,
// only what Consul and the directory hold now.
func (r *soakRun) freshRender(ctx context.Context) ([]byte, error) {
	dir, err := os.MkdirTemp(r.root, "render-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	env := r.opts.environ(filepath.Join(dir, "state"), filepath.Join(dir, "run"))
	for _, d := range []string{"state", "run"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.o.seamless, "render")
	cmd.Env = append(env, "SEAMLESS_STATUS_ADDR=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("seamless render: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// alerts returns up to n of HAProxy's [ALERT] lines from seamless's JSON
// log, so that the report says what they were after the run's directory
// is gone.
func alerts(logPath string, n int) []string {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		var rec struct {
			Time      time.Time `json:"time"`
			Msg       string    `json:"msg"`
			Component string    `json:"component"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Component != "haproxy" || !strings.Contains(rec.Msg, "[ALERT]") {
			continue
		}
		if len(out) == n {
			out = append(out, "...")
			break
		}
		out = append(out, rec.Time.Format("15:04:05.000")+" "+rec.Msg)
	}
	return out
}

// firstDiff names the first line where a and b differ.
func firstDiff(a, b []byte) string {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("line %d: running %q, fresh %q", i+1, x, y)
		}
	}
	return "none"
}

// actions says how many of each change the run made.
func (r *soakRun) actions() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.world.done)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.world.done[k]))
	}
	return strings.Join(parts, ", ")
}

// soakFx is the world's changes made real: Consul's agent API (as a
// service beside its agent registers) and files in the services
// directory, replaced atomically.
type soakFx struct {
	c   *api.Client
	dir string
}

// soakTTL is long enough never to expire in a run: the check changes only
// when the soak flips it.
const soakTTL = "1h"

func (f *soakFx) register(ctx context.Context, service string, in soakInst) error {
	status := api.HealthPassing
	if !in.passing {
		status = api.HealthCritical
	}
	return f.c.Agent().ServiceRegisterOpts(&api.AgentServiceRegistration{
		ID: in.id, Name: service, Address: "127.0.0.1", Port: in.port,
		Check: &api.AgentServiceCheck{CheckID: "ttl:" + in.id, TTL: soakTTL, Status: status},
	}, api.ServiceRegisterOpts{}.WithContext(ctx))
}

func (f *soakFx) deregister(ctx context.Context, id string) error {
	return f.c.Agent().ServiceDeregisterOpts(id, (&api.QueryOptions{}).WithContext(ctx))
}

func (f *soakFx) setHealth(ctx context.Context, id string, passing bool) error {
	status := api.HealthCritical
	if passing {
		status = api.HealthPassing
	}
	return f.c.Agent().UpdateTTLOpts("ttl:"+id, "soak", status, (&api.QueryOptions{}).WithContext(ctx))
}

func (f *soakFx) writeFile(name string, data []byte) error {
	return writeConfig(filepath.Join(f.dir, name+".yaml"), data)
}

func (f *soakFx) removeFile(name string) error {
	return os.Remove(filepath.Join(f.dir, name+".yaml"))
}
