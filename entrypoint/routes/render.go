package routes

import (
	"cmp"
	_ "embed"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

//go:embed default.cfg.tmpl
var defaultTemplate string

var tmpl = template.Must(template.New("default.cfg.tmpl").Option("missingkey=error").Parse(defaultTemplate))

// Renderer renders the built-in configuration. It implements
// model.Renderer.
type Renderer struct {
	http      bind
	stats     bind // port 0: no stats frontend
	policy    Policy
	slots     int // minimum slots per backend; 0: named servers, no slots
	checks    bool
	passive   bool
	drain     time.Duration
	stateFile string
	mapDir    string // "": no hosts map (hostmap.go)
	mapMin    int
	maps      mapSweep
	table     *SlotTable
	refusals  *Refusals
	frags     fragments    // the backends' text by their inputs
	services  serviceCache // each service's routes by its instances
	servers   slotCache    // each backend's servers by its slots
	plans     planCache    // each backend's unchanged plan by its servers
	checked   checked      // the strings the last rendering checked
	mu        sync.Mutex   // one rendering at a time: shaped and backends
	shaped    shapedView   // the view's parts that follow the routes alone
	backends  []viewBackend
	now       func() time.Time
	log       *slog.Logger
}

var _ model.Renderer = (*Renderer)(nil)

// New validates the options; its errors name the environment variable at
// fault. log may be nil.
func New(opts Options, log *slog.Logger) (*Renderer, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	httpB, statsB, err := opts.validate()
	if err != nil {
		return nil, err
	}
	reserved := map[int]string{httpB.port: "SEAMLESS_HTTP_BIND"}
	httpB.reserve(reserved) // HTTPS (https.go)
	if statsB.port != 0 {
		reserved[statsB.port] = "SEAMLESS_STATS_BIND"
	}
	// seamless's own listeners: a frontend on their ports could never bind.
	for addr, name := range map[string]string{opts.StatusAddr: "SEAMLESS_STATUS_ADDR", opts.DebugAddr: "SEAMLESS_DEBUG_ADDR"} {
		if _, p, err := net.SplitHostPort(addr); err == nil {
			if port, err := strconv.Atoi(p); err == nil && port > 0 {
				reserved[port] = name
			}
		}
	}
	r := &Renderer{
		http:      httpB,
		stats:     statsB,
		policy:    Policy{Health: opts.Health, Reserved: reserved, Sources: opts.Sources},
		slots:     opts.Slots,
		checks:    !opts.NoHealthChecks,
		passive:   opts.PassiveChecks,
		drain:     opts.DrainTimeout,
		stateFile: opts.StateFile,
		mapDir:    opts.HostMapDir,
		mapMin:    cmp.Or(opts.hostMapMin, hostMapMin),
		table:     opts.Table,
		refusals:  opts.Refusals,
		now:       opts.Now,
		log:       log.With("component", "routes"),
	}
	if r.mapDir != "" && !fileRe.MatchString(filepath.Join(r.mapDir, "hosts-0123456789abcdef0123456789abcdef.map")) {
		log.Warn("the hosts map is not used: its directory's name has characters the configuration does not take; every host gets a rule",
			"dir", r.mapDir)
		r.mapDir = ""
	}
	if r.table == nil {
		r.table = NewSlotTable()
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.log.Debug("built-in configuration", "http_bind", httpB.String(), "stats_bind", opts.StatsBind,
		"health", strings.Join(opts.Health, ","))
	return r, nil
}

// Build is Build with the renderer's health filter and reserved ports.
func (r *Renderer) Build(c model.Catalog) (Routes, []Skip) { return Build(c, r.policy) }

// Render renders the configuration from the local catalog: a pure function
// of the State, the committed slot table and the clock, which changes
// nothing. The rendering's Commit makes its slot assignment the table's
// and counts its refusals: call it once HAProxy runs the rendering. Until
// a catalog has arrived the rendering lists it as Missing and has no
// Config.
func (r *Renderer) Render(st model.State) (model.Rendering, error) {
	out, plan, skipped, err := r.render(st)
	if err != nil || out.Config == nil {
		return out, err
	}
	var mapPath string
	if len(out.Files) > 0 {
		mapPath = out.Files[0].Path
	}
	r.maps.rendered(mapPath)
	out.Commit = func() { r.commit(plan, skipped); r.keepMap(mapPath); r.http.tls.commitHosts(out.Routes) }
	return out, nil
}

// keepMap removes the hosts maps but path, which HAProxy now reads ("":
// none): those an earlier run left, and those of renderings HAProxy did
// not take.
func (r *Renderer) keepMap(path string) {
	if r.mapDir != "" && r.maps.sweep(path) {
		removeHostMaps(r.mapDir, path)
	}
}

func (r *Renderer) commit(plan slotPlan, skipped []Skip) {
	if r.slots > 0 {
		r.table.commit(plan)
	}
	if r.refusals != nil {
		r.refusals.observe(skipped)
	}
}

// render is Render with what Commit would commit.
func (r *Renderer) render(st model.State) (model.Rendering, slotPlan, []Skip, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := model.Rendering{Queries: []model.Query{model.LocalCatalog}}
	res, ok := st.Result(model.LocalCatalog)
	if !ok {
		out.Missing = []model.Query{model.LocalCatalog}
		return out, slotPlan{}, nil, nil
	}
	var c model.Catalog
	if res.Catalog != nil {
		c = *res.Catalog
	}
	rt, skipped := buildCached(c, r.policy, &r.services)
	for _, s := range skipped {
		out.Skipped = append(out.Skipped, s.String())
	}
	v, plan, err := r.view(rt, r.now())
	out.Routes = r.shaped.routes // rt's, made by view
	if err != nil {
		return out, slotPlan{}, nil, err
	}
	if err := r.fitFDs(v); err != nil {
		return out, slotPlan{}, nil, err
	}
	if m := r.shaped.hostMap; m != nil {
		out.Files = []model.File{{Path: m.path, Data: m.text}}
	}
	config, structure, err := r.frags.execute(v)
	if err != nil {
		return out, slotPlan{}, nil, err
	}
	out.Config = config
	out.NoHealthChecks = !r.checks
	if r.slots > 0 {
		r.fillSlots(&out, v)
		out.Structure = structure
	}
	return out, plan, skipped, nil
}

// fillSlots describes the slots of v, each backend's list shared with
// the last rendering when its slots did not change (slotCache); the
// structure around them is digested with the backends' text
// (fragments.go).
func (r *Renderer) fillSlots(out *model.Rendering, v view) {
	lists := make([][]model.ServerSlot, 0, len(v.Backends))
	for _, b := range v.Backends {
		lists = append(lists, b.slots)
		if !b.recheck.IsZero() && (out.Recheck.IsZero() || b.recheck.Before(out.Recheck)) {
			out.Recheck = b.recheck
		}
	}
	if !out.Recheck.IsZero() {
		out.Recheck = out.Recheck.Add(drainSlack(r.drain))
	}
	out.Servers = model.SlotsByBackend(lists)
}

// drainSlack is how long a drain that ended may wait for its slot to be
// freed: any rendering after the end frees it, and the one due for it
// waits this long, so that drains ending close together, and changes
// coming meanwhile, free their slots in one apply rather than one each
// (a churning catalog moves an instance, and ends a drain, every few
// seconds). A quarter of the drain, at most 5 s.
func drainSlack(drain time.Duration) time.Duration { return min(drain/4, 5*time.Second) }

// view is what the template sees: only strings that passed a check below.
type view struct {
	StateFile string // "" without a server-state file
	// Checks puts HAProxy's health checks on every server, free slots
	// too: a server declared without check cannot get one at runtime
	// (`enable health` is refused). Each costs a file descriptor (fds.go).
	Checks bool
	// Passive: the checks watch real traffic too (Options.PassiveChecks).
	Passive   bool
	HTTPBind  string
	StatsBind string // "" without stats
	Rules     []viewRule
	Default   string
	Listeners []viewListener
	Backends  []viewBackend
	HTTPS     viewHTTPS // https.go
}

type viewRule struct {
	Backend   string
	HostMatch string // "str" or "end"; "" with Host ""
	Host      string // "a.example", ".example" (a wildcard's suffix) or ""
	Path      string // "/api/" (the prefix and a slash) or "" for "/"
	Map       string // set alone: look the host up in this map (hostmap.go)
}

type viewListener struct{ Name, Bind, Backend string }

type viewBackend struct {
	Name    string
	TCP     bool
	Servers []viewServer
	slots   []model.ServerSlot
	held    []slot // what slots describes
	recheck time.Time
}

// viewServer is what the template sees of a server: its slot, read
// through methods, so that the template's view of every backend's 16
// slots or more is a pointer each, not a copy and an address string.
type viewServer struct{ s *model.ServerSlot }

func (v viewServer) Name() string { return v.s.Server }

// Addr is host:port as a server line takes it; a free slot's points at
// nothing that listens.
func (v viewServer) Addr() string {
	if v.s.Instance == "" {
		return unusedAddr
	}
	return Address{Host: v.s.Address, IPv6: strings.Contains(v.s.Address, ":")}.HostPort(v.s.Port)
}

func (v viewServer) Weight() int { return v.s.Weight }

// Disabled: a free slot, or a removed instance's that drains.
func (v viewServer) Disabled() bool { return v.s.State != model.SlotReady }

// viewServers is the template's view of slots.
func viewServers(slots []model.ServerSlot) []viewServer {
	vs := make([]viewServer, len(slots))
	for i := range slots {
		vs[i] = viewServer{&slots[i]}
	}
	return vs
}

// sameServers: a and b show the same servers.
func sameServers(a, b []viewServer) bool {
	return slices.EqualFunc(a, b, func(x, y viewServer) bool { return *x.s == *y.s })
}

// The shapes every string in a view must have. Routes are validated when
// they are built; this is the second lock, at the door of the template, so
// that no future change to Build can print an untrusted byte.
var (
	identRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,160}$`)
	hostRe  = regexp.MustCompile(`^[a-z0-9.-]{1,254}$`)
	pathRe  = regexp.MustCompile(`^/[A-Za-z0-9._~/:@+,;=-]{1,257}$`)
	addrRe  = regexp.MustCompile(`^(?:[a-z0-9._-]{1,254}|\[[0-9a-f:.]{2,45}\]):[0-9]{1,5}$`)
	bindRe  = regexp.MustCompile(`^(?:[0-9.]{7,15}|\[[0-9a-f:.]{2,45}\])?:[0-9]{1,5}$`)
	fileRe  = regexp.MustCompile(`^/[A-Za-z0-9._/-]{1,1000}$`)
)

func check(what string, re *regexp.Regexp, s string) error {
	if !re.MatchString(s) {
		return fmt.Errorf("default configuration: internal error: %s %q would reach the configuration unchecked", what, s)
	}
	return nil
}

// checked memoises check for the strings of the last rendering: most of
// them (every backend's name, every host) are the same from one change to
// the next. It keeps only what the last rendering checked: each entry
// holds the rendering that last checked it, and the others are swept out
// when they are as many as the kept ones (a map kept and updated in place
// costs a rendering far less than a new one filled).
type checked struct {
	mu   sync.Mutex
	gen  uint64 // the rendering now checking
	seen map[checkKey]uint64
	hits int // entries checked by the current rendering
}

type checkKey struct {
	re *regexp.Regexp
	s  string
}

func (c *checked) check(what string, re *regexp.Regexp, s string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen, c.gen = map[checkKey]uint64{}, 1
	}
	k := checkKey{re, s}
	g, ok := c.seen[k]
	if g == c.gen {
		return nil
	}
	if !ok || g != c.gen-1 { // checked by no rendering kept
		if err := check(what, re, s); err != nil {
			return err
		}
	}
	c.seen[k] = c.gen
	c.hits++
	return nil
}

// done ends a rendering's checks.
func (c *checked) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) > 2*c.hits {
		maps.DeleteFunc(c.seen, func(_ checkKey, g uint64) bool { return g != c.gen })
	}
	c.gen++
	c.hits = 0
}

// view checks every string of rt for the template and places the servers
// into slots planned from the committed table at now. Its Backends are
// the renderer's, made again by the next view.
func (r *Renderer) view(rt Routes, now time.Time) (view, slotPlan, error) {
	v := view{HTTPBind: r.http.String(), Checks: r.checks, Passive: r.passive}
	defer r.checked.done()
	firstErr := r.checked.check("bind", bindRe, v.HTTPBind)
	keep := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	if r.stats.port != 0 {
		v.StatsBind = r.stats.String()
		keep(r.checked.check("bind", bindRe, v.StatsBind))
	}
	r.shape(rt)
	v.Rules, v.Default, v.Listeners, v.HTTPS = r.shaped.rules, r.shaped.def, r.shaped.listeners, r.shaped.https
	keep(r.shaped.err)
	if r.stateFile != "" {
		v.StateFile = r.stateFile
		keep(r.checked.check("server-state file", fileRe, v.StateFile))
	}
	committed := r.table.committed()
	defer r.servers.done()
	defer r.plans.done()
	plan := newPlanner(committed)
	backends := r.backends[:0]
	for _, s := range rt.Services {
		for _, b := range []struct {
			name string
			tcp  bool
		}{{s.HTTPBackend, false}, {s.TCPBackend, true}} {
			if b.name == "" {
				continue
			}
			vb := viewBackend{Name: b.name, TCP: b.tcp}
			if r.slots > 0 {
				cs, found := committed.get(b.name)
				vb.held, vb.recheck = r.plans.plan(b.name, cs, s.Servers, r.slots, r.drain, now)
				plan.set(b.name, cs, vb.held, found)
				vb.Servers, vb.slots = r.servers.of(b.name, vb.held)
			} else {
				ms := make([]model.ServerSlot, len(s.Servers))
				for i, srv := range s.Servers {
					ms[i] = model.ServerSlot{Backend: b.name, Server: srv.Name, Instance: srv.Instance,
						Address: srv.Address.Host, Port: srv.Port, Weight: srv.Weight, State: model.SlotReady}
				}
				vb.Servers = viewServers(ms)
			}
			// The servers are checked where the backend's text is made
			// (fragments.backends), once per change of them.
			backends = append(backends, vb)
		}
	}
	r.backends, v.Backends = backends, backends
	if firstErr != nil {
		return view{}, slotPlan{}, firstErr
	}
	return v, plan.plan(func(yield func(string, []slot)) {
		for _, b := range backends {
			yield(b.Name, b.held)
		}
	}), nil
}
