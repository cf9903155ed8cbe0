package consul

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// wait is how long a test waits for Consul and the source to agree.
const wait = 20 * time.Second

// running is a Source running against a Consul, with every snapshot it
// sent.
type running struct {
	t      testing.TB
	src    *Source
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned

	mu    sync.Mutex
	snaps []model.Snapshot
	at    []time.Time     // when each of snaps came
	logs  strings.Builder // everything the source logged
}

// startSource runs a source for cfg against the Consul at addr, given as
// CONSUL_HTTP_ADDR (so the tests also show that Consul's variables apply),
// and wants queries.
func startSource(t testing.TB, addr string, cfg Config, queries ...model.Query) *running {
	t.Helper()
	return startWrapped(t, addr, cfg, nil, queries...)
}

// startWrapped is startSource with the snapshots read through wrap(the
// source, the log), as seamless reads them through the removal guard.
func startWrapped(t testing.TB, addr string, cfg Config, wrap func(model.Source, *slog.Logger) model.Source, queries ...model.Query) *running {
	t.Helper()
	t.Setenv("CONSUL_HTTP_ADDR", addr)
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	r := &running{t: t, done: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, lockedWriter{&r.mu, &r.logs}),
		&slog.HandlerOptions{Level: slog.LevelDebug}))
	src, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	src.Want(queries)
	ctx, cancel := context.WithCancel(context.Background())
	r.src, r.cancel = src, cancel
	out := make(chan model.Snapshot)
	var run model.Source = src
	if wrap != nil {
		run = wrap(src, log)
	}
	go func() {
		defer close(r.done)
		run.Run(ctx, out)
	}()
	go func() {
		for {
			select {
			case s := <-out:
				r.mu.Lock()
				r.snaps, r.at = append(r.snaps, s), append(r.at, time.Now())
				r.mu.Unlock()
			case <-r.done:
				return
			}
		}
	}()
	t.Cleanup(r.stop)
	return r
}

// stop cancels Run and waits for it to return.
func (r *running) stop() {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(wait):
		r.t.Errorf("Run did not return within %s of the cancel", wait)
	}
}

// last returns the newest snapshot and how many were sent.
func (r *running) last() (model.Snapshot, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.snaps) == 0 {
		return model.Snapshot{}, 0
	}
	return r.snaps[len(r.snaps)-1], len(r.snaps)
}

// logged returns what the source has logged so far.
func (r *running) logged() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logs.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// history returns every snapshot sent so far.
func (r *running) history() []model.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snaps)
}

// waitFor waits until the newest snapshot satisfies cond, and returns it.
func (r *running) waitFor(msg string, cond func(model.Snapshot) bool) model.Snapshot {
	r.t.Helper()
	var snap model.Snapshot
	testenv.Eventually(r.t, wait, msg, func() bool {
		var n int
		snap, n = r.last()
		return n > 0 && cond(snap)
	})
	return snap
}

// steady waits until the source has every watch blocked in Consul and no
// other request in flight: want is the number of watches.
func (r *running) steady(want uint64) {
	r.t.Helper()
	testenv.Eventually(r.t, wait, fmt.Sprintf("%d blocking queries open and nothing else in flight", want), func() bool {
		return r.src.InFlight() == want
	})
}

// watching is the number of blocking queries a catalog of n services holds
// while it is watched per service.
func watching(n int) uint64 { return uint64(n + fixedWatches) }

// instances returns the local catalog's instances of service name.
func instances(s model.Snapshot, name string) []model.Instance {
	r, ok := s.Results[model.LocalCatalog]
	if !ok || r.Catalog == nil {
		return nil
	}
	var out []model.Instance
	for _, in := range r.Catalog.All() {
		if in.Name == name {
			out = append(out, in)
		}
	}
	return out
}

// register puts svc on node (created with addr) straight into the catalog,
// with checks; the agent's anti-entropy leaves such nodes alone.
func register(t testing.TB, c *api.Client, node, addr string, svc *api.AgentService, checks ...*api.HealthCheck) {
	t.Helper()
	for _, ch := range checks {
		ch.Node = node
		if svc != nil && ch.ServiceID == "-" {
			ch.ServiceID = svc.ID
		}
	}
	reg := &api.CatalogRegistration{Node: node, Address: addr, Service: svc, Checks: checks,
		NodeMeta: map[string]string{"rack": "r1"}}
	if _, err := c.Catalog().Register(reg, nil); err != nil {
		t.Fatalf("registering %s on %s: %v", svc.ID, node, err)
	}
}

func deregister(t testing.TB, c *api.Client, node, serviceID string) {
	t.Helper()
	if _, err := c.Catalog().Deregister(&api.CatalogDeregistration{Node: node, ServiceID: serviceID}, nil); err != nil {
		t.Fatalf("deregistering %s on %s: %v", serviceID, node, err)
	}
}

func check(id, status string) *api.HealthCheck {
	return &api.HealthCheck{CheckID: id, Name: id, Status: status, ServiceID: "-"}
}

func nodeCheck(id, status string) *api.HealthCheck {
	return &api.HealthCheck{CheckID: id, Name: id, Status: status}
}
