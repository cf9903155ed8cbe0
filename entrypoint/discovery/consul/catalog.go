package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// nodeDumpPath is the internal endpoint the Consul UI lists nodes with.
const nodeDumpPath = "/v1/internal/ui/nodes"

// nodeInfo is one entry of the node dump (Consul's structs.NodeInfo), and
// what the fallback assembles from public endpoints.
type nodeInfo struct {
	ID              string
	Node            string
	PeerName        string
	Address         string
	Datacenter      string // not in the dump; the fallback knows it
	TaggedAddresses map[string]string
	Meta            map[string]string
	Services        []*nodeService
	Checks          []*healthCheck
}

// nodeService is Consul's structs.NodeService, the fields seamless uses.
type nodeService struct {
	Kind            string
	ID              string
	Service         string
	Tags            []string
	Address         string
	TaggedAddresses map[string]serviceAddress
	Meta            map[string]string
	Port            int
	Weights         *weights
	Namespace       string
	PeerName        string
	CreateIndex     uint64 // orders registrations: the earliest keeps a contested route
}

type serviceAddress struct {
	Address string
	Port    int
}

type weights struct {
	Passing int
	Warning int
}

// healthCheck is Consul's structs.HealthCheck, the fields seamless uses.
type healthCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
}

// catalogFetcher watches the whole catalog of a datacenter: per service
// (splitCatalog) while the services fit the budget of blocking queries,
// else with one blocking query on the node dump.
type catalogFetcher struct {
	s      *Source
	dc     string // "" = the agent's
	budget int
	set    *watchSet     // which services are watched, in every mode
	split  *splitCatalog // the per-service watches; nil while the dump serves
	dump   bool          // over the budget: the node dump serves

	dcName string // the datacenter's name, once known
	cur    cursor
	last   model.Result
	have   bool
	// public replaces the node dump once it answered 404.
	public *publicCatalog
}

func (f *catalogFetcher) fetch(ctx context.Context) (model.Result, error) {
	if f.dump {
		r, err := f.fetchDump(ctx)
		if err != nil {
			return r, err
		}
		// Back under the budget, with some room so that one service
		// coming and going does not flip the mode each time. The dump's
		// answer serves until the per-service watches have all answered.
		if n := serviceCount(r.Catalog); n+fixedWatches <= f.budget-max(1, f.budget/8) {
			f.s.log.Info("the catalog fits the budget of blocking queries again: watching it per service",
				"datacenter", cmp.Or(f.dc, f.dcName), "services", n, "budget", f.budget)
			f.dump = false
		}
		return r, nil
	}
	if f.split == nil {
		f.split = newSplitCatalog(ctx, f.s, f.dc, f.budget, f.set)
	}
	cat, err := f.split.fetch(ctx)
	if over := (*overBudget)(nil); errors.As(err, &over) {
		f.split.stop()
		f.split, f.dump = nil, true
		f.cur, f.have = cursor{}, false // read afresh
		f.s.log.Warn(fmt.Sprintf("the catalog has %d services to watch, more than the budget of %d blocking queries "+
			"(one per service plus %d) allows: reading it with one query on the node dump instead, the whole catalog at every change; "+
			"raise SEAMLESS_CONSUL_WATCHES, and the agent's http_max_conns_per_client (default 200) above it, to watch per service",
			over.services, f.budget, fixedWatches),
			"datacenter", cmp.Or(f.dc, f.dcName), "services", over.services, "budget", f.budget)
		return f.fetchDump(ctx)
	}
	if err != nil {
		return model.Result{}, err
	}
	if cat.Datacenter != "" {
		f.dcName = cat.Datacenter
	}
	return model.Result{Catalog: cat}, nil
}

// pace is the per-service catalog's, while it serves (selfPaced), after
// the catalog it passed on last. It runs on the watch's goroutine, which
// is the one that fetches.
func (f *catalogFetcher) pace() (time.Duration, bool) {
	if f.split == nil {
		return 0, false
	}
	n := 0
	if f.split.last != nil {
		n = f.split.last.Len()
	}
	return catalogPace(n), true
}

// staleness is the per-service watches' staleness, while they serve.
func (f *catalogFetcher) staleness() (string, bool) {
	if f.split == nil {
		return "", false
	}
	return f.split.staleness(), true
}

// close ends the per-service watches.
func (f *catalogFetcher) close() {
	if f.split != nil {
		f.split.stop()
		f.split = nil
	}
}

// serviceCount is the number of services with an instance in cat.
func serviceCount(cat *model.Catalog) int {
	n := 0
	for range cat.Services() { // sorted by name: one run per service
		n++
	}
	return n
}

// fetchDump reads the catalog with one blocking query on the node dump.
func (f *catalogFetcher) fetchDump(ctx context.Context) (model.Result, error) {
	if f.public != nil {
		return f.public.fetch(ctx)
	}
	opts, cancel := f.s.queryOptions(ctx, f.dc, f.cur.wait())
	defer cancel()
	dump, meta, err := f.s.readDump(opts)
	if se := (api.StatusError{}); errors.As(err, &se) && se.Code == http.StatusNotFound {
		f.s.log.Warn("Consul does not serve "+nodeDumpPath+" (a proxy in front of it, or a Consul without it): "+
			"watching public endpoints instead, with one request per service at every change",
			"consul", f.s.addr(), "answer", se.Body)
		f.public = &publicCatalog{s: f.s, dc: f.dc, dcName: f.dcName, set: f.set}
		return f.public.fetch(ctx)
	}
	if err != nil {
		f.cur.failed()
		return model.Result{}, err
	}
	if f.dcName == "" {
		if f.dcName, err = f.datacenterOf(ctx, dump); err != nil {
			f.cur.failed()
			return model.Result{}, err
		}
	}
	if !f.cur.answered(meta.LastIndex, f.s, model.Query{Kind: model.QueryCatalog, Datacenter: f.dc}.String()) && f.have {
		return f.last, nil // the wait ran out; nothing changed
	}
	if meta.ResultsFilteredByACLs && !f.have {
		f.s.log.Warn("the token may not read all of the catalog; Consul left out what it may not read",
			"datacenter", f.dcName)
	}
	f.set.narrowDump(dump)
	cat := convertDump(dump, f.dcName, f.s.cfg.TagFilter)
	cat.Index = meta.LastIndex
	f.last = model.Result{Catalog: cat}
	f.have = true
	return f.last, nil
}

// datacenterOf returns f.dc, or else the datacenter of a node of the dump,
// read from the public catalog (the dump does not carry it). An empty
// catalog has no datacenter yet.
func (f *catalogFetcher) datacenterOf(ctx context.Context, dump []*nodeInfo) (string, error) {
	if f.dc != "" {
		return f.dc, nil
	}
	for _, n := range dump {
		if n == nil || n.PeerName != "" || n.Node == "" {
			continue
		}
		opts, cancel := f.s.queryOptions(ctx, "", 0)
		defer cancel()
		cn, _, err := f.s.client.Catalog().Node(n.Node, opts)
		if err != nil {
			return "", fmt.Errorf("learning the datacenter from node %q: %w", n.Node, err)
		}
		if cn == nil || cn.Node == nil || cn.Node.Datacenter == "" {
			return "", fmt.Errorf("learning the datacenter: node %q is gone", n.Node)
		}
		return cn.Node.Datacenter, nil
	}
	return "", nil
}

// convertDump turns a node dump into a catalog. Nodes imported from cluster
// peers are left out (queries name no peer), as are instances without
// tagFilter, when set. The result is sorted.
func convertDump(dump []*nodeInfo, dc, tagFilter string) *model.Catalog {
	// Sized once: grown by appending, the instances of a small answer
	// (one service's) would keep up to twice the room they need.
	nodes, services := 0, 0
	for _, n := range dump {
		if n != nil {
			nodes++
			services += len(n.Services)
		}
	}
	cat := &model.Catalog{Datacenter: dc, Instances: make([]model.Instance, 0, services)}
	cat.Nodes = convertEach(dump, dc, tagFilter, nodes, func(in model.Instance) { cat.Instances = append(cat.Instances, in) })
	cat.Nodes, cat.Instances = nilIfNone(cat.Nodes), nilIfNone(cat.Instances)
	model.SortCatalog(cat)
	return cat
}

// convertEach converts the nodes of dump (room for nodes of them) and
// hands each instance to add, in the dump's order, under convertDump's
// rules.
func convertEach(dump []*nodeInfo, dc, tagFilter string, nodes int, add func(model.Instance)) []model.Node {
	out := make([]model.Node, 0, nodes)
	one := strs{}
	for _, n := range dump {
		if n == nil || n.PeerName != "" {
			continue
		}
		n.ID, n.Node, n.Address = one.of(n.ID), one.of(n.Node), one.of(n.Address)
		node := model.Node{
			ID:              n.ID,
			Name:            n.Node,
			Address:         n.Address,
			Datacenter:      one.of(cmp.Or(n.Datacenter, dc)),
			TaggedAddresses: nilIfEmpty(n.TaggedAddresses),
			Meta:            nilIfEmpty(n.Meta),
		}
		out = append(out, node)

		var nodeChecks []model.Check
		byService := map[string][]model.Check{}
		for _, c := range n.Checks {
			if c == nil {
				continue
			}
			mc := model.Check{
				Node: one.of(cmp.Or(c.Node, n.Node)), CheckID: one.of(c.CheckID), Name: one.of(c.Name), Status: one.of(c.Status),
				Notes: one.of(c.Notes), Output: one.of(c.Output), ServiceID: one.of(c.ServiceID), ServiceName: one.of(c.ServiceName),
			}
			if c.ServiceID == "" {
				nodeChecks = append(nodeChecks, mc)
			} else {
				byService[c.ServiceID] = append(byService[c.ServiceID], mc)
			}
		}
		slices.SortFunc(nodeChecks, compareChecks)

		for _, svc := range n.Services {
			if !converted(n, svc, tagFilter) {
				continue
			}
			for i, tag := range svc.Tags {
				svc.Tags[i] = one.of(tag)
			}
			// The services of a node share its list (a catalog is never
			// written): a node of a thousand instances held a thousand
			// copies of its serfHealth check: 10 MB at 100,000 instances.
			own := slices.Clip(byService[svc.ID])
			slices.SortFunc(own, compareChecks)
			in := model.Instance{
				Source:              Name,
				Datacenter:          node.Datacenter,
				Node:                n.Node,
				NodeID:              n.ID,
				NodeAddress:         n.Address,
				NodeTaggedAddresses: node.TaggedAddresses,
				NodeMeta:            node.Meta,
				ID:                  instanceID(n.Node, svc.ID),
				Name:                one.of(svc.Service),
				Kind:                one.of(svc.Kind),
				Namespace:           one.of(svc.Namespace),
				Address:             one.of(cmp.Or(svc.Address, n.Address)),
				Port:                svc.Port,
				Tags:                nilIfNone(svc.Tags),
				Meta:                nilIfEmpty(svc.Meta),
				TaggedAddresses:     serviceAddresses(svc.TaggedAddresses),
				Status:              aggregateStatus(nodeChecks, own),
				Checks:              own,
				NodeChecks:          nodeChecks[:len(nodeChecks):len(nodeChecks)],
				Registered:          svc.CreateIndex,
			}
			if svc.Weights != nil {
				in.Weight, in.WarningWeight = svc.Weights.Passing, svc.Weights.Warning
			}
			add(in)
		}
	}
	return out
}

// converted reports whether convertDump makes an instance of svc on node
// n: peers' nodes and services are left out, and with tagFilter the
// services without that tag.
func converted(n *nodeInfo, svc *nodeService, tagFilter string) bool {
	return n != nil && n.PeerName == "" && svc != nil && svc.PeerName == "" &&
		(tagFilter == "" || slices.Contains(svc.Tags, tagFilter))
}

// compareChecks orders a node's checks, or an instance's own: by
// service, then by ID.
func compareChecks(a, b model.Check) int {
	return cmp.Or(cmp.Compare(a.ServiceID, b.ServiceID), cmp.Compare(a.CheckID, b.CheckID))
}

// strs keeps one copy of each string of an answer: the instances of a
// service repeat its name, tags, check names and statuses, and a node
// dump its nodes' names and addresses, each decoded anew. A catalog of
// 10,000 instances held 2 MB of decoded strings.
type strs map[string]string

func (m strs) of(s string) string {
	if s == "" {
		return s
	}
	if c, ok := m[s]; ok {
		return c
	}
	m[s] = s
	return s
}

// nilIfEmpty makes "no entries" one value, however Consul encoded it.
func nilIfEmpty[M ~map[K]V, K comparable, V any](m M) M {
	if len(m) == 0 {
		return nil
	}
	return m
}

func nilIfNone[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return s
}

// instanceID makes Consul's service ID, unique only on its node, unique in
// the catalog: "node/id".
func instanceID(node, serviceID string) string { return node + "/" + serviceID }

// serviceAddresses flattens a service's tagged addresses to "host:port"
// (the host alone when there is no port).
func serviceAddresses(m map[string]serviceAddress) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, a := range m {
		if a.Port == 0 {
			out[k] = a.Address
		} else {
			out[k] = net.JoinHostPort(a.Address, strconv.Itoa(a.Port))
		}
	}
	return out
}

// aggregateStatus is the worst status of checks, as consul-template
// computes it: a maintenance check (node or service) wins over everything,
// then critical, warning, passing. No checks is passing; a status Consul
// does not define counts as critical.
func aggregateStatus(lists ...[]model.Check) string {
	rank := 0
	for _, checks := range lists {
		for _, c := range checks {
			if c.CheckID == "_node_maintenance" || strings.HasPrefix(c.CheckID, "_service_maintenance:") {
				return model.StatusMaintenance
			}
			r := 2
			switch c.Status {
			case api.HealthPassing:
				r = 0
			case api.HealthWarning:
				r = 1
			}
			rank = max(rank, r)
		}
	}
	return [...]string{model.StatusPassing, model.StatusWarning, model.StatusCritical}[rank]
}
