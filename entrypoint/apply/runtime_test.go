package apply

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func sl(server, inst, addr string, port, weight int, state string) model.ServerSlot {
	return model.ServerSlot{Backend: "http-web", Server: server, Instance: inst, Address: addr, Port: port, Weight: weight, State: state}
}

func free(server string) model.ServerSlot { return sl(server, "", "", 0, 1, model.SlotMaint) }

func TestRuntimeCommands(t *testing.T) {
	from := []model.ServerSlot{sl("s1", "a", "10.0.0.1", 80, 1, model.SlotReady), sl("s2", "b", "10.0.0.2", 80, 1, model.SlotReady), free("s3")}
	takeS3 := []model.ServerSlot{from[0], from[1], sl("s3", "c", "10.0.0.3", 8080, 2, model.SlotReady)}
	for _, tc := range []struct {
		name     string
		to       []model.ServerSlot
		want     []string
		wantErr  string
		noChecks bool // SEAMLESS_HEALTH_CHECKS=false
	}{
		{"nothing changed", from, nil, "", false},
		{"an instance takes a free slot", takeS3,
			[]string{"set server http-web/s3 addr 10.0.0.3 port 8080", "set server http-web/s3 weight 2",
				"set server http-web/s3 state ready", "set server http-web/s3 health up"}, "", false},
		// HAProxy takes "health up" on a server without check, but the
		// health is not its to set: only the source's.
		{"without health checks, a taken slot's health is left alone", takeS3,
			[]string{"set server http-web/s3 addr 10.0.0.3 port 8080", "set server http-web/s3 weight 2",
				"set server http-web/s3 state ready"}, "", true},
		{"a removed instance drains, a drained one is freed", []model.ServerSlot{sl("s1", "a", "10.0.0.1", 80, 1, model.SlotDrain), free("s2"), free("s3")},
			[]string{"set server http-web/s1 state drain", "set server http-web/s2 state maint"}, "", false},
		{"a weight changes", []model.ServerSlot{sl("s1", "a", "10.0.0.1", 80, 7, model.SlotReady), from[1], from[2]},
			[]string{"set server http-web/s1 weight 7"}, "", false},
		{"a DNS name needs a reload", []model.ServerSlot{from[0], from[1], sl("s3", "c", "web.internal", 80, 1, model.SlotReady)},
			nil, "only IP addresses", false},
		{"more slots need a reload", append(slices.Clone(from), free("s4")), nil, "slots differ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := runtimeCommands(from, tc.to, !tc.noChecks)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("plan = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestVerify(t *testing.T) {
	want := []model.ServerSlot{sl("s1", "a", "10.0.0.1", 80, 2, model.SlotReady), sl("s2", "b", "10.0.0.2", 80, 1, model.SlotDrain), free("s3")}
	ok := []haproxy.ServerState{
		{Backend: "http-web", Server: "s1", Address: "10.0.0.1", Port: 80, Weight: 2, Admin: 4}, // configured disabled, set ready
		{Backend: "http-web", Server: "s2", Address: "10.0.0.2", Port: 80, Weight: 1, Admin: 8},
		{Backend: "http-web", Server: "s3", Address: "127.0.0.1", Port: 1, Weight: 1, Admin: 5},
	}
	all := map[string]bool{"http-web/s1": true, "http-web/s2": true, "http-web/s3": true}
	if err := verify(want, ok, all); err != nil {
		t.Errorf("matching state refused: %v", err)
	}
	wrongPort := slices.Clone(ok)
	wrongPort[0].Port = 81
	stillReady := slices.Clone(ok)
	stillReady[1].Admin = 0
	for name, got := range map[string][]haproxy.ServerState{"wrong port": wrongPort, "drain not applied": stillReady, "server missing": ok[1:]} {
		if err := verify(want, got, all); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// An operator drained s1 by hand; a plan that touches only s3 leaves
	// it so.
	drained := slices.Clone(ok)
	drained[0].Admin = 8
	if err := verify(want, drained, map[string]bool{"http-web/s3": true}); err != nil {
		t.Errorf("an operator's drain on an untouched slot refused: %v", err)
	}
	// A slot addressed by a name: HAProxy reports the resolved address.
	named := slices.Clone(want)
	named[0].Address = "web.internal"
	if err := verify(named, ok, all); err != nil {
		t.Errorf("a DNS-named slot refused: %v", err)
	}
}

func TestKeepStateCarriesOnlyUnmovedServers(t *testing.T) {
	raw := "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n" +
		"2 http-web 1 s1 10.0.0.1 2 8 1 1 80\n" + // draining, keeps its instance
		"2 http-web 2 s2 10.0.0.2 2 0 5 1 80\n" + // ready, its slot now holds another instance
		"2 http-web 3 s3 10.0.0.3 2 0 1 1 80\n" + // freed
		"2 http-web 4 s4 10.0.0.4 2 1 1 1 80\n" // drained and freed; its instance is back
	prev := []model.ServerSlot{sl("s1", "a", "10.0.0.1", 80, 1, model.SlotDrain), sl("s2", "b", "10.0.0.2", 80, 5, model.SlotReady),
		sl("s3", "c", "10.0.0.3", 80, 1, model.SlotReady), free("s4"), sl("s5", "e", "10.0.0.5", 80, 1, model.SlotReady)}
	next := []model.ServerSlot{sl("s1", "a", "10.0.0.1", 80, 1, model.SlotDrain), sl("s2", "x", "10.0.0.9", 80, 1, model.SlotReady),
		free("s3"), sl("s4", "d", "10.0.0.4", 80, 1, model.SlotReady), sl("s5", "e", "10.0.0.5", 80, 1, model.SlotReady)}
	prev = append(prev, sl("s6", "f", "10.0.0.6", 80, 1, model.SlotDrain))
	next = append(next, sl("s6", "f", "10.0.0.6", 80, 1, model.SlotReady))
	raw += "2 http-web 5 s5 10.0.0.5 2 1 1 1 80\n" + // an operator put it in maintenance
		"2 http-web 6 s6 10.0.0.6 2 8 1 1 80\n" // drained by seamless; its instance is back
	got := keepState(raw, prev, next, nil)
	if !strings.Contains(got, " s1 ") || strings.Contains(got, " s2 ") || strings.Contains(got, " s3 ") ||
		strings.Contains(got, " s4 ") || !strings.Contains(got, " s5 ") || strings.Contains(got, " s6 ") {
		t.Errorf("kept:\n%s\nwant s1 (draining) and s5 (operator's maintenance) only", got)
	}
	if !strings.HasPrefix(got, "1\n# be_id") {
		t.Errorf("kept state lost its header:\n%s", got)
	}
	// s1's drain may be a failed change's, not the file's.
	if got := keepState(raw, prev, next, map[string]bool{"http-web/s1": true}); strings.Contains(got, " s1 ") || !strings.Contains(got, " s5 ") {
		t.Errorf("kept, with s1 untrusted:\n%s\nwant s5 only", got)
	}
}

// A change applied over the runtime API reads back the servers of the
// backend it changed, not every server of the configuration (at 1000
// services × 16 slots, `show servers state` is 16,000 lines a change).
func TestARuntimeChangeReadsBackOnlyWhatItTouched(t *testing.T) {
	src := newSource("consul")
	renderer, err := routes.New(slotOptions(routes.NewSlotTable()), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, t.TempDir(), renderer, src)
	r.a.opts.Validate = func(context.Context, string) error { return nil }
	both := func(web ...string) model.Snapshot {
		s := webInstances(web...)
		c := s.Results[model.LocalCatalog].Catalog
		c.Instances = append(c.Instances, model.Instance{Source: "consul", Name: "api", ID: "a1", Node: "n1",
			Address: "10.0.1.1", Port: 8080, Status: model.StatusPassing, Tags: []string{"seamless.http.host=api.example"}})
		model.SortCatalog(c)
		return s
	}
	src.ch <- both("w1", "w2")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	h := newHAProxyServers(r.a.runRend.Servers.Flat())
	r.a.opts.Runtime = h
	r.run(t)
	src.ch <- both("w1", "w2", "w3")
	testenv.Eventually(t, 5*time.Second, "the change goes over the runtime API", func() bool {
		return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)) == 1
	})
	if n := h.serversRead(); n != 4 {
		t.Errorf("read back %d servers, want the 4 slots of web's backend", n)
	}
}
