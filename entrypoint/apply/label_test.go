package apply

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// An apply that found the configuration unchanged must not read as if a
// change had been applied: the catalog moved, the configuration did not.
func TestAnUnchangedApplyDoesNotClaimTheCatalogChange(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	// Meta is not rendered by lines: the bytes stay the same.
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Source: "consul", Name: "web", ID: "10.0.0.1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing, Meta: map[string]string{"v": "2"}},
	}}}}}
	testenv.Eventually(t, 5*time.Second, "the unchanged apply is recorded", func() bool { return len(r.a.History()) == 1 })
	h := r.a.History()[0]
	if h.How != metrics.Unchanged {
		t.Fatalf("record %+v, want unchanged", h)
	}
	if !strings.HasPrefix(h.Change, "the configuration is the same") || !strings.Contains(h.Change, "web: 1 instance changed") {
		t.Errorf("unchanged record's change %q: it must say that the configuration is the same, then what the catalog did", h.Change)
	}
}

// drainRender puts the instances in slots; an instance that left keeps its
// slot draining until drainUntil, then the slot is freed (maint).
type drainRender struct {
	mu         sync.Mutex
	drainUntil time.Time
}

func (d *drainRender) Render(st model.State) (model.Rendering, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := model.Rendering{Queries: []model.Query{model.LocalCatalog}, Structure: []byte("two slots")}
	insts := st.Local().Instances
	var b strings.Builder
	var slots []model.ServerSlot
	for i := range 2 {
		s := model.ServerSlot{Backend: "web", Server: fmt.Sprintf("s%d", i+1), Weight: 1, State: model.SlotMaint}
		switch {
		case i < len(insts):
			s.Instance, s.Address, s.Port, s.State = insts[i].ID, insts[i].Address, insts[i].Port, model.SlotReady
		case !d.drainUntil.IsZero() && time.Now().Before(d.drainUntil):
			s.Instance, s.Address, s.Port, s.State = "10.0.0.2", "10.0.0.2", 80, model.SlotDrain
			r.Recheck = d.drainUntil
		}
		slots = append(slots, s)
		fmt.Fprintf(&b, "server %s %s:%d %s\n", s.Server, s.Address, s.Port, s.State)
	}
	r.Config, r.Servers = []byte(b.String()), model.SlotsOf(slots)
	return r, nil
}

// When a drained slot is freed no service changed, but a slot did: the row
// says which, instead of "no service changed".
func TestADrainFinishedApplyNamesTheSlot(t *testing.T) {
	src := newSource("consul")
	d := &drainRender{}
	r := newRig(t, t.TempDir(), d, src)
	r.a.opts.Runtime = &fakeRuntime{}
	src.send("web=10.0.0.1", "web=10.0.0.2")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.drainUntil = time.Now().Add(300 * time.Millisecond)
	d.mu.Unlock()
	r.run(t)
	src.send("web=10.0.0.1")
	testenv.Eventually(t, 5*time.Second, "the drain and its end are applied", func() bool { return len(r.a.History()) == 2 })
	h := r.a.History()
	if h[1].Reason != "drain finished" {
		t.Fatalf("second record %+v, want the end of the drain", h[1])
	}
	if h[1].Change != "web/s2: drain → maint (freed)" {
		t.Errorf("drain finished row says %q, want the slot that was freed", h[1].Change)
	}
	if h[0].Change != "web: -1 instance" {
		t.Errorf("first record %+v, want the instance that left (its slot draining is that change)", h[0])
	}
}

// Consul registers itself as the service "consul" (ID "consul"); it is no
// backend of anyone's and must not be counted as discovered.
func TestConsulsOwnServiceIsNotCountedAsDiscovered(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Source: "consul", Node: "n1", Name: "consul", ID: "n1/consul", Address: "10.0.0.9", Port: 8300, Status: model.StatusPassing},
		{Source: "consul", Node: "n1", Name: "web", ID: "n1/web-1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing},
		// A user's service that happens to be called consul stays.
		{Source: "consul", Node: "n1", Name: "consul", ID: "n1/consul-proxy", Address: "10.0.0.8", Port: 80, Status: model.StatusPassing},
	}}}}}
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.m.Discovered.WithLabelValues("instances")); got != 2 {
		t.Errorf("seamless_discovered{kind=instances} = %v, want 2 (Consul's own service left out)", got)
	}
	if got := testutil.ToFloat64(r.m.Discovered.WithLabelValues("services")); got != 2 {
		t.Errorf("seamless_discovered{kind=services} = %v, want 2", got)
	}
}

// 5,000 new services are one short change at info and in /status; the
// full list is logged at debug.
func TestALongChangeIsSummarised(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	many := []string{"web=10.0.0.1"}
	for i := range 5000 {
		many = append(many, fmt.Sprintf("svc%04d=10.1.%d.%d", i, i/250, i%250))
	}
	src.send(many...)
	testenv.Eventually(t, 5*time.Second, "the change is applied", func() bool { return len(r.a.History()) == 1 })
	c := r.a.History()[0].Change
	if len(c) > 1024 || !strings.HasPrefix(c, "svc0000: new service (1 instance); ") || !strings.Contains(c, "(+4995 more)") {
		t.Errorf("change of %d bytes: %.300s", len(c), c)
	}
}
