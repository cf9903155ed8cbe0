package consul

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// publicCatalog watches a catalog through public endpoints only, for a
// Consul that does not serve the node dump: three blocking queries wake it
// (nodes, services, checks) and every change re-lists the catalog with one
// request per service. See the package documentation for the cost.
type publicCatalog struct {
	s      *Source
	dc     string
	dcName string
	set    *watchSet
	// indexes of the three wake-up endpoints, from the last listing.
	index  [len(wakePaths)]uint64
	last   model.Result
	listed bool
}

// wakePaths are the blocking queries that together cover the nodes,
// services and checks tables.
var wakePaths = [...]string{"/v1/catalog/nodes", "/v1/catalog/services", "/v1/health/state/any"}

func (p *publicCatalog) fetch(ctx context.Context) (model.Result, error) {
	if p.listed {
		changed, err := p.wait(ctx)
		if err != nil {
			// Read afresh next time: a Consul that came back with less
			// data would hold the old indexes until the wait ran out.
			p.listed = false
			return p.last, err
		}
		if !changed {
			return p.last, nil
		}
	}
	r, err := p.list(ctx)
	if err != nil {
		return model.Result{}, err
	}
	p.last, p.listed = r, true
	return r, nil
}

// wait holds the three blocking queries open until the first of them
// returns: true when its index moved, false when its wait ran out (fetch
// then starts all three again, so no table goes unwatched), or its error.
// The others are cancelled, and wait returns only once they have ended.
func (p *publicCatalog) wait(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	type answer struct {
		i     int
		index uint64
		err   error
	}
	answers := make(chan answer, len(wakePaths))
	for i, path := range wakePaths {
		wg.Go(func() {
			opts, cancel := p.s.queryOptions(ctx, p.dc, p.index[i])
			defer cancel()
			var discard json.RawMessage
			meta, err := p.s.client.Raw().Query(path, &discard, opts)
			a := answer{i: i, err: err}
			if meta != nil {
				a.index = meta.LastIndex
			}
			answers <- a
		})
	}
	a := <-answers
	return a.err == nil && a.index != p.index[a.i], a.err
}

// fresh is the index to wait on for wake path i after a listing answered
// got: the listing is current, whatever the earlier index was.
func (p *publicCatalog) fresh(i int, got uint64) uint64 {
	if prev := p.index[i]; got < prev {
		p.s.noteReset()
		p.s.log.Warn("Consul's index went backwards (restarted with less data, or another server answered): starting the query over",
			"query", wakePaths[i], "consul", p.s.addr(), "from", prev, "to", got)
	}
	return nextIndex(0, got)
}

// list reads the whole catalog: nodes, service names, then each service
// with its checks.
func (p *publicCatalog) list(ctx context.Context) (model.Result, error) {
	opts, cancel := p.s.queryOptions(ctx, p.dc, 0)
	defer cancel()
	var idx [len(wakePaths)]uint64

	nodes, meta, err := p.s.client.Catalog().Nodes(opts)
	if err != nil {
		return model.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	idx[0] = p.fresh(0, meta.LastIndex)
	services, meta, err := p.s.client.Catalog().Services(opts)
	if err != nil {
		return model.Result{}, fmt.Errorf("listing services: %w", err)
	}
	idx[1] = p.fresh(1, meta.LastIndex)
	// The check index is only needed to wait on: an answer filtered to no
	// check at all keeps the body small.
	chkOpts := *opts
	chkOpts.Filter = `CheckID == ""`
	_, meta, err = p.s.client.Health().State(api.HealthAny, &chkOpts)
	if err != nil {
		return model.Result{}, fmt.Errorf("listing checks: %w", err)
	}
	idx[2] = p.fresh(2, meta.LastIndex)

	byNode := map[string]*nodeInfo{}
	var dump []*nodeInfo
	for _, n := range nodes {
		if n == nil || byNode[n.Node] != nil {
			continue
		}
		ni := &nodeInfo{ID: n.ID, Node: n.Node, Address: n.Address, Datacenter: n.Datacenter,
			TaggedAddresses: n.TaggedAddresses, Meta: n.Meta}
		byNode[n.Node] = ni
		dump = append(dump, ni)
		if p.dcName == "" && p.dc == "" {
			p.dcName = n.Datacenter
		}
	}
	// Only the services used are read, as per service.
	for _, name := range p.set.update(services) {
		entries, _, err := p.s.client.Health().Service(name, "", false, opts)
		if err != nil {
			return model.Result{}, fmt.Errorf("listing service %q: %w", name, err)
		}
		for _, e := range entries {
			if e == nil || e.Node == nil || e.Service == nil {
				continue
			}
			ni := byNode[e.Node.Node]
			if ni == nil { // registered after the node list was read
				ni = &nodeInfo{ID: e.Node.ID, Node: e.Node.Node, Address: e.Node.Address,
					Datacenter: e.Node.Datacenter, TaggedAddresses: e.Node.TaggedAddresses, Meta: e.Node.Meta}
				byNode[e.Node.Node] = ni
				dump = append(dump, ni)
			}
			ni.Services = append(ni.Services, fromAgentService(e.Service))
			for _, c := range e.Checks {
				if c == nil || (c.ServiceID == "" && slices.ContainsFunc(ni.Checks, func(h *healthCheck) bool {
					return h.CheckID == c.CheckID
				})) {
					continue // node checks come with every instance of the node
				}
				ni.Checks = append(ni.Checks, &healthCheck{Node: c.Node, CheckID: c.CheckID, Name: c.Name,
					Status: c.Status, Notes: c.Notes, Output: c.Output, ServiceID: c.ServiceID, ServiceName: c.ServiceName})
			}
		}
	}
	p.index = idx
	dc := p.dc
	if dc == "" {
		dc = p.dcName
	}
	cat := convertDump(dump, dc, p.s.cfg.TagFilter)
	cat.Index = max(idx[0], idx[1], idx[2])
	return model.Result{Catalog: cat}, nil
}

func fromAgentService(s *api.AgentService) *nodeService {
	ns := &nodeService{Kind: string(s.Kind), ID: s.ID, Service: s.Service, Tags: s.Tags, Address: s.Address,
		Meta: s.Meta, Port: s.Port, Namespace: s.Namespace, PeerName: s.PeerName, CreateIndex: s.CreateIndex,
		Weights: &weights{Passing: s.Weights.Passing, Warning: s.Weights.Warning}}
	if len(s.TaggedAddresses) > 0 {
		ns.TaggedAddresses = make(map[string]serviceAddress, len(s.TaggedAddresses))
		for k, a := range s.TaggedAddresses {
			ns.TaggedAddresses[k] = serviceAddress{Address: a.Address, Port: a.Port}
		}
	}
	return ns
}
