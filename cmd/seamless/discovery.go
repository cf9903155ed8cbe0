package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/entrypoint/discovery/consul"
	"github.com/seamless-lb/seamless/entrypoint/discovery/docker"
	"github.com/seamless-lb/seamless/entrypoint/discovery/file"
	"github.com/seamless-lb/seamless/entrypoint/discovery/guard"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/entrypoint/template"
)

// renderedName is the file HAProxy runs in discovery mode, in
// SEAMLESS_STATE_DIR.
const renderedName = "haproxy.cfg"

// newSources builds the discovery sources of SEAMLESS_SOURCES, in order,
// each behind the removal guard. Their configuration errors surface here,
// before anything starts. serving, when not nil, is closed once HAProxy
// serves (consul.Config.Serving).
func newSources(cfg *config.Config, serving <-chan struct{}, log *slog.Logger) ([]model.Source, error) {
	srcs, err := newRawSources(cfg, serving, log)
	health := model.ParseHealth(cfg.ConsulHealth)
	routed := func(status string) bool { return model.HealthFilter(health, status) }
	for i, s := range srcs {
		srcs[i] = guard.Wrap(s, guard.Options{Percent: cfg.RemovalGuard, Hold: cfg.RemovalHold, Routed: routed, Log: log})
	}
	return srcs, err
}

func newRawSources(cfg *config.Config, serving <-chan struct{}, log *slog.Logger) ([]model.Source, error) {
	var out []model.Source
	for _, name := range cfg.SourceList() {
		switch name {
		case config.SourceConsul:
			s, err := consul.New(consul.Config{
				TagFilter: cfg.ConsulTag, Datacenter: cfg.ConsulDatacenter, Stale: cfg.ConsulStale,
				Watches: cfg.ConsulWatches, MaxStale: cfg.ConsulMaxStale, Agents: cfg.ConsulAgents(), WaitTime: cfg.ConsulQueryWait,
				Wanted: consulWanted(cfg), Serving: serving,
			}, log)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		case config.SourceDocker:
			s, err := docker.New(docker.Config{Network: cfg.DockerNetwork, Rescan: cfg.DockerRescan}, log)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		case config.SourceFile:
			saved := func() (model.Snapshot, error) {
				s, _, err := apply.LoadSnapshot(cfg.StateDir, file.Name)
				return s, err
			}
			s, err := file.New(file.Config{Dir: cfg.ServicesDir, Rescan: cfg.ServicesRescan, Saved: saved}, log)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// consulWanted is which Consul services are watched: with the built-in
// template, only those it can route. Not with another source beside
// Consul: the built-in template routes every instance of a service once
// one of them, from any source, has a seamless.* tag, so an untagged
// Consul service may be routed because a Docker container of that name
// is. A user's template may read any service: every one is watched,
// unless SEAMLESS_CONSUL_SERVICES names them (the template then refuses
// to read any other, see watchedServices).
func consulWanted(cfg *config.Config) func(string, []string) bool {
	if cfg.Template != "" {
		if w := watchedServices(cfg); w != nil {
			return func(name string, _ []string) bool { return w(name) }
		}
		return nil
	}
	if !slices.Equal(cfg.SourceList(), []string{config.SourceConsul}) {
		return nil
	}
	return routes.Routed
}

// watchedServices matches SEAMLESS_CONSUL_SERVICES; nil when unset. The
// patterns were checked by config.Load.
func watchedServices(cfg *config.Config) func(string) bool {
	patterns := cfg.ConsulServicePatterns()
	if len(patterns) == 0 {
		return nil
	}
	return func(name string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool {
			ok, _ := path.Match(p, name)
			return ok
		})
	}
}

// rendererFactory returns what builds the renderer: the user's template,
// parsed again at every call (SIGHUP) and recorded in cur, or the built-in
// one, whose HTTPS frontend binds with https's files (crt-list "": no
// HTTPS frontend), and whose hosts map goes to mapDir (none when "": a
// rule per host).
func rendererFactory(cfg *config.Config, mapDir string, https httpsFiles, reg prometheus.Registerer, log *slog.Logger, cur *currentTemplate) func() (model.Renderer, error) {
	health := model.ParseHealth(cfg.ConsulHealth)
	table := routes.NewSlotTable() // outlives the renderers SIGHUP makes
	refusals := routes.NewRefusals()
	if reg != nil && cfg.Template == "" {
		reg.MustRegister(refusals)
	}
	if cfg.Template != "" {
		return func() (model.Renderer, error) {
			left, right, _ := cfg.Delims() // checked by config.Load
			t, err := template.Parse(cfg.Template, template.Options{DefaultHealth: health,
				LeftDelim: left, RightDelim: right, RawMeta: cfg.TemplateRawMeta, Watched: watchedServices(cfg),
				Log: log.With("component", "template")})
			if err != nil {
				return nil, err
			}
			cur.set(t)
			return t, nil
		}
	}
	httpsBind := ""
	if https.crtList != "" {
		httpsBind = cfg.HTTPSBind
	}
	return func() (model.Renderer, error) {
		return routes.New(routes.Options{HTTPBind: cfg.HTTPBind, StatsBind: cfg.StatsBind, StatusAddr: cfg.StatusAddr, DebugAddr: cfg.DebugAddr, Health: health,
			Slots: cfg.ServerSlots, NoHealthChecks: !cfg.HealthChecks, PassiveChecks: cfg.PassiveChecks, DrainTimeout: cfg.DrainTimeout, StateFile: serverStateFile(cfg), HostMapDir: mapDir, Table: table,
			Sources: cfg.SourceList(), Refusals: refusals, HTTPSBind: httpsBind, CrtList: https.crtList,
			ACMEMap: https.acmeMap, Hosts: https.hosts}, log)
	}
}

// serverStateFile is where the built-in template's HAProxy keeps runtime
// state across reloads; "" when nothing can change at runtime.
func serverStateFile(cfg *config.Config) string {
	if cfg.Template != "" || cfg.ServerSlots == 0 {
		return ""
	}
	return filepath.Join(cfg.StateDir, "server-state")
}

// discovery is the discovery half of serve: it owns the applier and the
// sources' lifetime.
type discovery struct {
	applier *apply.Applier
	cancel  context.CancelFunc
	done    chan struct{}
	running bool // run was called: done will be closed
}

// startDiscovery starts the sources and writes the first configuration to
// SEAMLESS_STATE_DIR/haproxy.cfg, which cl is pointed at. The reloader is
// given later, once it exists; serving is closed once HAProxy serves.
func startDiscovery(ctx context.Context, cfg *config.Config, cl *haproxy.CommandLine, validate func(context.Context, string) error,
	vouch func(string, []byte) error, reloader func() *reload.Reloader, cli *haproxy.MasterCLI, m *metrics.Metrics, hosts func([]string), serving <-chan struct{},
	haproxyVersion func() string, log *slog.Logger) (*discovery, error) {
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return nil, fmt.Errorf("SEAMLESS_STATE_DIR: %w", err)
	}
	stateFile := serverStateFile(cfg)
	if stateFile != "" {
		// A new master starts from the file alone: runtime state of an
		// earlier run must not come back.
		if err := apply.WriteFile(stateFile, []byte("1\n"), 0o640); err != nil {
			return nil, fmt.Errorf("SEAMLESS_STATE_DIR: %w", err)
		}
	}
	sources, err := newSources(cfg, serving, log)
	if err != nil {
		return nil, err
	}
	cur := &currentTemplate{}
	opts := apply.Options{
		Sources:      sources,
		NewRenderer:  rendererFactory(cfg, cfg.StateDir, httpsFilesAt(cfg, cfg.StateDir, hosts), m.Registry, log, cur),
		Path:         cl.ConfigFiles[0],
		StateDir:     cfg.StateDir,
		Wait:         cfg.Wait,
		StartTimeout: cfg.DiscoveryTimeout,
		Validate:     keepRefused(validate, cl.ConfigFiles[0], cur, log),
		Vouch:        vouch,
		// A template of yours is checked first: a refusal then names its
		// lines, which HAProxy's start cannot.
		FirstUnchecked: cfg.Template == "",
		Reload: func(ctx context.Context, reason string) (reload.Outcome, error) {
			return reloader().Do(ctx, reason)
		},
		StateFile: stateFile,
		Serving:   serving,
		Metrics:   m,
		Log:       log,
	}
	// Every mode: the built-in's slots change over it, and so do servers
	// that only moved in a template of yours.
	rt := haproxy.Runtime{CLI: cli, Connected: func(via string) { m.RuntimeConns.WithLabelValues(via).Inc() }}
	if p := workerSocket(cfg.RunDir); p != "" {
		rt.Worker = haproxy.NewWorkerSocket(p)
		rt.Generation = func() uint64 {
			if r := reloader(); r != nil {
				return r.Generation()
			}
			return 1 // no reloader yet: as if one were in flight
		}
	}
	opts.Runtime = rt
	if cfg.Template != "" {
		// The built-in has its slots; without them (SEAMLESS_SERVER_SLOTS=0)
		// every change reloads, as that setting says.
		opts.MovesInPlace = func() bool { return movesInPlace(haproxyVersion()) }
	}
	a, err := apply.New(opts)
	if err != nil {
		return nil, err
	}
	m.WatchSources(a.Statuses)
	for _, s := range sources {
		if c, ok := guard.Unwrap(s).(*consul.Source); ok {
			m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "seamless_consul_requests_total",
				Help: "HTTP requests made to Consul (blocking queries count once each): the cost of discovery, independent of the number of unchanged services.",
			}, func() float64 { return float64(c.Requests()) }))
			m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "seamless_consul_requests_in_flight",
				Help: "HTTP requests to Consul waiting for their answer: once steady, the held blocking queries (one per watched service, plus the service and node lists), each an open connection to the agent.",
			}, func() float64 { return float64(c.InFlight()) }))
			for _, outcome := range consul.ViewCheckOutcomes {
				m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
					Name:        "seamless_consul_view_checks_total",
					Help:        "Checks of the agent's streaming view of a service against the leader (after a failed query, or an answer below what was passed on), by outcome: agreed; differed (the view lags or went back, the servers' answer is followed until it catches up); started_over (Consul's index went back on the servers too); unknown (no answer that could tell; checked again 5 s later).",
					ConstLabels: prometheus.Labels{"outcome": outcome},
				}, func() float64 { return float64(c.ViewChecks(outcome)) }))
			}
			for _, state := range []string{"listed", "watched"} {
				m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name:        "seamless_consul_services",
					Help:        "Services of the Consul catalogs by state: listed (in /v1/catalog/services, with SEAMLESS_CONSUL_TAG when set), watched (used, so read: with the built-in template and Consul as the only source, those with a seamless.* tag; otherwise all).",
					ConstLabels: prometheus.Labels{"state": state},
				}, func() float64 {
					listed, watched := c.Services()
					if state == "listed" {
						return float64(listed)
					}
					return float64(watched)
				}))
			}
		}
	}
	// The sources live until discovery is stopped, not until ctx ends:
	// HAProxy stops last. Only while the first configuration is being
	// made does ctx ending (a stop signal) end them, and the wait for them.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	log.Info("discovery starting", "sources", cfg.SourceList(), "template", templateName(cfg),
		"config", cl.ConfigFiles[0], "wait", cfg.Wait, "timeout", cfg.DiscoveryTimeout)
	starting := context.AfterFunc(ctx, cancel)
	err = a.Start(sctx)
	starting()
	if err != nil {
		cancel()
		a.Wait()
		return nil, err
	}
	return &discovery{applier: a, cancel: cancel, done: make(chan struct{})}, nil
}

// run applies changes until stop.
func (d *discovery) run() {
	ctx, cancel := context.WithCancel(context.Background())
	stopped := d.cancel
	d.cancel = func() { cancel(); stopped() }
	d.running = true
	go func() { defer close(d.done); d.applier.Run(ctx) }()
}

// halt ends the applier and the sources without waiting for them.
func (d *discovery) halt() { d.cancel() }

// stop ends the applier (if run started it) and the sources. serve can
// return before run, when HAProxy cannot be started.
func (d *discovery) stop() {
	d.cancel()
	if d.running {
		<-d.done
	}
	d.applier.Wait()
}

func templateName(cfg *config.Config) string {
	if cfg.Template == "" {
		return "built-in"
	}
	return cfg.Template
}

// validateOnce makes the reloader's validator v skip haproxy -c (and the
// bind probe) on the bytes that a candidate check through
// candidateValidator(v, ...) has just passed: an apply validates once.
func validateOnce(v *haproxy.Validator) { v.PassFrom = &haproxy.Passed{} }

// candidateValidator checks a candidate file with the arguments HAProxy
// runs with, the rendered file swapped for the candidate.
func candidateValidator(v *haproxy.Validator, path string) func(context.Context, string) error {
	return func(ctx context.Context, cand string) error { return candidate(v, path, cand).Check(ctx) }
}

// candidateVoucher vouches for a candidate file, whose content is data, as
// candidateValidator would check it: the reloader's check of the file it
// becomes passes.
func candidateVoucher(v *haproxy.Validator, path string) func(string, []byte) error {
	return func(cand string, data []byte) error { return candidate(v, path, cand).Vouch(cand, data) }
}

// candidate is v with the rendered file path swapped for cand, whose
// pass goes to v's next check of the same bytes: the reloader's of the
// file cand becomes (see validateOnce).
func candidate(v *haproxy.Validator, path, cand string) *haproxy.Validator {
	c := *v
	c.PassTo, c.PassFrom = v.PassFrom, nil
	c.Args = slices.Clone(v.Args)
	for i, a := range c.Args {
		if a == path {
			c.Args[i] = cand
		}
	}
	return &c
}

// render prints the configuration discovery would apply now, or, with
// validate, checks it too (`seamless check` in discovery mode).
func render(ctx context.Context, cfg *config.Config, bin string, args []string, validate bool, stdout, stderr io.Writer, log *slog.Logger) int {
	if !cfg.Discovery() {
		fmt.Fprintln(stderr, "seamless render: no discovery configured (set SEAMLESS_SOURCES or SEAMLESS_TEMPLATE)")
		return exitUsage
	}
	sources, err := newSources(cfg, nil, log)
	if err != nil {
		fmt.Fprintf(stderr, "seamless render: %v\n", err)
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "seamless-render-")
	if err != nil {
		fmt.Fprintf(stderr, "seamless render: %v\n", err)
		return exitNoRun
	}
	keep := false // the refused candidate, which the error names
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	// A check needs the certificates the configuration names: made in
	// dir, never in a running seamless's state directory.
	certsAt := cfg.StateDir
	if validate && httpsEnabled(cfg) {
		if _, err := prepareCerts(cfg, dir, nil, nil, nil, log); err != nil {
			fmt.Fprintf(stderr, "seamless check: %v\n", err)
			return exitUsage
		}
		certsAt = dir
	}
	cur := &currentTemplate{}
	// A check's hosts map goes to dir; a printed configuration has a rule
	// per host instead, which routes alike and names no file.
	mapDir := ""
	if validate {
		mapDir = dir
	}
	// The saved snapshots of a running seamless are read, never written.
	a, err := apply.New(apply.Options{
		Sources: sources, NewRenderer: rendererFactory(cfg, mapDir, httpsFilesAt(cfg, certsAt, nil), nil, log, cur),
		Path: filepath.Join(dir, renderedName), StateDir: cfg.StateDir, ReadOnly: true,
		StartTimeout: cfg.DiscoveryTimeout,
		Validate:     func(context.Context, string) error { return nil },
		Reload:       func(context.Context, string) (reload.Outcome, error) { return reload.Outcome{}, nil },
		Log:          log,
	})
	if err != nil {
		fmt.Fprintf(stderr, "seamless render: %v\n", err)
		return exitNoRun
	}
	sctx, cancel := context.WithCancel(ctx)
	rend, err := a.Render(sctx)
	cancel()
	a.Wait()
	if err != nil {
		fmt.Fprintf(stderr, "seamless render: %v\n", err)
		return exitInvalid
	}
	for _, s := range rend.Skipped {
		fmt.Fprintf(stderr, "left out: %s\n", s)
	}
	if len(rend.Missing) > 0 {
		fmt.Fprintf(stderr, "seamless render: no answer within SEAMLESS_DISCOVERY_TIMEOUT (%s) for: %s\n", cfg.DiscoveryTimeout, joinQueries(rend.Missing))
	}
	if !validate {
		stdout.Write(rend.Config)
		if len(rend.Missing) > 0 {
			return exitInvalid
		}
		return 0
	}
	path := filepath.Join(dir, renderedName)
	for _, f := range append(rend.Files, model.File{Path: path, Data: rend.Config}) {
		if err := os.WriteFile(f.Path, f.Data, 0o640); err != nil {
			fmt.Fprintf(stderr, "seamless check: %v\n", err)
			return exitNoRun
		}
	}
	cl, err := haproxy.ParseCommandLine(args, filepath.Join(dir, "master.sock"))
	if err != nil {
		fmt.Fprintf(stderr, "seamless check: %v\n", err)
		return exitUsage
	}
	var errOut strings.Builder
	code := checkFiles(ctx, cfg, bin, cl.WithConfig(path), dir, stdout, &errOut, log)
	fmt.Fprint(stderr, cur.explain(errOut.String(), path, path, rend.Config))
	if code == exitInvalid {
		keep = true
		fmt.Fprintf(stderr, "seamless check: the refused configuration is kept at %s\n", path)
	}
	return code
}

func joinQueries(qs []model.Query) string {
	s := make([]string, len(qs))
	for i, q := range qs {
		s[i] = q.String()
	}
	return strings.Join(s, ", ")
}

// movesInPlace reports whether HAProxy version sends a keep-alive
// client's next request to a server's new address after `set server
// addr`: 3.0 and later (measured with 3.0 and 3.2, 10 runs of 10 each,
// a client sending on one connection throughout); 2.6 kept sending it to
// the old address (7 of 10).
func movesInPlace(version string) bool { return haproxy.VersionAtLeast(version, 3, 0) }
