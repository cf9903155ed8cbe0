package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// The fakes stand at the unit's edges (a source fed by the test, haproxy -c
// and the reload); cmd/seamless runs the pipeline with real HAProxy and
// Consul.

type fakeSource struct {
	name string
	ch   chan model.Snapshot
	mu   sync.Mutex
	want []model.Query
}

func newSource(name string) *fakeSource {
	return &fakeSource{name: name, ch: make(chan model.Snapshot, 16)}
}

func (f *fakeSource) Name() string { return f.name }
func (f *fakeSource) Want(qs []model.Query) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.want = qs
}
func (f *fakeSource) wanted() []model.Query {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.want
}
func (f *fakeSource) Run(ctx context.Context, out chan<- model.Snapshot) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-f.ch:
			select {
			case out <- s:
			case <-ctx.Done():
				return
			}
		}
	}
}

// send reports the instances "name=address" of the source.
func (f *fakeSource) send(instances ...string) {
	c := &model.Catalog{}
	for _, s := range instances {
		name, addr, _ := strings.Cut(s, "=")
		c.Instances = append(c.Instances, model.Instance{Source: f.name, Name: name, ID: addr, Address: addr, Port: 80, Status: model.StatusPassing})
	}
	f.ch <- model.Snapshot{Source: f.name, Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
}

// lines renders one line per instance; with kv it also needs a KV key.
type lines struct{ kv bool }

func (l lines) Render(st model.State) (model.Rendering, error) {
	r := model.Rendering{Queries: []model.Query{model.LocalCatalog}}
	if _, ok := st.Result(model.LocalCatalog); !ok {
		r.Missing = append(r.Missing, model.LocalCatalog)
	}
	var b strings.Builder
	if l.kv {
		q := model.Query{Kind: model.QueryKey, Key: "k"}
		r.Queries = append(r.Queries, q)
		if _, ok := st.Result(q); !ok {
			r.Missing = append(r.Missing, q)
		}
	}
	for _, in := range st.Local().Instances {
		fmt.Fprintf(&b, "server %s %s\n", in.Name, in.Address)
	}
	r.Config = []byte(b.String())
	return r, nil
}

type rig struct {
	a        *Applier
	path     string
	m        *metrics.Metrics
	mu       sync.Mutex
	reloads  []string
	reloadOK bool
	checks   int          // configurations validated
	logs     bytes.Buffer // the applier's log, at debug level
	cancel   context.CancelFunc
}

func (r *rig) checkCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checks
}

func (r *rig) logged(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Contains(r.logs.String(), s)
}

// Write takes the applier's log lines.
func (r *rig) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logs.Write(p)
}

func (r *rig) reloadCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reloads)
}

func (r *rig) setReloadOK(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reloadOK = ok
}

func newRig(t *testing.T, dir string, renderer model.Renderer, sources ...model.Source) *rig {
	t.Helper()
	r := &rig{path: filepath.Join(dir, "haproxy.cfg"), m: metrics.New(), reloadOK: true}
	a, err := New(Options{
		Sources:      sources,
		NewRenderer:  func() (model.Renderer, error) { return renderer, nil },
		Path:         r.path,
		StateDir:     dir,
		StartTimeout: 300 * time.Millisecond,
		Log:          slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Validate: func(_ context.Context, path string) error {
			r.mu.Lock()
			r.checks++
			r.mu.Unlock()
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if strings.Contains(string(b), "bad") {
				return &haproxy.ConfigError{Alerts: []string{"[ALERT] " + path + ": bad server"}}
			}
			return nil
		},
		Reload: func(_ context.Context, reason string) (reload.Outcome, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.reloads = append(r.reloads, reason)
			return reload.Outcome{OK: r.reloadOK}, nil
		},
		Metrics: r.m,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.a = a
	r.cancel = func() {}
	t.Cleanup(func() { r.cancel(); a.Wait() })
	return r
}

func (r *rig) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (r *rig) file(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(r.path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func startCtx(t *testing.T, r *rig) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	prev := r.cancel
	r.cancel = func() { cancel(); prev() }
	return ctx
}

func TestStartWaitsForEverySourceThenWritesAndIsReady(t *testing.T) {
	c, f := newSource("consul"), newSource("file")
	r := newRig(t, t.TempDir(), lines{}, c, f)
	c.send("web=10.0.0.1")
	f.send("api=10.0.0.9")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if got, want := r.file(t), "server api 10.0.0.9\nserver web 10.0.0.1\n"; got != want {
		t.Errorf("file %q, want %q", got, want)
	}
	if err := r.a.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
}

func TestChangesReloadOnceAndUnchangedBytesDoNot(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	src.send("web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the new instance is applied", func() bool { return r.reloadCount() == 1 })
	if got := r.file(t); got != "server web 10.0.0.1\nserver web 10.0.0.2\n" {
		t.Errorf("file %q", got)
	}
	// The same data again, then a change that renders the same bytes.
	src.send("web=10.0.0.1", "web=10.0.0.2")
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Source: "consul", Name: "web", ID: "10.0.0.1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing, Meta: map[string]string{"v": "2"}},
		{Source: "consul", Name: "web", ID: "10.0.0.2", Address: "10.0.0.2", Port: 80, Status: model.StatusPassing},
	}}}}}
	testenv.Eventually(t, 5*time.Second, "the meta change is found unchanged", func() bool {
		return testutil.ToFloat64(r.m.Applies.WithLabelValues(metrics.Unchanged)) == 1
	})
	if n := r.reloadCount(); n != 1 {
		t.Errorf("%d reloads, want 1", n)
	}
}

func TestRefusedConfigLeavesTheRunningFileAndTheNextGoodOneApplies(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	src.send("web=bad")
	testenv.Eventually(t, 5*time.Second, "the refusal is counted", func() bool {
		return testutil.ToFloat64(r.m.ConfigErrors) == 1
	})
	if got := r.file(t); got != "server web 10.0.0.1\n" || r.reloadCount() != 0 {
		t.Errorf("after a refused render: file %q, %d reloads", got, r.reloadCount())
	}
	src.send("web=10.0.0.3")
	testenv.Eventually(t, 5*time.Second, "the next good one applies", func() bool { return r.reloadCount() == 1 })
	if got := r.file(t); got != "server web 10.0.0.3\n" {
		t.Errorf("file %q", got)
	}
}

// A change that renders the configuration HAProxy refused last (here a
// meta value the template does not use) is not checked again: the same
// bytes would fail the same way.
func TestARefusedRenderingIsNotCheckedAgain(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	src.send("web=bad")
	testenv.Eventually(t, 5*time.Second, "the refusal is counted", func() bool {
		return testutil.ToFloat64(r.m.ConfigErrors) == 1
	})
	checks := r.checkCount()
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Source: "consul", Name: "web", ID: "bad", Address: "bad", Port: 80, Status: model.StatusPassing, Meta: map[string]string{"v": "2"}},
	}}}}}
	testenv.Eventually(t, 5*time.Second, "the same rendering found refused before", func() bool {
		return r.logged("configuration already refused")
	})
	if n := r.checkCount(); n != checks || testutil.ToFloat64(r.m.ConfigErrors) != 1 {
		t.Errorf("the refused rendering was checked again: %d checks after %d, %v refusals", n, checks, testutil.ToFloat64(r.m.ConfigErrors))
	}
}

func TestAReloadHAProxyRefusesRollsTheFileBack(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.setReloadOK(false)
	r.run(t)
	src.send("web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the failure is counted", func() bool {
		return testutil.ToFloat64(r.m.Applies.WithLabelValues(metrics.Failed)) == 1
	})
	if got := r.file(t); got != "server web 10.0.0.1\n" {
		t.Errorf("file %q, want the running configuration back", got)
	}
}

func TestMissingDataIsFetchedBeforeApplying(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{kv: true}, src)
	src.send("web=10.0.0.1")
	// Without the key the start times out; no configuration existed, so
	// the incomplete one is written and the applier is not ready.
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if got := src.wanted(); len(got) != 2 || got[1].Key != "k" {
		t.Fatalf("wanted %v, want the catalog and key k", got)
	}
	if r.a.Ready() == nil {
		t.Error("ready although the template misses a key")
	}
	r.run(t)
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{
		model.LocalCatalog:               {Catalog: &model.Catalog{}},
		{Kind: model.QueryKey, Key: "k"}: {Pairs: []model.KVPair{{Key: "k", Value: "v"}}},
	}}
	testenv.Eventually(t, 5*time.Second, "ready once the key arrives", func() bool { return r.a.Ready() == nil })
}

func TestASilentSourceStartsFromItsSavedSnapshot(t *testing.T) {
	dir := t.TempDir()
	{
		src := newSource("consul")
		r := newRig(t, dir, lines{}, src)
		src.send("web=10.0.0.1")
		if err := r.a.Start(startCtx(t, r)); err != nil {
			t.Fatal(err)
		}
		r.cancel()
		r.a.Wait()
	}
	if err := os.Remove(filepath.Join(dir, "haproxy.cfg")); err != nil {
		t.Fatal(err)
	}
	src, files := newSource("consul"), newSource("file")
	r := newRig(t, dir, lines{}, src, files)
	files.send("api=10.0.0.9") // Consul says nothing: it is down
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if got, want := r.file(t), "server api 10.0.0.9\nserver web 10.0.0.1\n"; got != want {
		t.Errorf("file %q, want %q (Consul's saved data kept)", got, want)
	}
	if err := r.a.Ready(); err == nil {
		t.Error("ready although Consul never answered")
	}
	r.run(t)
	src.send("web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "ready once Consul answers", func() bool { return r.a.Ready() == nil })
	if got := r.file(t); !strings.Contains(got, "10.0.0.2") {
		t.Errorf("file %q lacks Consul's news", got)
	}
}

func TestSIGHUPReloadsEvenWhenUnchanged(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	r.a.Reload("SIGHUP")
	testenv.Eventually(t, 5*time.Second, "SIGHUP reloads", func() bool { return r.reloadCount() == 1 })
	if r.reloads[0] != "discovery: SIGHUP" {
		t.Errorf("reason %q", r.reloads[0])
	}
}

func TestNoConfigAtAllIsAnError(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=bad")
	err := r.a.Start(startCtx(t, r))
	if err == nil || !strings.Contains(err.Error(), "bad server") {
		t.Fatalf("Start: %v, want the validation error", err)
	}
	if _, err := os.Stat(r.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused configuration was left at %s", r.path)
	}
}

func TestASnapshotThatAnswersNothingKeepsTheSavedData(t *testing.T) {
	dir := t.TempDir()
	if err := SaveSnapshot(dir, model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
			{Source: "consul", Name: "web", ID: "1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing}}}},
	}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	src := newSource("consul")
	r := newRig(t, dir, lines{}, src)
	// Consul is down: its first snapshot answers no query.
	src.ch <- model.Snapshot{Source: "consul"}
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if got := r.file(t); got != "server web 10.0.0.1\n" {
		t.Errorf("file %q, want the saved instance", got)
	}
	if _, _, err := LoadSnapshot(dir, "consul"); err != nil {
		t.Errorf("saved snapshot lost: %v", err)
	}
	if r.a.Ready() == nil {
		t.Error("ready although Consul answered nothing")
	}
}

// slotLines renders one slot per instance, two slots in all, and the
// structure is the slot count: membership alone fits the runtime path.
type slotLines struct{}

func (slotLines) Render(st model.State) (model.Rendering, error) {
	r := model.Rendering{Queries: []model.Query{model.LocalCatalog}, Structure: []byte("two slots")}
	var b strings.Builder
	insts := st.Local().Instances
	var slots []model.ServerSlot
	for i := range 2 {
		s := model.ServerSlot{Backend: "web", Server: fmt.Sprintf("s%d", i+1), Weight: 1, State: model.SlotMaint}
		if i < len(insts) {
			s.Instance, s.Address, s.Port, s.State = insts[i].ID, insts[i].Address, insts[i].Port, model.SlotReady
		}
		slots = append(slots, s)
		fmt.Fprintf(&b, "server %s %s:%d %s\n", s.Server, s.Address, s.Port, s.State)
	}
	r.Config, r.Servers = []byte(b.String()), model.SlotsOf(slots)
	return r, nil
}

type fakeRuntime struct {
	mu    sync.Mutex
	fail  error
	cmds  []string
	state []haproxy.ServerState
}

func (f *fakeRuntime) Apply(_ context.Context, cmds []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.cmds = append(f.cmds, cmds...)
	return nil
}

func (f *fakeRuntime) ServersState(context.Context) (string, []haproxy.ServerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "1\n", f.state, nil
}

func TestMembershipChangesGoOverTheRuntimeAPIAndFallBackToAReload(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), slotLines{}, src)
	rt := &fakeRuntime{state: []haproxy.ServerState{
		{Backend: "web", Server: "s1", Address: "10.0.0.1", Port: 80, Weight: 1},
		{Backend: "web", Server: "s2", Address: "10.0.0.2", Port: 80, Weight: 1},
	}}
	r.a.opts.Runtime = rt
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	src.send("web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "applied over the runtime API", func() bool {
		return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)) == 1
	})
	if r.reloadCount() != 0 || !strings.Contains(r.file(t), "s2 10.0.0.2:80 ready") {
		t.Errorf("%d reloads, file %q", r.reloadCount(), r.file(t))
	}
	rt.mu.Lock()
	rt.fail = errors.New("dial unix master.sock: no such file")
	rt.mu.Unlock()
	src.send("web=10.0.0.1")
	testenv.Eventually(t, 5*time.Second, "a failed runtime update reloads instead", func() bool { return r.reloadCount() == 1 })
	if v := testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Failure)); v != 1 {
		t.Errorf("runtime failures = %v, want 1", v)
	}
	if !strings.Contains(r.file(t), "s2 :0 maint") {
		t.Errorf("file %q after the fallback reload", r.file(t))
	}
}

func TestHistoryKeepsTheLatestApplies(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	src.send("web=bad")
	testenv.Eventually(t, 5*time.Second, "the refusal recorded", func() bool { return len(r.a.History()) == 1 })
	src.send("web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "two applies recorded", func() bool { return len(r.a.History()) == 2 })
	h := r.a.History()
	if h[0].How != metrics.Refused || !strings.Contains(h[0].Error, "bad server") || h[0].Reason != "consul" {
		t.Errorf("first record %+v, want the refusal", h[0])
	}
	if h[1].How != metrics.Reloaded || h[1].Change != "web: +1 instance, -1 instance" {
		t.Errorf("second record %+v, want the reload", h[1])
	}
}

// A rendering found unchanged becomes the one behind the running bytes,
// and those bytes are its own: the renderer keeps its backends' texts in
// the newest rendering, so keeping the older array too held the
// configuration twice (7.5 MB more at 10,000 services × 10).
func TestAnUnchangedRenderingHoldsTheRunningBytesOnce(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Source: "consul", Name: "web", ID: "10.0.0.1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing, Meta: map[string]string{"v": "2"}},
	}}}}}
	testenv.Eventually(t, 5*time.Second, "the meta change is found unchanged", func() bool {
		return testutil.ToFloat64(r.m.Applies.WithLabelValues(metrics.Unchanged)) == 1
	})
	cancel()
	<-done // the applier's fields are the test's from here
	if len(r.a.running) == 0 || &r.a.running[0] != &r.a.runRend.Config[0] {
		t.Error("the running bytes are not the array of the rendering behind them")
	}
}

// A change while HAProxy loads its first configuration waits for it to
// serve: a runtime change would find no worker, and a reload during
// HAProxy's first load is answered busy or, once on 3.2, got no outcome
// for a minute. What comes meanwhile applies together.
func TestChangesWaitForHAProxyToServe(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	serving := make(chan struct{})
	r.a.opts.Serving = serving
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	src.send("web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the change is held or applied", func() bool {
		return r.logged("a change waits for HAProxy to serve its first configuration") || r.reloadCount() > 0
	})
	r.a.Reload("SIGHUP")
	testenv.Eventually(t, 5*time.Second, "the SIGHUP is held or applied", func() bool {
		return r.logged("this change waits too") && r.logged("SIGHUP") || r.reloadCount() > 1
	})
	if n := r.reloadCount(); n != 0 {
		t.Fatalf("%d reloads before HAProxy serves, want 0", n)
	}
	close(serving)
	testenv.Eventually(t, 5*time.Second, "the held changes apply once", func() bool { return r.reloadCount() == 1 })
	if got := r.file(t); got != "server web 10.0.0.1\nserver web 10.0.0.2\n" {
		t.Errorf("file %q", got)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if why := r.reloads[0]; !strings.Contains(why, "consul") || !strings.Contains(why, "SIGHUP") {
		t.Errorf("the reload's reason %q, want the change's and the SIGHUP's", why)
	}
}
