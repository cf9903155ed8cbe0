package apply

import (
	"context"
	"fmt"
	"slices"
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

// movesBase: a backend, a listen section, a ring whose server lines are
// no backend's, and %s for lines under test at the end of backend web.
const movesBase = `global
    maxconn 100

ring logs
    format rfc5424
    server log1 10.0.9.1:514

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend http-in
    bind 127.0.0.1:18000
    default_backend web

backend web
    balance roundrobin
    server web-1 10.0.0.1:8080 check inter 2s
    server web-2 10.0.0.2:8080
%s
listen api
    bind 127.0.0.1:18001
    server api-1 [fd00::1]:9000
`

func TestOnlyMovedServersOfABackendGoOverTheRuntimeAPI(t *testing.T) {
	taken := fmt.Sprintf(movesBase, "    server web-3 10.0.0.3:8080")
	hashed := taken + "backend h\n    hash-key addr\n"
	conditional := strings.Replace(taken, "backend web\n", ".if defined(BLUE)\nbackend web\n    server s 10.0.0.1:8080\n.else\nbackend web\n    server s 10.0.0.2:8080\n.endif\nbackend web-old\n", 1)
	cases := []struct {
		name        string
		taken, next string
		want        []string // the commands; nil: a reload
	}{
		{"a port", taken, strings.Replace(taken, "10.0.0.1:8080 check", "10.0.0.1:8081 check", 1),
			[]string{"set server web/web-1 addr 10.0.0.1 port 8081"}},
		{"an address", taken, strings.Replace(taken, "10.0.0.2:8080", "10.0.0.22:8080", 1),
			[]string{"set server web/web-2 addr 10.0.0.22 port 8080"}},
		{"in a listen section, IPv6", taken, strings.Replace(taken, "[fd00::1]:9000", "[fd00::2]:9001", 1),
			[]string{"set server api/api-1 addr fd00::2 port 9001"}},
		{"two backends at once", taken, strings.Replace(strings.Replace(taken, "10.0.0.3:8080", "10.0.0.3:9090", 1), "[fd00::1]:9000", "[fd00::1]:9002", 1),
			[]string{"set server web/web-3 addr 10.0.0.3 port 9090", "set server api/api-1 addr fd00::1 port 9002"}},
		{"a ring's server", taken, strings.Replace(taken, "10.0.9.1:514", "10.0.9.2:514", 1), nil},
		{"another word too", taken, strings.Replace(taken, "10.0.0.1:8080 check inter 2s", "10.0.0.1:8081 check inter 3s", 1), nil},
		{"a server added", taken, fmt.Sprintf(movesBase, "    server web-3 10.0.0.3:8080\n    server web-4 10.0.0.4:8080"), nil},
		{"a server removed", taken, fmt.Sprintf(movesBase, ""), nil},
		{"a move and another line", taken, strings.Replace(strings.Replace(taken, "10.0.0.1:8080", "10.0.0.1:8081", 1), "roundrobin", "leastconn", 1), nil},
		{"a host name", taken, strings.Replace(taken, "10.0.0.2:8080", "web.example:8080", 1), nil},
		{"to another family", taken, strings.Replace(taken, "10.0.0.2:8080", "[fd00::2]:8080", 1), nil},
		{"hash-key anywhere", hashed, strings.Replace(hashed, "10.0.0.1:8080 check", "10.0.0.1:8081 check", 1), nil},
		// With BLUE unset HAProxy runs the second web: moving the first
		// line's server would move the one that runs.
		{"a section under .if", conditional, strings.Replace(conditional, "10.0.0.1:8080", "10.0.0.9:8080", 1), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			moves, ok := movesOnly([]byte(c.taken), []byte(c.next))
			if c.want == nil {
				if ok {
					t.Fatalf("movesOnly = %v, want a reload", moveCommands(moves))
				}
				return
			}
			if !ok {
				t.Fatalf("movesOnly refused, want %v", c.want)
			}
			if got := moveCommands(moves); !slices.Equal(got, c.want) {
				t.Errorf("commands %v, want %v", got, c.want)
			}
		})
	}
}

// A server name another server line of its section holds too, by itself
// or as a server-template's prefix, is not one `set server` away.
func TestAMovedServerNamedTwiceInItsSectionIsReloaded(t *testing.T) {
	for _, other := range []string{"    server web-1 10.0.0.7:8080", "    server-template web-1 2 10.0.0.8:8080"} {
		taken := fmt.Sprintf(movesBase, other)
		next := strings.Replace(taken, "10.0.0.1:8080 check", "10.0.0.1:8081 check", 1)
		if moves, ok := movesOnly([]byte(taken), []byte(next)); ok {
			t.Errorf("beside %q: movesOnly = %v, want a reload", other, moveCommands(moves))
		}
	}
	// The same name in another backend is another server.
	taken := fmt.Sprintf(movesBase, "") + "backend other\n    server web-1 10.0.0.7:8080\n"
	next := strings.Replace(taken, "10.0.0.1:8080 check", "10.0.0.1:8081 check", 1)
	if _, ok := movesOnly([]byte(taken), []byte(next)); !ok {
		t.Error("a name another backend holds too: movesOnly refused")
	}
}

// backendLines renders a backend whose servers are named by instance ID.
type backendLines struct{}

func (backendLines) Render(st model.State) (model.Rendering, error) {
	r := model.Rendering{Queries: []model.Query{model.LocalCatalog}}
	if _, ok := st.Result(model.LocalCatalog); !ok {
		r.Missing = append(r.Missing, model.LocalCatalog)
	}
	var b strings.Builder
	b.WriteString("backend web\n")
	for _, in := range st.Local().Instances {
		fmt.Fprintf(&b, "    server %s %s:%d\n", in.ID, in.Address, in.Port)
	}
	r.Config = []byte(b.String())
	return r, nil
}

// A rendering without slots whose server only moved goes over the
// runtime API when MovesInPlace allows it: the command, a read-back, the
// file, no reload. A move HAProxy does not show within addressSettles
// reloads instead.
func TestMovedServersGoOverTheRuntimeAPIAndFallBackToAReload(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), backendLines{}, src)
	rt := &fakeRuntime{}
	r.a.opts.Runtime = rt
	r.a.opts.MovesInPlace = func() bool { return true }
	webAt(src, "10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)

	rt.shows("10.0.0.2")
	webAt(src, "10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the move applied over the runtime API", func() bool {
		return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)) == 1
	})
	rt.mu.Lock()
	cmds := slices.Clone(rt.cmds)
	rt.mu.Unlock()
	if want := []string{"set server web/i1 addr 10.0.0.2 port 80"}; !slices.Equal(cmds, want) {
		t.Errorf("commands %q, want %q", cmds, want)
	}
	if r.reloadCount() != 0 || !strings.Contains(r.file(t), "server i1 10.0.0.2:80") {
		t.Errorf("%d reloads, file %q", r.reloadCount(), r.file(t))
	}

	t.Log("HAProxy does not show the next move")
	webAt(src, "10.0.0.3")
	testenv.Eventually(t, 5*time.Second, "a reload instead", func() bool { return r.reloadCount() == 1 })
	if v := testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Failure)); v != 1 {
		t.Errorf("runtime failures = %v, want 1", v)
	}
	if !strings.Contains(r.file(t), "server i1 10.0.0.3:80") {
		t.Errorf("file %q after the fallback reload", r.file(t))
	}
}

// A move over the runtime API that fails, and whose fallback reload fails
// too, may leave HAProxy running part of it while the file is back to what
// ran before. The next apply reloads, also when the state went back to
// that file (which was "unchanged", and left the worker on the moved
// address), and only then do moves go over the runtime API again.
func TestAFailedMoveWhoseReloadFailedIsReloadedNextTime(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), backendLines{}, src)
	rt := &fakeRuntime{}
	r.a.opts.Runtime = rt
	r.a.opts.MovesInPlace = func() bool { return true }
	webAt(src, "10.0.0.1")
	rt.shows("10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)

	t.Log("the move is sent but never shows, and the reload after it fails")
	r.setReloadOK(false)
	webAt(src, "10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the fallback reload", func() bool { return r.reloadCount() == 1 })
	testenv.Eventually(t, 5*time.Second, "the file back to what ran", func() bool {
		return strings.Contains(r.file(t), "server i1 10.0.0.1:80")
	})

	t.Log("the state goes back to the file")
	r.setReloadOK(true)
	webAt(src, "10.0.0.1")
	testenv.Eventually(t, 3*time.Second, "a reload of the file HAProxy may not run", func() bool { return r.reloadCount() == 2 })

	t.Log("again, and then the state moves on: a reload too, not a move")
	r.setReloadOK(false)
	webAt(src, "10.0.0.4")
	testenv.Eventually(t, 5*time.Second, "the second fallback reload", func() bool { return r.reloadCount() == 3 })
	r.setReloadOK(true)
	rt.shows("10.0.0.3")
	webAt(src, "10.0.0.3")
	testenv.Eventually(t, 3*time.Second, "a reload of a move from a file HAProxy may not run", func() bool { return r.reloadCount() == 4 })
	if v := testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)); v != 0 {
		t.Errorf("runtime updates = %v, want none while HAProxy may not run the file", v)
	}

	t.Log("then a move goes over the runtime API again")
	rt.shows("10.0.0.5")
	webAt(src, "10.0.0.5")
	testenv.Eventually(t, 5*time.Second, "the move applied over the runtime API", func() bool {
		return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)) == 1
	})
	if n := r.reloadCount(); n != 4 {
		t.Errorf("%d reloads, want 4", n)
	}
}

// A reload whose outcome is unknown leaves HAProxy out of step with the
// file, as a failed runtime change does: HAProxy may yet load it while the
// file is back to the old one, so the next apply reloads. And a reload
// HAProxy refuses is not tried again with the same bytes, except the
// running configuration's while HAProxy is out of step: the old workers
// run those very bytes, and waiting for other ones would leave HAProxy
// out of step until the next change.
func TestAnUnconfirmedReloadThenARefusedOneOfTheRunningFileAreTriedAgain(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), backendLines{}, src)
	rt := &fakeRuntime{}
	var (
		mu      sync.Mutex
		outcome = reload.Outcome{OK: true}
	)
	outcomes := func(o reload.Outcome) {
		mu.Lock()
		defer mu.Unlock()
		outcome = o
	}
	r.a.opts.Reload = func(context.Context, string) (reload.Outcome, error) {
		r.mu.Lock()
		r.reloads = append(r.reloads, "reload")
		r.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		return outcome, nil
	}
	r.a.opts.Runtime = rt // moves reload (no MovesInPlace)
	webAt(src, "10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)

	t.Log("a move's reload has an unknown outcome")
	outcomes(reload.Outcome{Err: fmt.Errorf("%w: master gone quiet", haproxy.ErrUnconfirmed)})
	webAt(src, "10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the fallback reload", func() bool { return r.reloadCount() == 1 })

	t.Log("the state goes back to the file, whose reload HAProxy refuses")
	outcomes(reload.Outcome{Err: reload.ErrRefused})
	webAt(src, "10.0.0.1")
	testenv.Eventually(t, 3*time.Second, "a reload of the file HAProxy may not run", func() bool { return r.reloadCount() == 2 })

	t.Log("tried again with no change, until it is taken")
	outcomes(reload.Outcome{OK: true})
	testenv.Eventually(t, 5*time.Second, "the refused reload of the running bytes tried again", func() bool { return r.reloadCount() == 3 })
	if v := testutil.ToFloat64(r.m.Applies.WithLabelValues(metrics.Reloaded)); v != 1 {
		t.Errorf("reloaded applies = %v, want 1", v)
	}
}

// webAt sends a catalog of web's one instance, i1, at addr:80.
func webAt(src *fakeSource, addr string) {
	src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Source: "consul", Name: "web", ID: "i1", Address: addr, Port: 80, Status: model.StatusPassing},
	}}}}}
}

// shows makes the runtime show web/i1 at addr:80.
func (f *fakeRuntime) shows(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = []haproxy.ServerState{{Backend: "web", Server: "i1", Address: addr, Port: 80, Weight: 1}}
}
