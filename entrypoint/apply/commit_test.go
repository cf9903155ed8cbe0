package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// haproxyServers stands in for HAProxy's runtime API at the unit's edge:
// it keeps the servers' state and applies `set server` to it, or fails
// every command while fail is set.
type haproxyServers struct {
	mu   sync.Mutex
	fail error
	// failAfter fails a change after applying it: the connection broke
	// before HAProxy's answers came back.
	failAfter error
	servers   map[string]*haproxy.ServerState
	order     []string
	read      int // servers whose state was read
}

func newHAProxyServers(slots []model.ServerSlot) *haproxyServers {
	h := &haproxyServers{servers: map[string]*haproxy.ServerState{}}
	for _, s := range slots {
		k := slotKey(s.Backend, s.Server)
		st := &haproxy.ServerState{Backend: s.Backend, Server: s.Server, Address: s.Address, Port: s.Port, Weight: s.Weight}
		h.setState(st, s.State)
		h.servers[k] = st
		h.order = append(h.order, k)
	}
	return h
}

func (h *haproxyServers) setState(s *haproxy.ServerState, state string) {
	switch state {
	case model.SlotMaint:
		s.Admin = 0x01
	case model.SlotDrain:
		s.Admin = 0x08
	default:
		s.Admin = 0
	}
}

func (h *haproxyServers) setFail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fail = err
}

func (h *haproxyServers) setFailAfter(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failAfter = err
}

func (h *haproxyServers) Apply(_ context.Context, cmds []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail != nil {
		return h.fail
	}
	for _, c := range cmds {
		f := strings.Fields(c) // set server B/S what args...
		s := h.servers[f[2]]
		if s == nil {
			return errors.New("No such server: " + f[2])
		}
		switch f[3] {
		case "addr":
			s.Address = f[4]
			s.Port, _ = strconv.Atoi(f[6])
		case "weight":
			s.Weight, _ = strconv.Atoi(f[4])
		case "state":
			h.setState(s, f[4])
		}
	}
	return h.failAfter
}

func (h *haproxyServers) ServersState(context.Context) (string, []haproxy.ServerState, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []haproxy.ServerState
	var raw strings.Builder
	raw.WriteString("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n")
	for i, k := range h.order {
		s := h.servers[k]
		out = append(out, *s)
		fmt.Fprintf(&raw, "1 %s %d %s %s 2 %d %d %d %d\n", s.Backend, i+1, s.Server, cmp.Or(s.Address, "0.0.0.0"), s.Admin, s.Weight, s.Weight, s.Port)
	}
	h.read += len(out)
	return raw.String(), out, nil
}

func (h *haproxyServers) BackendServersState(_ context.Context, backends []string) ([]haproxy.ServerState, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail != nil {
		return nil, h.fail
	}
	var out []haproxy.ServerState
	for _, k := range h.order {
		if s := h.servers[k]; slices.Contains(backends, s.Backend) {
			out = append(out, *s)
		}
	}
	h.read += len(out)
	return out, nil
}

func (h *haproxyServers) serversRead() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.read
}

func webInstances(ids ...string) model.Snapshot {
	c := &model.Catalog{}
	for _, id := range ids {
		c.Instances = append(c.Instances, model.Instance{Source: "consul", Name: "web", ID: id, Node: "n1",
			Address: "10.0.0." + strings.TrimPrefix(id, "w"), Port: 8080, Status: model.StatusPassing,
			Tags: []string{"seamless.http.host=web.example"}})
	}
	return model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
}

func slotOptions(table *routes.SlotTable) routes.Options {
	return routes.Options{HTTPBind: "127.0.0.1:18080", Slots: 4, DrainTimeout: time.Hour, Table: table}
}

func renderBuiltin(t *testing.T, table *routes.SlotTable, snaps ...model.Snapshot) model.Rendering {
	t.Helper()
	r, err := routes.New(slotOptions(table), nil)
	if err != nil {
		t.Fatal(err)
	}
	var rend model.Rendering
	for _, s := range snaps {
		if rend, err = r.Render(model.Merge(map[string]model.Snapshot{s.Source: s}, nil)); err != nil {
			t.Fatal(err)
		}
		rend.Commit()
	}
	return rend
}

// A change HAProxy did not take (the runtime API failed, then the reload
// failed and the file was rolled back) leaves the slot table where it
// was: the next change is assigned its slots as if the failed one had
// never happened.
// A slot change that broke off after HAProxy took it (a drain), and
// whose fallback reload failed, leaves that slot's runtime state out of
// step with the file. The reload that catches up does not carry that state
// over to the new worker: the server-state file leaves the slot out.
func TestASlotStateAFailedChangeLeftIsNotCarriedOver(t *testing.T) {
	src := newSource("consul")
	table := routes.NewSlotTable()
	renderer, err := routes.New(slotOptions(table), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := newRig(t, dir, renderer, src)
	r.a.opts.Validate = func(context.Context, string) error { return nil }
	r.a.opts.StateFile = filepath.Join(dir, "server-state")
	src.ch <- webInstances("w1", "w2")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	h := newHAProxyServers(r.a.runRend.Servers.Flat())
	r.a.opts.Runtime = h
	r.run(t)
	var w2 string // w2's slot
	for _, s := range r.a.runRend.Servers.Flat() {
		if s.Instance != "" && strings.HasSuffix(s.Address, ".2") {
			w2 = " " + s.Server + " "
		}
	}

	h.setFailAfter(errors.New("read unix master.sock: connection reset by peer"))
	r.setReloadOK(false)
	src.ch <- webInstances("w1")
	testenv.Eventually(t, 5*time.Second, "the failed change's reload", func() bool { return r.reloadCount() == 1 })

	h.setFailAfter(nil)
	r.setReloadOK(true)
	src.ch <- webInstances("w1", "w2")
	testenv.Eventually(t, 5*time.Second, "the reload that catches up", func() bool { return r.reloadCount() == 2 })
	b, err := os.ReadFile(r.a.opts.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	if w2 == "" || strings.Contains(string(b), w2) || !strings.Contains(string(b), "http-web") {
		t.Errorf("server-state file for the reload that caught up:\n%s\nwant w1's slot and not w2's (%q), drained by the failed change", b, w2)
	}
}

func TestAChangeHAProxyDidNotTakeLeavesTheSlotTable(t *testing.T) {
	src := newSource("consul")
	table := routes.NewSlotTable()
	renderer, err := routes.New(slotOptions(table), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, t.TempDir(), renderer, src)
	r.a.opts.Validate = func(context.Context, string) error { return nil }
	src.ch <- webInstances("w1", "w2")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	running := r.file(t)
	h := newHAProxyServers(r.a.runRend.Servers.Flat())
	r.a.opts.Runtime = h
	r.run(t)

	h.setFail(fmt.Errorf("%w: dial unix master.sock: connection refused", haproxy.ErrNotApplied))
	r.setReloadOK(false)
	src.ch <- webInstances("w1", "w2", "w3")
	testenv.Eventually(t, 5*time.Second, "the change fails", func() bool {
		return testutil.ToFloat64(r.m.Applies.WithLabelValues(metrics.Failed)) == 1
	})
	if got := r.file(t); got != running {
		t.Fatalf("the file is not the running configuration after the failure:\n%s", got)
	}
	if again := renderBuiltin(t, table, webInstances("w1", "w2")); string(again.Config) != running {
		t.Errorf("the committed table moved: the running state renders\n%s\nwhere HAProxy runs\n%s", again.Config, running)
	}

	h.setFail(nil)
	r.setReloadOK(true)
	src.ch <- webInstances("w1", "w2", "w4")
	testenv.Eventually(t, 5*time.Second, "the next change goes over the runtime API", func() bool {
		return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)) == 1
	})
	want := renderBuiltin(t, routes.NewSlotTable(), webInstances("w1", "w2"), webInstances("w1", "w2", "w4"))
	if got := r.file(t); got != string(want.Config) {
		t.Errorf("after the failed change, the next one runs\n%s\nwant, as if the failure never happened,\n%s", got, want.Config)
	}
	if n := r.reloadCount(); n != 1 {
		t.Errorf("%d reloads, want only the failed one", n)
	}
}
