package guard

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// fake is a source the test feeds: each snapshot put on in is sent on.
type fake struct {
	in chan model.Snapshot
	mu sync.Mutex
	up bool
}

func (f *fake) Name() string { return "fake" }

func (f *fake) Run(ctx context.Context, out chan<- model.Snapshot) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-f.in:
			select {
			case out <- s:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (f *fake) Status() model.SourceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return model.SourceStatus{Name: "fake", Up: f.up}
}

func (f *fake) setUp(up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.up = up
}

// lockedBuffer is the log, written by the guard and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// rig runs a guard around a fake inside a synctest bubble.
type rig struct {
	t   *testing.T
	src *fake
	g   model.Source
	log *lockedBuffer

	mu   sync.Mutex
	last model.Snapshot
	n    int
}

func newRig(t *testing.T, o Options) *rig {
	r := &rig{t: t, src: &fake{in: make(chan model.Snapshot), up: true}, log: &lockedBuffer{}}
	o.Log = slog.New(slog.NewTextHandler(r.log, nil))
	r.g = Wrap(r.src, o)
	out := make(chan model.Snapshot)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); r.g.Run(ctx, out) }()
	go func() {
		for {
			select {
			case s := <-out:
				r.mu.Lock()
				r.last, r.n = s, r.n+1
				r.mu.Unlock()
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// send has the source report ins, and waits until the guard has done
// with it.
func (r *rig) send(ins ...model.Instance) { r.sendReset(time.Time{}, ins...) }

// sendReset is send from a source that last started over at reset.
func (r *rig) sendReset(reset time.Time, ins ...model.Instance) {
	r.src.in <- model.Snapshot{Source: "fake", Reset: reset, Results: map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: &model.Catalog{Instances: ins}},
	}}
	synctest.Wait()
}

// forwarded returns the IDs (with their status when not passing) of the
// newest snapshot the guard sent on.
func (r *rig) forwarded() []string {
	synctest.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	if c := r.last.Local(); c != nil {
		for _, in := range c.Instances {
			id := in.ID
			if in.Status != model.StatusPassing {
				id += ":" + in.Status
			}
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (r *rig) want(step string, ids ...string) {
	r.t.Helper()
	slices.Sort(ids)
	if got := r.forwarded(); !slices.Equal(got, ids) {
		r.t.Errorf("%s: forwarded %v, want %v", step, got, ids)
	}
}

func (r *rig) status() model.SourceStatus { return r.g.(model.Reporter).Status() }

func inst(name, id string) model.Instance {
	return model.Instance{Source: "fake", Name: name, ID: id, Address: "10.0.0.1", Port: 80, Status: model.StatusPassing}
}

func critical(in model.Instance) model.Instance { in.Status = model.StatusCritical; return in }

var opts = Options{Percent: 50, Hold: 30 * time.Second}

func TestMassRemovalIsHeldThenApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c, d, db := inst("web", "a"), inst("web", "b"), inst("web", "c"), inst("web", "d"), inst("db", "db")
		r.send(a, b, c, d, db)
		r.want("first snapshot", "a", "b", "c", "d", "db")

		start := time.Now()
		e := inst("web", "e")
		r.send(a, e, critical(db)) // b, c, d gone: 3 of 5
		r.want("the removal is held, drained; the addition and the change apply", "a", "b:critical", "c:critical", "d:critical", "e", "db:critical")
		st := r.status()
		if st.Held != 3 || !st.HeldUntil.Equal(start.Add(30*time.Second)) || st.HoldsTotal != 1 || !st.Up {
			t.Errorf("status %+v, want 3 held until %s, 1 hold", st, start.Add(30*time.Second))
		}
		for _, w := range []string{"source=fake", "held=3", "of=5", "until="} {
			if !strings.Contains(r.log.String(), w) {
				t.Errorf("log %q does not say %q", r.log.String(), w)
			}
		}

		time.Sleep(30*time.Second - time.Millisecond)
		r.want("just before the end of the hold", "a", "b:critical", "c:critical", "d:critical", "e", "db:critical")
		time.Sleep(time.Millisecond)
		r.want("the source still says they are gone: applied", "a", "e", "db:critical")
		if st := r.status(); st.Held != 0 || !st.HeldUntil.IsZero() || st.HoldsTotal != 1 {
			t.Errorf("status after the hold %+v", st)
		}
		if !strings.Contains(r.log.String(), "removal applied") {
			t.Errorf("no log line says the removal was applied: %s", r.log.String())
		}
	})
}

func TestWhatIsNotAMassRemovalAppliesAtOnce(t *testing.T) {
	tests := []struct {
		name    string
		percent int
		before  []string
		after   []string
	}{
		{"a quarter", 50, []string{"a", "b", "c", "d"}, []string{"a", "b", "c"}},
		{"exactly half", 50, []string{"a", "b", "c", "d"}, []string{"a", "b"}},
		{"the only instance", 50, []string{"a"}, nil},
		{"one of two", 50, []string{"a", "b"}, []string{"a"}},
		{"three of four at 100", 100, []string{"a", "b", "c", "d"}, []string{"a"}},
		{"changes only", 50, []string{"a", "b", "c"}, []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, Options{Percent: tt.percent, Hold: time.Minute})
				var before, after []model.Instance
				for _, id := range tt.before {
					before = append(before, inst("web", id))
				}
				for _, id := range tt.after {
					after = append(after, critical(inst("web", id)))
				}
				r.send(before...)
				r.send(after...)
				var want []string
				for _, id := range tt.after {
					want = append(want, id+":critical")
				}
				r.want("after", want...)
				if st := r.status(); st.Held != 0 || st.HoldsTotal != 0 {
					t.Errorf("status %+v", st)
				}
			})
		})
	}
}

func TestHeldInstancesThatComeBackEndTheHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c := inst("web", "a"), inst("web", "b"), inst("web", "c")
		r.send(a, b, c)
		r.send() // the source restarted empty
		r.want("held", "a", "b", "c")
		r.send(a, critical(b)) // registered again, one of them critical
		r.want("back, as the source now says", "a", "b:critical", "c")
		if st := r.status(); st.Held != 1 {
			t.Errorf("status %+v, want c still held", st)
		}
		r.send(a, critical(b), c)
		if st := r.status(); st.Held != 0 || !st.HeldUntil.IsZero() {
			t.Errorf("status %+v, nothing held", st)
		}
		time.Sleep(time.Minute)
		r.want("nothing removed at the end of the period", "a", "b:critical", "c")
	})
}

func TestScaleToZeroHappensAfterTheHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		r.send(inst("web", "a"), inst("web", "b"))
		r.send()
		r.want("held", "a", "b")
		time.Sleep(30 * time.Second)
		r.want("applied")
	})
}

// A source that is down when the period ends cannot confirm anything: the
// hold goes on until it can.
func TestAHoldOutlastsASourceThatIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		r.send(inst("web", "a"), inst("web", "b"), inst("web", "c"))
		r.send(inst("web", "a"))
		r.src.setUp(false)
		time.Sleep(30 * time.Second)
		r.want("down at the end of the period: still held", "a", "b:critical", "c:critical")
		if st := r.status(); st.Held != 2 || st.Up {
			t.Errorf("status %+v", st)
		}
		r.src.setUp(true)
		time.Sleep(30 * time.Second)
		r.want("up again, and still without them: applied", "a")
	})
}

func TestAZeroPercentGuardIsNoGuard(t *testing.T) {
	src := &fake{}
	if g := Wrap(src, Options{Percent: 0, Hold: time.Second}); g != model.Source(src) {
		t.Errorf("Wrap with 0%% returned %T, want the source itself", g)
	}
	if Unwrap(Wrap(src, opts)) != model.Source(src) || Unwrap(src) != model.Source(src) {
		t.Error("Unwrap does not return the wrapped source")
	}
}

// A source that started over comes back in pieces (Consul's servers
// restarted one by one, agents re-syncing): a first answer that lacks one
// whole service, 4 of 9 instances, is under the threshold, and applying it
// would leave the service with no server until the rest came back. After
// a reset every removal is held; long after one, the threshold rules
// again.
func TestARemovalJustAfterTheSourceStartedOverIsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		var all, api []model.Instance
		for _, id := range []string{"w1", "w2", "w3", "w4"} {
			all = append(all, inst("web", id))
		}
		for _, id := range []string{"a1", "a2", "a3", "a4", "a5"} {
			in := inst("api", id)
			all, api = append(all, in), append(api, in)
		}
		r.send(all...)
		r.sendReset(time.Now(), api...)
		r.want("web's 4 of 9 are held after a reset", "w1", "w2", "w3", "w4", "a1", "a2", "a3", "a4", "a5")
		if !strings.Contains(r.log.String(), "started over") {
			t.Errorf("the log does not say the source started over: %s", r.log.String())
		}
		r.sendReset(time.Now(), all...)
		r.want("back in full: released", "w1", "w2", "w3", "w4", "a1", "a2", "a3", "a4", "a5")
		if st := r.status(); st.Held != 0 {
			t.Errorf("%d still held", st.Held)
		}

		reset := time.Now()
		time.Sleep(opts.Hold)
		r.sendReset(reset, api...)
		r.want("a hold period after the reset, 4 of 9 apply at once", "a1", "a2", "a3", "a4", "a5")
	})
}

// A catalog with held instances added is still the source's: it keeps
// its Consul index (/status's consul_index).
func TestAHeldCatalogKeepsItsIndex(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		send := func(index uint64, ins ...model.Instance) {
			r.src.in <- model.Snapshot{Source: "fake", Results: map[model.Query]model.Result{
				model.LocalCatalog: {Catalog: &model.Catalog{Instances: ins, Index: index}},
			}}
			synctest.Wait()
		}
		a, b, c := inst("web", "a"), inst("web", "b"), inst("web", "c")
		send(7, a, b, c)
		send(9, a) // b and c held
		r.want("the removal is held", "a", "b:critical", "c:critical")
		r.mu.Lock()
		defer r.mu.Unlock()
		if got := r.last.Local().Index; got != 9 {
			t.Errorf("the catalog with held instances has index %d, want the source's 9", got)
		}
	})
}

// A scale-down of more than the threshold (5 → 2) is a removal the guard
// holds, but the instances that leave often stop soon after: they must
// get no new requests meanwhile. They are passed on critical while their
// service has instances that serve; a service lost whole (api) is held
// as it was, since that is what a source that lost its data looks like.
func TestAHeldScaleDownIsDrainedWhileItsServiceServes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c, d, e := inst("web", "a"), inst("web", "b"), inst("web", "c"), inst("web", "d"), inst("web", "e")
		x, y := inst("api", "x"), inst("api", "y")
		r.send(a, b, c, d, e, x, y)
		r.send(a, b) // 5 of 7 gone
		r.want("held: web's drained, api's as they were", "a", "b", "c:critical", "d:critical", "e:critical", "x", "y")
		if !strings.Contains(r.log.String(), "drained=3") {
			t.Errorf("the log does not say 3 were drained: %s", r.log.String())
		}
		r.mu.Lock()
		for _, in := range r.last.Local().Instances {
			if in.ID == "c" && !slices.ContainsFunc(in.Checks, func(ch model.Check) bool {
				return ch.CheckID == drainedCheck && ch.Status == model.StatusCritical
			}) {
				t.Errorf("the drained instance has no check that says why: %+v", in.Checks)
			}
		}
		r.mu.Unlock()

		r.send(critical(a), critical(b))
		r.want("web has nothing else to serve: its held instances serve again", "a:critical", "b:critical", "c", "d", "e", "x", "y")
		r.send(a, b)
		r.want("and are drained again once it has", "a", "b", "c:critical", "d:critical", "e:critical", "x", "y")

		time.Sleep(opts.Hold)
		r.want("the source still says they are gone: applied", "a", "b")
	})
}

// After the source started over, its data comes back in pieces: a
// service back with one instance of three must not take all the traffic.
func TestAHoldAfterTheSourceStartedOverIsNotDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c := inst("web", "a"), inst("web", "b"), inst("web", "c")
		r.send(a, b, c)
		r.sendReset(time.Now(), a)
		r.want("held as they were", "a", "b", "c")
	})
}

// Draining must never leave a service with nothing routed: what counts is
// the health filter's (SEAMLESS_CONSUL_HEALTH), passing only by default.
// When it routes critical instances too, a drain would change nothing.
func TestADrainCountsOnlyRoutedInstances(t *testing.T) {
	warning := func(in model.Instance) model.Instance { in.Status = model.StatusWarning; return in }
	for _, c := range []struct {
		name   string
		routed func(string) bool
		want   []string
	}{
		{"passing only: the two left are warning, so nothing is drained", nil,
			[]string{"a:warning", "b:warning", "c", "d", "e"}},
		{"passing and warning", func(s string) bool { return s == model.StatusPassing || s == model.StatusWarning },
			[]string{"a:warning", "b:warning", "c:critical", "d:critical", "e:critical"}},
		{"any: critical is routed, nothing to drain", func(string) bool { return true },
			[]string{"a:warning", "b:warning", "c", "d", "e"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := opts
				o.Routed = c.routed
				r := newRig(t, o)
				a, b := warning(inst("web", "a")), warning(inst("web", "b"))
				r.send(a, b, inst("web", "c"), inst("web", "d"), inst("web", "e"))
				r.send(a, b)
				r.want("held", c.want...)
			})
		})
	}
}

// A Consul server restored from an older Raft snapshot serves, until a
// leader tells it what came after, instances removed since (the chaos
// suite saw web's removed instances come back on one replica, get traffic
// until HAProxy's checks failed them, and three requests time out). Just
// after a reset, what was removed before is withheld: gone again when the
// server catches up, it is never routed to; still there when the hold
// period ends, it is passed on.
func TestInstancesRemovedBeforeAResetAreWithheldUntilConfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c, d := inst("web", "a"), inst("web", "b"), inst("web", "c"), inst("web", "d")
		r.send(a, b, c)
		r.send(a, b) // one of three: applied at once
		r.want("c removed", "a", "b")

		reset := time.Now()
		r.sendReset(reset, a, b, c, d)
		r.want("old c withheld; d, never seen, added", "a", "b", "d")
		st := r.status()
		if st.Withheld != 1 || !st.WithheldUntil.Equal(reset.Add(opts.Hold)) || st.WithholdsTotal != 1 {
			t.Errorf("status %+v, want 1 withheld until %s, 1 withhold", st, reset.Add(opts.Hold))
		}
		for _, w := range []string{"reports again instances it removed", "withheld=1", "services=web", "until="} {
			if !strings.Contains(r.log.String(), w) {
				t.Errorf("log %q does not say %q", r.log.String(), w)
			}
		}
		r.sendReset(reset, a, b, d)
		r.want("the server caught up: c never served", "a", "b", "d")
		if st := r.status(); st.Withheld != 0 || st.Held != 0 {
			t.Errorf("status %+v, want nothing withheld or held", st)
		}

		time.Sleep(10 * time.Second)
		r.sendReset(reset, a, b, c, d)
		r.want("c again, still within the period", "a", "b", "d")
		time.Sleep(opts.Hold - 10*time.Second - time.Millisecond)
		r.want("just before the end of the period", "a", "b", "d")
		time.Sleep(time.Millisecond)
		r.want("the source still reports c: passed on", "a", "b", "c", "d")
		if st := r.status(); st.Withheld != 0 || !strings.Contains(r.log.String(), "passed on") {
			t.Errorf("status %+v, log %q: want nothing withheld and a line saying c was passed on", st, r.log.String())
		}
	})
}

// Only the snapshots just after a reset are doubted: an instance removed
// and registered again otherwise, or long after a reset, applies at once.
func TestARemovedInstanceBackWithoutAResetAppliesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c := inst("web", "a"), inst("web", "b"), inst("web", "c")
		r.send(a, b, c)
		r.send(a, b)
		r.send(a, b, c)
		r.want("no reset: back at once", "a", "b", "c")

		reset := time.Now()
		r.send(a, b)
		time.Sleep(opts.Hold)
		r.sendReset(reset, a, b, c)
		r.want("a hold period after the reset: back at once", "a", "b", "c")
		if st := r.status(); st.WithholdsTotal != 0 {
			t.Errorf("status %+v, want no withhold", st)
		}
	})
}

// A removal the guard held and then applied is remembered like one
// applied at once.
func TestAnAppliedHeldRemovalIsWithheldAfterAReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b, c, d := inst("web", "a"), inst("web", "b"), inst("web", "c"), inst("db", "d")
		r.send(a, b, c, d)
		r.send(a, d) // two of four: not over half, applied
		r.send(d)    // web's last, and half: not over half, applied
		r.want("web removed", "d")
		r.sendReset(time.Now(), a, b, c, d)
		r.want("web's old instances withheld", "d")

		r2 := newRig(t, opts)
		r2.send(a, b, c, d)
		r2.send(d) // three of four: held
		time.Sleep(opts.Hold)
		r2.want("the held removal applied", "d")
		r2.sendReset(time.Now(), a, b, c, d)
		r2.want("what the held removal removed is withheld", "d")
	})
}

// An instance withheld while its source is down at the end of the period
// stays out until the source can confirm it.
func TestAWithholdOutlastsASourceThatIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, opts)
		a, b := inst("web", "a"), inst("web", "b")
		r.send(a, b)
		r.send(a)
		r.sendReset(time.Now(), a, b)
		r.src.setUp(false)
		time.Sleep(opts.Hold)
		r.want("down at the end of the period: still withheld", "a")
		r.src.setUp(true)
		time.Sleep(opts.Hold)
		r.want("up again and still reporting b: passed on", "a", "b")
	})
}
