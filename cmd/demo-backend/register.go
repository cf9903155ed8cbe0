package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// registration keeps this instance registered in a Consul agent.
type registration struct {
	cfg *consulConfig
	reg *api.AgentServiceRegistration
	api *api.Client
	log *slog.Logger

	registered bool // owned by keep, read by deregister after keep returned
}

// requestTimeout bounds each call to the agent.
const requestTimeout = 5 * time.Second

func newRegistration(cfg config, log *slog.Logger) (*registration, error) {
	c := cfg.Consul
	client, err := api.NewClient(c.API)
	if err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	hostPort := net.JoinHostPort(c.Address, strconv.Itoa(c.Port))
	return &registration{
		cfg: c,
		api: client,
		log: log.With("component", "consul", "service", c.Service, "id", c.ID),
		reg: &api.AgentServiceRegistration{
			ID:      c.ID,
			Name:    c.Service,
			Tags:    c.Tags,
			Address: c.Address,
			Port:    c.Port,
			Check: &api.AgentServiceCheck{
				CheckID:                        "service:" + c.ID,
				Name:                           "HTTP /healthz",
				HTTP:                           "http://" + hostPort + "/healthz",
				Method:                         "GET",
				Interval:                       c.CheckInterval.String(),
				Timeout:                        min(c.CheckInterval, time.Second).String(),
				DeregisterCriticalServiceAfter: c.DeregisterAfter.String(),
			},
		},
	}, nil
}

// keep registers the instance, retrying with backoff until it succeeds,
// then every Resync checks that the agent still has it (an agent restarted
// in -dev mode forgets every registration) and registers it again if not.
// It returns when ctx ends.
func (r *registration) keep(ctx context.Context) {
	backoff := 250 * time.Millisecond
	wait := time.Duration(0)
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		present, err := r.present(ctx)
		if err == nil && !present {
			err = r.register(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("consul registration failed; retrying", "err", err, "retry_in", backoff)
			wait, backoff = backoff, min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 250 * time.Millisecond
		wait = r.cfg.Resync
	}
}

// present reports whether the agent has the registration; false before the
// first successful one.
func (r *registration) present(ctx context.Context) (bool, error) {
	if !r.registered {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	svc, _, err := r.api.Agent().Service(r.cfg.ID, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		if e := (api.StatusError{}); errors.As(err, &e) && e.Code == 404 {
			r.log.Warn("the consul agent lost the registration; registering again")
			return false, nil
		}
		return false, err
	}
	return svc != nil, nil
}

func (r *registration) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	opts := api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx)
	if err := r.api.Agent().ServiceRegisterOpts(r.reg, opts); err != nil {
		return err
	}
	r.registered = true
	r.log.Info("registered in consul", "address", r.reg.Address, "port", r.reg.Port, "tags", r.reg.Tags,
		"check", r.reg.Check.HTTP, "agent", r.addr())
	return nil
}

// deregister removes the registration, retrying until it succeeds or
// until deadline: an instance left registered stays routed to until its
// check fails, after it stopped. It reports whether anyone may have routed
// to this instance: a drain is then worth waiting for.
func (r *registration) deregister(deadline time.Time) bool {
	if !r.registered {
		r.log.Info("never registered in consul; nothing to deregister")
		return false
	}
	backoff := 100 * time.Millisecond
	for first := true; ; first = false {
		end := time.Now().Add(requestTimeout)
		if !first { // the first attempt has its time whatever the bound
			end = earliest(end, deadline)
		}
		ctx, cancel := context.WithDeadline(context.Background(), end)
		err := r.api.Agent().ServiceDeregisterOpts(r.cfg.ID, (&api.QueryOptions{}).WithContext(ctx))
		cancel()
		if err == nil {
			r.log.Info("deregistered from consul")
			r.leaveCatalog(deadline)
			return true
		}
		if !time.Now().Add(backoff).Before(deadline) {
			// The check fails once the server stops; Consul takes the
			// instance out then.
			r.log.Error("deregistering from consul failed; giving up at the drain's bound", "err", err)
			return true
		}
		r.log.Warn("deregistering from consul failed; retrying", "err", err, "retry_in", backoff)
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// catalogGrace is how long the servers' catalog may still list the
// instance once the agent took its deregistration. The agent syncs a
// deregistration to its servers before it answers, but answers 200 when
// that sync failed too, and leaves it to its anti-entropy run, up to a
// minute later: load balancers would route to the instance all along.
const catalogGrace = 2 * time.Second

// catalogPoll spaces the reads of the catalog while it lists the instance.
const catalogPoll = 250 * time.Millisecond

// leaveCatalog returns once the servers' catalog no longer lists the
// instance on this agent's node, or at deadline. Past catalogGrace it
// deregisters the instance from the catalog itself: the agent has
// forgotten it, so its anti-entropy would remove it the same way, later.
// Only this node's entry is touched: an ID is unique per node, not in
// the catalog.
func (r *registration) leaveCatalog(deadline time.Time) {
	start := time.Now()
	node, err := r.nodeName(earliest(start.Add(requestTimeout), deadline))
	if err != nil || node == "" {
		r.log.Warn("cannot tell whether the catalog still lists this instance: the agent names no node", "err", err)
		return
	}
	filter, ok := catalogFilter(node, r.cfg.ID)
	if !ok {
		r.log.Warn("cannot tell whether the catalog still lists this instance: its ID cannot be quoted in a filter")
		return
	}
	cleared, failures := false, 0
	var last error
	for {
		ctx, cancel := context.WithDeadline(context.Background(), earliest(time.Now().Add(requestTimeout), deadline))
		listed, err := r.listed(ctx, node, filter)
		cancel()
		switch {
		case errors.Is(err, errCannotTell):
			r.log.Info("cannot tell whether the catalog still lists this instance", "err", err)
			return
		case err != nil:
			if failures == 0 {
				r.log.Warn("reading the catalog failed; retrying", "err", err)
			}
			failures, last = failures+1, err
		case !listed:
			r.log.Info("left the catalog", "after", time.Since(start).Round(time.Millisecond))
			return
		case !cleared && time.Since(start) >= catalogGrace:
			cleared = true
			r.log.Warn("the catalog still lists this instance after the agent took its deregistration; deregistering it from the catalog",
				"after", time.Since(start).Round(time.Millisecond), "node", node)
			ctx, cancel := context.WithDeadline(context.Background(), earliest(time.Now().Add(requestTimeout), deadline))
			_, err := r.api.Catalog().Deregister(&api.CatalogDeregistration{Node: node, ServiceID: r.cfg.ID}, (&api.WriteOptions{}).WithContext(ctx))
			cancel()
			if err != nil {
				r.log.Warn("deregistering from the catalog failed", "err", err)
			}
			continue
		default:
			last = nil
		}
		if !time.Now().Add(catalogPoll).Before(deadline) {
			if last != nil {
				r.log.Error("could not read the catalog until the drain's bound", "failures", failures, "err", last)
			} else {
				r.log.Error("the catalog still lists this instance at the drain's bound", "after", time.Since(start).Round(time.Millisecond))
			}
			return
		}
		time.Sleep(catalogPoll)
	}
}

// nodeName is the agent's node, read from /v1/agent/self by deadline.
func (r *registration) nodeName(deadline time.Time) (string, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var self struct{ Config struct{ NodeName string } }
	_, err := r.api.Raw().Query("/v1/agent/self", &self, (&api.QueryOptions{}).WithContext(ctx))
	return self.Config.NodeName, err
}

// errCannotTell: the agent's answer cannot say whether the instance is
// listed (no catalog served, or entries hidden by ACLs).
var errCannotTell = errors.New("cannot tell")

// catalogFilter selects this instance's entry on node. Consul's filter
// strings end at the first double quote, escaped or not; a raw string
// (backquotes) takes everything else as it is.
func catalogFilter(node, id string) (string, bool) {
	if strings.Contains(node+id, "`") {
		return "", false
	}
	return "Node == `" + node + "` and ServiceID == `" + id + "`", true
}

// listed reports whether the servers' catalog lists the instance on node.
func (r *registration) listed(ctx context.Context, node, filter string) (bool, error) {
	q := (&api.QueryOptions{Filter: filter}).WithContext(ctx)
	svcs, meta, err := r.api.Catalog().Service(r.cfg.Service, "", q)
	if e := (api.StatusError{}); errors.As(err, &e) && e.Code == 404 {
		return false, fmt.Errorf("%w: the agent serves no catalog (%v)", errCannotTell, err)
	}
	if err != nil {
		return false, err
	}
	for _, s := range svcs {
		if s.Node == node && s.ServiceID == r.cfg.ID {
			return true, nil
		}
	}
	if meta != nil && meta.ResultsFilteredByACLs {
		return false, fmt.Errorf("%w: the token may not read every entry (it needs node:read and service:read)", errCannotTell)
	}
	return false, nil
}

func (r *registration) addr() string {
	return r.cfg.API.Scheme + "://" + r.cfg.API.Address
}
