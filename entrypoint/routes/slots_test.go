package routes

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// stateFile is fixed, for the golden file; it holds no state, as before
// seamless's first reload.
const stateFile = "/tmp/seamless-routes-test/server-state"

func slotOpts(now *time.Time) Options {
	if err := os.MkdirAll(filepath.Dir(stateFile), 0o755); err == nil {
		_ = os.WriteFile(stateFile, []byte("1\n"), 0o644)
	}
	o := goldenOpts
	o.Slots, o.DrainTimeout, o.StateFile = 4, 10*time.Second, stateFile
	o.Now = func() time.Time { return *now }
	return o
}

func webs(n int) []model.Instance {
	var out []model.Instance
	for i := 1; i <= n; i++ {
		out = append(out, inst("web", fmt.Sprintf("web%d", i), fmt.Sprintf("10.0.0.%d", i), 8080, "seamless.http.host=web.example"))
	}
	return out
}

func slotStates(r model.Rendering) string {
	var b bytes.Buffer
	for _, s := range r.Servers.Flat() {
		fmt.Fprintf(&b, "%s=%s:%s ", s.Server, s.Instance, s.State)
	}
	return b.String()
}

func TestSlotsChangeMembershipWithoutChangingStructure(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	r := mustNew(t, slotOpts(&now))
	two := render(t, r, catalog(webs(2)...))
	golden(t, "slots.cfg", two.Config)
	haproxyCheck(t, two.Config)
	if got, want := slotStates(two), "s1=web1:ready s2=web2:ready s3=:maint s4=:maint "; got != want {
		t.Errorf("2 instances: %s, want %s", got, want)
	}

	four := render(t, r, catalog(webs(4)...))
	if !bytes.Equal(four.Structure, two.Structure) {
		t.Error("2 → 4 instances changed the structure; it fits the 4 slots")
	}
	if got, want := slotStates(four), "s1=web1:ready s2=web2:ready s3=web3:ready s4=web4:ready "; got != want {
		t.Errorf("4 instances: %s, want %s", got, want)
	}

	t.Log("a removed instance drains in its slot, then frees it")
	noTwo := append(webs(1), webs(4)[2:]...)
	drained := render(t, r, catalog(noTwo...))
	if got, want := slotStates(drained), "s1=web1:ready s2=web2:drain s3=web3:ready s4=web4:ready "; got != want {
		t.Errorf("web2 removed: %s, want %s", got, want)
	}
	if want := now.Add(10*time.Second + drainSlack(10*time.Second)); !drained.Recheck.Equal(want) {
		t.Errorf("recheck at %v, want the end of the drain and its slack, %v", drained.Recheck, want)
	}
	now = now.Add(10 * time.Second)
	// Any rendering once the drain ended frees the slot.
	freed := render(t, r, catalog(noTwo...))
	if got, want := slotStates(freed), "s1=web1:ready s2=:maint s3=web3:ready s4=web4:ready "; got != want {
		t.Errorf("after the drain: %s, want %s", got, want)
	}
	haproxyCheck(t, drained.Config)

	t.Log("a new instance takes the free slot; a fifth one needs more slots")
	five := render(t, r, catalog(append(noTwo, webs(6)[4:]...)...))
	if got, want := slotStates(five), "s1=web1:ready s2=web5:ready s3=web3:ready s4=web4:ready s5=web6:ready s6=:maint s7=:maint s8=:maint "; got != want {
		t.Errorf("grown: %s, want %s", got, want)
	}
	if bytes.Equal(five.Structure, two.Structure) {
		t.Error("growing to 8 slots kept the structure; it needs a reload")
	}
	api := render(t, r, catalog(append(webs(2), inst("api", "api1", "10.0.1.1", 80, "seamless.http.host=api.example"))...))
	if bytes.Equal(api.Structure, two.Structure) {
		t.Error("a new service kept the structure")
	}
}

// Drains that end close together are freed by one rendering: the recheck
// waits the slack after the first end, and frees every drain that ended
// by then; one that has not drains on.
func TestDrainsEndingCloseTogetherAreFreedTogether(t *testing.T) {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	now := start
	r := mustNew(t, slotOpts(&now))
	all := webs(4)
	render(t, r, catalog(all...))
	render(t, r, catalog(all[0], all[2], all[3])) // web2 drains until start+10s
	now = start.Add(time.Second)
	render(t, r, catalog(all[0], all[3])) // web3 until start+11s
	now = start.Add(5 * time.Second)
	third := render(t, r, catalog(all[0])) // web4 until start+15s
	slack := drainSlack(10 * time.Second)
	if slack != 2500*time.Millisecond {
		t.Errorf("slack of a 10s drain: %v, want a quarter of it", slack)
	}
	if want := start.Add(10*time.Second + slack); !third.Recheck.Equal(want) {
		t.Fatalf("recheck at %v, want web2's end and the slack, %v", third.Recheck, want)
	}
	now = third.Recheck
	due := render(t, r, catalog(all[0]))
	if got, want := slotStates(due), "s1=web1:ready s2=:maint s3=:maint s4=web4:drain "; got != want {
		t.Errorf("the recheck: %s, want web2's and web3's slots freed together, web4 draining on", got)
	}
	if want := start.Add(15*time.Second + slack); !due.Recheck.Equal(want) {
		t.Errorf("next recheck at %v, want web4's end and the slack, %v", due.Recheck, want)
	}
	if got := drainSlack(time.Hour); got != 5*time.Second {
		t.Errorf("slack of an hour's drain: %v, want at most 5s", got)
	}
}

func TestSlotsSurviveANewRenderer(t *testing.T) {
	now := time.Now()
	o := slotOpts(&now)
	o.Table = NewSlotTable()
	first := render(t, mustNew(t, o), catalog(webs(3)[1:]...))
	second := render(t, mustNew(t, o), catalog(webs(3)...))
	if got, want := slotStates(first), "s1=web2:ready s2=web3:ready s3=:maint s4=:maint "; got != want {
		t.Fatalf("first: %s", got)
	}
	if got, want := slotStates(second), "s1=web2:ready s2=web3:ready s3=web1:ready s4=:maint "; got != want {
		t.Errorf("after SIGHUP's new renderer: %s, want %s", got, want)
	}
}

// An instance that moves (the same ID at another port) takes a free slot
// and its old one drains at the old address: changing the slot's address
// in place would leave kept-alive clients on the old address (see
// Server.slotKey; cmd/seamless TestMoveOnKeepAlive with a real HAProxy).
func TestAMovedInstanceTakesAnotherSlot(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	r := mustNew(t, slotOpts(&now))
	before := render(t, r, catalog(webs(2)...))
	moved := webs(2)
	moved[0].Port = 9090
	after := render(t, r, catalog(moved...))
	if got, want := slotStates(after), "s1=web1:drain s2=web2:ready s3=web1:ready s4=:maint "; got != want {
		t.Errorf("after the move: %s, want %s", got, want)
	}
	if !bytes.Equal(after.Structure, before.Structure) {
		t.Error("the move changed the structure; it fits the free slots")
	}
	if s1, s3 := after.Servers.Flat()[0], after.Servers.Flat()[2]; s1.Port != 8080 || s3.Port != 9090 {
		t.Errorf("s1 at port %d (want the old 8080, draining), s3 at %d (want 9090)", s1.Port, s3.Port)
	}
}

// A change to one instance re-plans the slots of its backend only; the
// other backends' servers are the slices they were planned from, and
// their committed slots are those the plan proposed.
func TestOneChangePlansOneBackend(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", Slots: 4, DrainTimeout: 10 * time.Second,
		Now: func() time.Time { return now }})
	var insts []model.Instance
	for s := range 50 {
		for i := range 3 {
			insts = append(insts, inst(fmt.Sprintf("svc%02d", s), fmt.Sprintf("svc%02d-%d", s, i),
				fmt.Sprintf("10.0.%d.%d", s, i+1), 8080, fmt.Sprintf("seamless.http.host=svc%02d.example", s)))
		}
	}
	render(t, r, catalog(insts...))
	render(t, r, catalog(insts...))
	before := r.plans.planned
	insts = slices.Clone(insts) // a rendered catalog is never written
	insts[70].Port = 9090       // svc23 moves: its old slot drains
	moved := render(t, r, catalog(insts...))
	if n := r.plans.planned - before; n != 1 {
		t.Errorf("one instance moved: planned %d backends, want 1", n)
	}
	if got := slotStates(moved); !strings.Contains(got, "svc23-1:drain") {
		t.Errorf("the moved instance's old slot does not drain: %s", got)
	}
	before = r.plans.planned
	render(t, r, catalog(insts...))
	if n := r.plans.planned - before; n != 0 {
		t.Errorf("nothing changed while one backend drains: planned %d backends, want none", n)
	}
	now = now.Add(10 * time.Second) // the drain ends
	before = r.plans.planned
	ended := render(t, r, catalog(insts...))
	if n := r.plans.planned - before; n != 1 {
		t.Errorf("the drain ended: planned %d backends, want the one that drained", n)
	}
	if got := slotStates(ended); strings.Contains(got, "svc23-1:drain") || !ended.Recheck.IsZero() {
		t.Errorf("after the drain, the old slot still drains (%s) or a recheck is due at %v", got, ended.Recheck)
	}
}

// The slots of each backend are held once: the cache that spares an
// unchanged backend its description holds the rendering's own list, and
// the next rendering shares it when the backend's slots did not change.
func TestTheSlotCacheHoldsTheRenderingsSlots(t *testing.T) {
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", Slots: 4})
	api := inst("api", "api-1", "10.0.0.1", 80, "seamless.http.host=api.example")
	web := inst("web", "web-1", "10.0.0.2", 80, "seamless.http.host=web.example")
	held := func(out model.Rendering) model.Rendering {
		for _, b := range out.Servers.Backends() {
			if ms := r.servers.last[b[0].Backend].ms; !model.SameSlots(ms, b) {
				t.Errorf("backend %s: the cache holds a copy of its slots", b[0].Backend)
			}
		}
		if out.Servers.Len() != 8 || len(out.Servers.Backends()) != 2 {
			t.Fatalf("%d slots in %d backends, want 8 in 2", out.Servers.Len(), len(out.Servers.Backends()))
		}
		return out
	}
	first := held(render(t, r, catalog(api, web)))
	second := held(render(t, r, catalog(api, with(web, func(in *model.Instance) { in.Port = 81 }))))
	if !model.SameSlots(first.Servers.Backends()[0], second.Servers.Backends()[0]) {
		t.Error("api's slots did not change, yet the second rendering holds a copy of them")
	}
	if model.SameSlots(first.Servers.Backends()[1], second.Servers.Backends()[1]) {
		t.Error("web's instance moved, yet the second rendering shares the first one's slots")
	}
}

// A slot points at the server holding it, one of the service cache's,
// rather than hold a copy: every backend has 16 slots or more, and at
// 1,000 backends the copies were 2.3 MB of the table.
func TestASlotPointsAtItsServer(t *testing.T) {
	servers := []Server{
		{Name: "a", Instance: "n1/a", Address: Address{Host: "10.0.0.1"}, Port: 80, Weight: 1},
		{Name: "b", Instance: "n2/b", Address: Address{Host: "10.0.0.2"}, Port: 80, Weight: 1},
	}
	slots, _ := planSlots(nil, servers, 4, time.Second, time.Now())
	held := 0
	for _, sl := range slots {
		if sl.srv == nil {
			continue
		}
		held++
		if sl.srv != &servers[0] && sl.srv != &servers[1] {
			t.Errorf("slot of %q holds a copy of its server", sl.srv.Instance)
		}
	}
	if held != 2 {
		t.Errorf("%d slots held, want 2", held)
	}
	if size := unsafe.Sizeof(slot{}); size > 16 {
		t.Errorf("a slot is %d bytes, want at most 16", size)
	}
}

// Planning makes no string: at 10,000 × 10 a key per server and per slot
// was 4 MB of the live heap and twice as many allocations at a start.
func TestPlanningSlotsMakesNoKeys(t *testing.T) {
	for _, n := range []int{10, 40} { // a scan, and a map
		servers := make([]Server, n)
		for i := range servers {
			servers[i] = Server{Name: fmt.Sprint("s", i), Instance: fmt.Sprint("n1/s", i),
				Address: Address{Host: "10.0.0.1"}, Port: 1000 + i, Weight: 1}
		}
		now := time.Now()
		committed, _ := planSlots(nil, servers, 16, time.Second, now)
		moved := slices.Clone(servers)
		moved[0].Port = 999 // one instance moves: its old slot drains
		// The new plan's slots and the held marks; for 40, the map of
		// the servers and its closure too (5 with Go 1.26's maps; with
		// keys it was 130).
		want := 2.0
		if n > 32 {
			want = 8
		}
		allocs := testing.AllocsPerRun(20, func() {
			if _, until := planSlots(committed, moved, 16, time.Second, now); until.IsZero() {
				t.Fatal("the moved instance's slot does not drain")
			}
		})
		if allocs > want {
			t.Errorf("%d servers: planning allocated %.0f times, want at most %.0f", n, allocs, want)
		}
	}
}

// Instance IDs are unique within a source only: two sources may register
// one at two addresses of one service. Planning the same servers again
// keeps every slot, with a map lookup as with a scan.
func TestServersSharingAnInstanceIDKeepTheirSlots(t *testing.T) {
	for _, n := range []int{10, 40} {
		servers := make([]Server, n)
		for i := range servers {
			servers[i] = Server{Name: fmt.Sprint("s", i), Instance: fmt.Sprint("n1/s", i),
				Address: Address{Host: "10.0.0.1"}, Port: 1000 + i, Weight: 1}
		}
		servers[1].Instance = servers[0].Instance // at another port
		now := time.Now()
		committed, _ := planSlots(nil, servers, 16, time.Second, now)
		again, until := planSlots(committed, slices.Clone(servers), 16, time.Second, now)
		if !until.IsZero() {
			t.Errorf("%d servers: planned again unchanged, a slot drains", n)
		}
		for i := range again {
			if (again[i].srv == nil) != (committed[i].srv == nil) ||
				again[i].srv != nil && !sameHolder(again[i].srv, committed[i].srv) {
				t.Errorf("%d servers: slot %d changed holder", n, i)
			}
		}
	}
}
