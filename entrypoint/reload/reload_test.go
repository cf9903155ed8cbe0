package reload

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
)

// The fakes stand at the unit's edge only: the real master CLI and
// haproxy -c are exercised in entrypoint/haproxy and cmd/seamless.

// gateMaster blocks each reload until the test releases it.
type gateMaster struct {
	started chan struct{}
	release chan bool // true: the reload succeeds
}

func (g *gateMaster) Reload(ctx context.Context) (haproxy.ReloadResult, error) {
	g.started <- struct{}{}
	select {
	case ok := <-g.release:
		return haproxy.ReloadResult{OK: ok}, nil
	case <-ctx.Done():
		return haproxy.ReloadResult{}, ctx.Err()
	}
}

type checkFunc func(context.Context) error

func (f checkFunc) Check(ctx context.Context) error { return f(ctx) }
func (checkFunc) Loaded(bool)                       {}

func run(t *testing.T, m Master, c Checker) (*Reloader, *metrics.Metrics, chan Outcome) {
	t.Helper()
	met := metrics.New()
	r := New(m, c, nil, met, nil, 10*time.Second)
	outcomes := make(chan Outcome, 100)
	r.OnDone = func(o Outcome) { outcomes <- o }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r, met, outcomes
}

func next(t *testing.T, ch chan Outcome) Outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no reload outcome")
		return Outcome{}
	}
}

// testing/synctest makes "no third reload" provable: once every goroutine
// in the bubble is blocked, a reload that had started would be waiting on
// g.started.
func TestRequestsDuringAReloadCoalesceIntoOneFollowUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gateMaster{started: make(chan struct{}), release: make(chan bool)}
		r, met, outcomes := run(t, g, checkFunc(func(context.Context) error { return nil }))

		r.Request("SIGHUP")
		<-g.started // the first reload is in flight
		for range 10 {
			r.Request("SIGHUP")
		}
		r.Request("SIGUSR2")
		g.release <- true
		if o := <-outcomes; !o.OK || len(o.Reasons) != 1 {
			t.Fatalf("first reload: %+v", o)
		}

		<-g.started // exactly one follow-up, carrying every request that waited
		g.release <- true
		o := <-outcomes
		if !o.OK || len(o.Reasons) != 11 {
			t.Fatalf("follow-up reload served %d requests, want 11: %+v", len(o.Reasons), o)
		}
		if got := Summarise(o.Reasons); got != "SIGHUP ×10, SIGUSR2" {
			t.Errorf("summary %q", got)
		}
		synctest.Wait()
		select {
		case <-g.started:
			t.Fatal("a third reload started although no request was left")
		default:
		}
		if v := testutil.ToFloat64(met.Reloads.WithLabelValues(metrics.Success)); v != 2 {
			t.Errorf("successes = %v, want 2", v)
		}
		if v := testutil.ToFloat64(met.ReloadRequests); v != 12 {
			t.Errorf("requests = %v, want 12", v)
		}
	})
}

func TestInvalidConfigIsNotReloaded(t *testing.T) {
	g := &gateMaster{started: make(chan struct{}, 1), release: make(chan bool, 1)}
	bad := &haproxy.ConfigError{Alerts: []string{"parsing [h.cfg:3] : unknown keyword"}}
	r, met, outcomes := run(t, g, checkFunc(func(context.Context) error { return bad }))
	r.Request("SIGHUP")
	o := next(t, outcomes)
	if o.OK || !errors.Is(o.Err, error(bad)) {
		t.Fatalf("outcome %+v, want the config error", o)
	}
	if len(g.started) != 0 {
		t.Error("HAProxy was asked to reload an invalid configuration")
	}
	if v := testutil.ToFloat64(met.ConfigErrors); v != 1 {
		t.Errorf("config errors = %v, want 1", v)
	}
	if v := testutil.ToFloat64(met.Reloads.WithLabelValues(metrics.Failure)); v != 1 {
		t.Errorf("failures = %v, want 1", v)
	}
}

func TestRefusedReloadCountsAsFailure(t *testing.T) {
	g := &gateMaster{started: make(chan struct{}, 1), release: make(chan bool, 1)}
	r, met, outcomes := run(t, g, checkFunc(func(context.Context) error { return nil }))
	g.release <- false
	r.Request("SIGHUP")
	if o := next(t, outcomes); o.OK || o.Err == nil {
		t.Fatalf("outcome %+v, want a failure", o)
	}
	if v := testutil.ToFloat64(met.Reloads.WithLabelValues(metrics.Failure)); v != 1 {
		t.Errorf("failures = %v, want 1", v)
	}
	if v := testutil.ToFloat64(met.Reloads.WithLabelValues(metrics.Success)); v != 0 {
		t.Errorf("successes = %v, want 0", v)
	}
}

// scriptMaster answers reloads from a list of results.
type scriptMaster struct {
	mu      sync.Mutex
	results []error
	calls   int
}

func (m *scriptMaster) Reload(ctx context.Context) (haproxy.ReloadResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if len(m.results) == 0 {
		return haproxy.ReloadResult{OK: true}, nil
	}
	err := m.results[0]
	m.results = m.results[1:]
	return haproxy.ReloadResult{OK: err == nil}, err
}

// A reload HAProxy never took (busy with an earlier one) is tried again:
// otherwise the newest file would never run.
func TestNotSentIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scriptMaster{results: []error{haproxy.ErrNotSent, haproxy.ErrNotSent}}
		r, met, outcomes := run(t, m, checkFunc(func(context.Context) error { return nil }))
		r.Request("SIGHUP")
		for i := range 3 {
			o := <-outcomes
			if (i < 2) != o.Retry || (i == 2) != o.OK {
				t.Fatalf("attempt %d: %+v", i, o)
			}
		}
		synctest.Wait()
		if m.calls != 3 {
			t.Errorf("%d attempts, want 3", m.calls)
		}
		if v := testutil.ToFloat64(met.Reloads.WithLabelValues(metrics.Failure)); v != 0 {
			t.Errorf("failures = %v: a reload that was never sent is no failure", v)
		}
	})
}

// A reload that was sent but not confirmed is not repeated: a
// configuration slower to load than the timeout would reload forever.
func TestUnconfirmedIsNotRepeated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scriptMaster{results: []error{haproxy.ErrUnconfirmed}}
		r, met, outcomes := run(t, m, checkFunc(func(context.Context) error { return nil }))
		r.Request("SIGHUP")
		if o := <-outcomes; o.Retry || o.OK {
			t.Fatalf("outcome %+v", o)
		}
		time.Sleep(10 * retryDelay) // fake time inside the bubble
		synctest.Wait()
		if m.calls != 1 {
			t.Errorf("%d attempts, want 1", m.calls)
		}
		if v := testutil.ToFloat64(met.Reloads.WithLabelValues(metrics.Failure)); v != 1 {
			t.Errorf("failures = %v, want 1", v)
		}
	})
}

// Close wins over a queued request: no reload starts once stopping.
func TestCloseWinsOverQueuedRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 50 {
			m := &scriptMaster{}
			met := metrics.New()
			r := New(m, checkFunc(func(context.Context) error { return nil }), nil, met, nil, 10*time.Second)
			r.Request("SIGHUP")
			r.Close()
			done := make(chan struct{})
			go func() { r.Run(t.Context()); close(done) }()
			<-done
			if m.calls != 0 {
				t.Fatalf("a reload started after Close")
			}
		}
	})
}

// A caller that asks while a reload is in flight must get the outcome of
// the follow-up, which reads its file, not of the reload already running.
func TestDoWaitsForTheReloadThatServedIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gateMaster{started: make(chan struct{}), release: make(chan bool)}
		r, _, _ := run(t, g, checkFunc(func(context.Context) error { return nil }))

		first := make(chan Outcome, 1)
		go func() { o, _ := r.Do(t.Context(), "first"); first <- o }()
		<-g.started
		second := make(chan Outcome, 1)
		go func() { o, _ := r.Do(t.Context(), "second"); second <- o }()
		synctest.Wait() // "second" is queued behind the reload in flight
		g.release <- true
		if o := <-first; !o.OK || len(o.Reasons) != 1 || o.Reasons[0] != "first" {
			t.Fatalf("first: %+v", o)
		}
		synctest.Wait()
		select {
		case o := <-second:
			t.Fatalf("second answered by the first reload: %+v", o)
		default:
		}
		<-g.started
		g.release <- false
		if o := <-second; o.OK || o.Reasons[0] != "second" {
			t.Fatalf("second: %+v, want the refused follow-up", o)
		}
	})
}

func TestDoReturnsWhenClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gateMaster{started: make(chan struct{}), release: make(chan bool)}
		r, _, _ := run(t, g, checkFunc(func(context.Context) error { return nil }))
		r.Close()
		if _, err := r.Do(t.Context(), "late"); err == nil {
			t.Fatal("Do on a closed Reloader returned no error")
		}
	})
}

// trackingChecker records what the reloader tells it about what runs.
type trackingChecker struct {
	mu     sync.Mutex
	loaded []bool
}

func (c *trackingChecker) Check(context.Context) error { return nil }
func (c *trackingChecker) Loaded(certain bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loaded = append(c.loaded, certain)
}

// resultMaster answers each reload with the next result.
type resultMaster struct {
	results chan func() (haproxy.ReloadResult, error)
}

func (m resultMaster) Reload(context.Context) (haproxy.ReloadResult, error) { return (<-m.results)() }

// The checker learns what runs (for the bind probe): for certain after a
// confirmed reload, perhaps after an unconfirmed one, not after a refusal.
func TestTheCheckerLearnsWhatRuns(t *testing.T) {
	c := &trackingChecker{}
	m := resultMaster{results: make(chan func() (haproxy.ReloadResult, error), 3)}
	m.results <- func() (haproxy.ReloadResult, error) { return haproxy.ReloadResult{OK: true}, nil }
	m.results <- func() (haproxy.ReloadResult, error) { return haproxy.ReloadResult{OK: false}, nil }
	m.results <- func() (haproxy.ReloadResult, error) { return haproxy.ReloadResult{}, errors.New("not confirmed") }
	r, _, outcomes := run(t, m, c)
	for range 3 {
		r.Request("SIGHUP")
		next(t, outcomes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.loaded) != 2 || !c.loaded[0] || c.loaded[1] {
		t.Errorf("Loaded calls %v, want [true false]", c.loaded)
	}
}

// The generation is odd while a reload is in flight and moves at each
// reload's start and end, failed ones too: the runtime API trusts the
// worker it last found current only while it stays even and the same.
func TestTheGenerationMovesAtEveryReload(t *testing.T) {
	g := &gateMaster{started: make(chan struct{}), release: make(chan bool)}
	r, _, outcomes := run(t, g, checkFunc(func(context.Context) error { return nil }))
	if n := r.Generation(); n != 0 {
		t.Fatalf("before any reload: generation %d, want 0", n)
	}
	for i, ok := range []bool{true, false} {
		r.Request("SIGHUP")
		<-g.started
		if n := r.Generation(); n != uint64(2*i+1) {
			t.Errorf("reload %d in flight: generation %d, want %d", i+1, n, 2*i+1)
		}
		g.release <- ok
		next(t, outcomes)
		if n := r.Generation(); n != uint64(2*i+2) {
			t.Errorf("after reload %d: generation %d, want %d", i+1, n, 2*i+2)
		}
	}
}
