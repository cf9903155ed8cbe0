package apply

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reaper"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// gate is a validation that fails with err until opened, and counts calls.
type gate struct {
	mu    sync.Mutex
	err   error
	calls int
}

func (g *gate) set(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.err = err
}

func (g *gate) check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	return g.err
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

// Review finding E: haproxy -c that cannot run at all (no fork, no file
// descriptor, a timeout) says nothing about the configuration. The change
// is retried and applies once validation works; no configuration error is
// counted.
func TestAValidationThatCannotRunIsRetried(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	g := &gate{}
	r.a.opts.Validate = func(context.Context, string) error { return g.check() }
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	g.set(fmt.Errorf("haproxy -c: fork/exec /usr/sbin/haproxy: %w", syscall.EMFILE))
	src.send("web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "a validation that cannot run", func() bool { return g.count() >= 2 })
	if got := r.file(t); got != "server web 10.0.0.1\n" || r.reloadCount() != 0 {
		t.Errorf("while haproxy -c cannot run: file %q, %d reloads", got, r.reloadCount())
	}
	g.set(nil)
	testenv.Eventually(t, 10*time.Second, "the change applies once haproxy -c runs", func() bool { return r.reloadCount() == 1 })
	if got := r.file(t); got != "server web 10.0.0.1\nserver web 10.0.0.2\n" {
		t.Errorf("file %q", got)
	}
	if n := testutil.ToFloat64(r.m.ConfigErrors); n != 0 {
		t.Errorf("a validation that could not run counted as %v configuration errors", n)
	}
}

// listeners renders one frontend per instance, binding its address.
type listeners struct{}

func (listeners) Render(st model.State) (model.Rendering, error) {
	var b strings.Builder
	for i, in := range st.Local().Instances {
		fmt.Fprintf(&b, "frontend f%d\n    bind %s:%d\n", i, in.Address, in.Port)
	}
	return model.Rendering{Queries: []model.Query{model.LocalCatalog}, Config: []byte(b.String())}, nil
}

func sendListeners(src *fakeSource, addrs ...string) {
	c := &model.Catalog{}
	for _, a := range addrs {
		ap := netip.MustParseAddrPort(a)
		c.Instances = append(c.Instances, model.Instance{Source: src.name, Name: "l", ID: a, Address: ap.Addr().String(), Port: int(ap.Port()), Status: model.StatusPassing})
	}
	src.ch <- model.Snapshot{Source: src.name, Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
}

// Review finding D: a listener whose port another process holds is not a
// refused configuration: the port may be freed. The candidate is retried
// with the write backoff and applies once the port is free, with the real
// validator's bind guard (haproxy -c itself stands in: it never binds).
func TestATakenPortIsRetriedUntilItIsFree(t *testing.T) {
	held, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	src := newSource("consul")
	r := newRig(t, t.TempDir(), listeners{}, src)
	ok := func(context.Context, []string, []string) ([]byte, reaper.Status, error) {
		return nil, reaper.Status{}, nil
	}
	var mu sync.Mutex
	var checks int
	r.a.opts.Validate = func(ctx context.Context, path string) error {
		mu.Lock()
		checks++
		mu.Unlock()
		v := &haproxy.Validator{Bin: "haproxy", Args: []string{"-c", "-f", path}, Run: ok}
		v.Binds = haproxy.NewBindGuard(nil, nil) // HAProxy does not run here: every address is probed
		return v.Check(ctx)
	}
	sendListeners(src, "127.0.0.1:1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Skipf("cannot bind 127.0.0.1:1 here: %v", err)
	}
	r.run(t)
	sendListeners(src, "127.0.0.1:1", held.Addr().String())
	testenv.Eventually(t, 5*time.Second, "the taken port retried", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return checks >= 3 // Start, the first try, a retry
	})
	if r.reloadCount() != 0 {
		t.Fatalf("reloaded with a taken port")
	}
	held.Close()
	testenv.Eventually(t, 10*time.Second, "the change applies once the port is free", func() bool { return r.reloadCount() == 1 })
	if !strings.Contains(r.file(t), held.Addr().String()) {
		t.Errorf("file %q", r.file(t))
	}
	if n := testutil.ToFloat64(r.m.ConfigErrors); n != 0 {
		t.Errorf("a taken port counted as %v configuration errors", n)
	}
	if !slices.ContainsFunc(r.a.History(), func(h Record) bool { return strings.Contains(h.Error, "cannot bind "+held.Addr().String()) }) {
		t.Errorf("the history does not say the port was taken: %+v", r.a.History())
	}
}
