package template

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// catalog returns the catalog of dc ("" = the merged local one), or false
// when the state has no answer yet.
func (r *render) catalog(dc string) (*model.Catalog, bool) {
	q := model.LocalCatalog
	if dc != "" {
		q = model.Query{Kind: model.QueryCatalog, Datacenter: dc}
	}
	res, ok := r.result(q)
	if !ok {
		return nil, false
	}
	if res.Catalog == nil {
		return &model.Catalog{Datacenter: dc}, true
	}
	if c, ok := r.clean[q]; ok {
		return c, true
	}
	c := r.withoutControls(res.Catalog)
	if r.clean == nil {
		r.clean = map[model.Query]*model.Catalog{}
	}
	r.clean[q] = c
	return c, true
}

// withoutControls keeps out of the template what a template printing
// values raw, as consul-template templates do, would let write into
// HAProxy's configuration. An instance that fails model.CheckInstance (the
// rule the built-in template applies too: names without whitespace or
// control characters, an address that is an IP or a DNS name) is left out
// whole, as is a node whose name or address fails the same checks: without
// its identity an instance means nothing. A control character (a newline
// above all) anywhere else leaves out only what holds it: that tag, that
// meta or tagged-address key, that node ID, kind or namespace. A template
// that never prints the field keeps the instance, as with consul-template.
// With Options.RawMeta, meta values keep theirs (a multi-line certificate
// inserted with indent). KV values are not filtered (multi-line values are
// legitimate); templates quote them with haproxyQuote.
func (r *render) withoutControls(c *model.Catalog) *model.Catalog {
	out := &model.Catalog{Datacenter: c.Datacenter}
	reported := map[string]bool{}
	report := func(s string) {
		if !reported[s] {
			reported[s] = true
			r.skipped = append(r.skipped, s)
		}
	}
	for _, n := range c.Nodes {
		err := model.CheckName("node name", n.Name)
		if err == nil && n.Address != "" {
			err = model.CheckAddress(n.Address)
		}
		if err != nil {
			report(fmt.Sprintf("node %q: %v; node left out", n.Name, err))
			continue
		}
		what := func() string { return fmt.Sprintf("node %q", n.Name) }
		n.ID = cleanField(what, "ID", n.ID, report)
		n.Meta = cleanMap(what, "meta", n.Meta, r.t.opts.RawMeta, report)
		n.TaggedAddresses = cleanMap(what, "tagged address", n.TaggedAddresses, false, report)
		out.Nodes = append(out.Nodes, n)
	}
	out.Instances = make([]model.Instance, 0, c.Len())
	for in := range eachInstance(c) {
		if err := model.CheckInstance(in); err != nil {
			report(fmt.Sprintf("service %q instance %q: %v; instance left out", in.Name, in.ID, err))
			continue
		}
		// Named only when something is reported: most instances are clean.
		what := func() string { return fmt.Sprintf("service %q instance %q", in.Name, in.ID) }
		node := func() string { return fmt.Sprintf("node %q", in.Node) }
		in.NodeID = cleanField(node, "ID", in.NodeID, report)
		in.Kind = cleanField(what, "kind", in.Kind, report)
		in.Namespace = cleanField(what, "namespace", in.Namespace, report)
		if slices.ContainsFunc(in.Tags, func(t string) bool { return hasControl(t) }) {
			tags := make([]string, 0, len(in.Tags))
			for _, t := range in.Tags {
				if hasControl(t) {
					report(fmt.Sprintf("%s: tag %q has a control character; tag left out", what(), t))
					continue
				}
				tags = append(tags, t)
			}
			in.Tags = tags
		}
		in.Meta = cleanMap(what, "meta", in.Meta, r.t.opts.RawMeta, report)
		in.TaggedAddresses = cleanMap(what, "tagged address", in.TaggedAddresses, false, report)
		in.NodeMeta = cleanMap(node, "meta", in.NodeMeta, r.t.opts.RawMeta, report)
		in.NodeTaggedAddresses = cleanMap(node, "tagged address", in.NodeTaggedAddresses, false, report)
		out.Instances = append(out.Instances, in)
	}
	return out
}

// eachInstance yields a copy of each of c's instances, to be cleaned.
func eachInstance(c *model.Catalog) iter.Seq[model.Instance] {
	return func(yield func(model.Instance) bool) {
		for s := range c.Services() {
			for _, in := range s {
				if !yield(in) {
					return
				}
			}
		}
	}
}

// cleanField is v, or "" when it holds a control character.
func cleanField(what func() string, field, v string, report func(string)) string {
	if !hasControl(v) {
		return v
	}
	report(fmt.Sprintf("%s: %s %q has a control character; %s left out", what(), field, v, field))
	return ""
}

// cleanMap returns m without the keys whose key, or value unless rawValues,
// holds a control character; m itself is shared with the state and never
// changed.
func cleanMap(what func() string, kind string, m map[string]string, rawValues bool, report func(string)) map[string]string {
	bad := func(k, v string) bool { return hasControl(k) || (!rawValues && hasControl(v)) }
	dirty := false
	for k, v := range m {
		if bad(k, v) {
			dirty = true
			break
		}
	}
	if !dirty {
		return m
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if bad(k, m[k]) {
			report(fmt.Sprintf("%s: %s %q has a control character; key left out", what(), kind, k))
			continue
		}
		out[k] = m[k]
	}
	return out
}

func hasControl(ss ...string) bool {
	for _, s := range ss {
		if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return true
		}
	}
	return false
}

// service implements `service "[tag.]name[@dc][~near][|filter]" ["filter"]`.
// Instances come sorted by node, then ID, as consul-template sorts them;
// "~near" is accepted but changes nothing, seamless has no network
// coordinates.
func (r *render) service(args ...string) ([]*HealthService, error) {
	out := []*HealthService{}
	if len(args) == 0 || args[0] == "" {
		return out, nil
	}
	q, err := parseServiceQuery(strings.Join(args, "|"), r.t.health)
	if err != nil {
		return nil, err
	}
	if w := r.t.opts.Watched; w != nil && !w(q.name) {
		// Rendered as empty it would drop a backend's servers: an
		// incomplete configuration must not be applied.
		return nil, fmt.Errorf("service %q is not watched: SEAMLESS_CONSUL_SERVICES names the services the template may read; add it", q.name)
	}
	cat, ok := r.catalog(q.dc)
	if !ok {
		return out, nil
	}
	for _, i := range r.instancesOf(cat, q.name) {
		in := &cat.Instances[i]
		if (q.tag != "" && !slices.Contains(in.Tags, q.tag)) || !model.HealthFilter(q.filter, in.Status) {
			continue
		}
		out = append(out, newHealthService(in, cmp.Or(in.Datacenter, cat.Datacenter, q.dc)))
	}
	slices.SortStableFunc(out, func(a, b *HealthService) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// instancesOf returns the indices of name's instances in cat, in cat's
// order, from an index made at the first call for cat: a template that
// asks for each of S services would otherwise read the catalog S times.
func (r *render) instancesOf(cat *model.Catalog, name string) []int {
	idx, ok := r.byName[cat]
	if !ok {
		idx = map[string][]int{}
		for i := range cat.Instances {
			idx[cat.Instances[i].Name] = append(idx[cat.Instances[i].Name], i)
		}
		if r.byName == nil {
			r.byName = map[*model.Catalog]map[string][]int{}
		}
		r.byName[cat] = idx
	}
	return idx[name]
}

func newHealthService(in *model.Instance, dc string) *HealthService {
	hs := &HealthService{
		Node:                   in.Node,
		NodeID:                 in.NodeID,
		Kind:                   in.Kind,
		NodeAddress:            in.NodeAddress,
		NodeDatacenter:         dc,
		NodeTaggedAddresses:    cloneMap(in.NodeTaggedAddresses),
		NodeMeta:               cloneMap(in.NodeMeta),
		ServiceMeta:            cloneMap(in.Meta),
		Address:                in.Address,
		ServiceTaggedAddresses: map[string]ServiceAddress{},
		ID:                     in.ServiceID(),
		Name:                   in.Name,
		Tags:                   sortedTags(in.Tags),
		Status:                 in.Status,
		Port:                   in.Port,
		Weights:                Weights{Passing: cmp.Or(in.Weight, 1), Warning: cmp.Or(in.WarningWeight, 1)},
		Namespace:              in.Namespace,
		Source:                 in.Source,
		Checks:                 HealthChecks{},
	}
	for k, v := range in.TaggedAddresses {
		hs.ServiceTaggedAddresses[k] = splitTaggedAddress(v)
	}
	for _, checks := range [...][]model.Check{in.NodeChecks, in.Checks} {
		for _, c := range checks {
			hs.Checks = append(hs.Checks, &HealthCheck{
				Node: c.Node, CheckID: c.CheckID, Name: c.Name, Status: c.Status,
				Notes: c.Notes, Output: c.Output, ServiceID: c.ServiceID, ServiceName: c.ServiceName,
			})
		}
	}
	return hs
}

// splitTaggedAddress reads "host:port" (the model keeps tagged addresses
// as strings); a value without a port is all address.
func splitTaggedAddress(v string) ServiceAddress {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return ServiceAddress{Address: v}
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return ServiceAddress{Address: v}
	}
	return ServiceAddress{Address: host, Port: p}
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

func sortedTags(tags []string) ServiceTags {
	out := make(ServiceTags, len(tags))
	copy(out, tags)
	slices.Sort(out)
	return out
}

// services implements `services ["@dc"]`: every service of the catalog
// whatever its health, sorted by name, with the sorted union of its
// instances' tags.
func (r *render) services(args ...string) ([]*CatalogSnippet, error) {
	out := []*CatalogSnippet{}
	dc, err := parseServicesQuery(strings.Join(args, ""))
	if err != nil {
		return nil, err
	}
	cat, ok := r.catalog(dc)
	if !ok {
		return out, nil
	}
	tags := map[string]map[string]bool{}
	for _, in := range cat.Instances {
		if tags[in.Name] == nil {
			tags[in.Name] = map[string]bool{}
		}
		for _, t := range in.Tags {
			tags[in.Name][t] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(tags)) {
		out = append(out, &CatalogSnippet{Name: name, Tags: ServiceTags(slices.Sorted(maps.Keys(tags[name])))})
	}
	return out, nil
}

// nodes implements `nodes ["@dc[~near]"]`, sorted by name, then address.
func (r *render) nodes(args ...string) ([]*Node, error) {
	out := []*Node{}
	dc, err := parseNodesQuery(strings.Join(args, ""))
	if err != nil {
		return nil, err
	}
	cat, ok := r.catalog(dc)
	if !ok {
		return out, nil
	}
	for i := range cat.Nodes {
		out = append(out, newNode(&cat.Nodes[i], cmp.Or(cat.Datacenter, dc)))
	}
	slices.SortStableFunc(out, func(a, b *Node) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Address, b.Address))
	})
	return out, nil
}

func newNode(n *model.Node, dc string) *Node {
	return &Node{
		ID: n.ID, Node: n.Name, Address: n.Address, Datacenter: cmp.Or(n.Datacenter, dc),
		TaggedAddresses: cloneMap(n.TaggedAddresses), Meta: cloneMap(n.Meta),
	}
}

// node implements `node ["name"] ["@dc"]`: the node and its instances
// (sorted by service, then ID), or nil when the catalog has no such node.
// Without a name it is Options.NodeName.
func (r *render) node(args ...string) (*CatalogNode, error) {
	q, err := parseNodeQuery(strings.Join(args, ""))
	if err != nil {
		return nil, err
	}
	name := cmp.Or(q.name, r.t.opts.NodeName)
	cat, ok := r.catalog(q.dc)
	if !ok {
		return nil, nil
	}
	i := slices.IndexFunc(cat.Nodes, func(n model.Node) bool { return n.Name == name })
	if i < 0 {
		return nil, nil
	}
	cn := &CatalogNode{Node: newNode(&cat.Nodes[i], cmp.Or(cat.Datacenter, q.dc)), Services: []*CatalogNodeService{}}
	for _, in := range cat.Instances {
		if in.Node != name {
			continue
		}
		cn.Services = append(cn.Services, &CatalogNodeService{
			ID: in.ServiceID(), Service: in.Name, Tags: sortedTags(in.Tags), Meta: cloneMap(in.Meta),
			Port: in.Port, Address: in.Address,
		})
	}
	slices.SortStableFunc(cn.Services, func(a, b *CatalogNodeService) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.ID, b.ID))
	})
	return cn, nil
}

// DatacentersIgnoreInaccessible is the Key of the QueryDatacenters query
// `datacenters true` asks for: only datacenters that answer.
const DatacentersIgnoreInaccessible = "ignore-inaccessible"

// datacenters implements `datacenters [ignoreInaccessible]`, sorted.
func (r *render) datacenters(ignore ...bool) ([]string, error) {
	q := model.Query{Kind: model.QueryDatacenters}
	switch len(ignore) {
	case 0:
	case 1:
		if ignore[0] {
			q.Key = DatacentersIgnoreInaccessible
		}
	default:
		return nil, fmt.Errorf("datacenters: wrong number of arguments, expected 0 or 1, but got %d", len(ignore))
	}
	res, ok := r.result(q)
	if !ok {
		return []string{}, nil
	}
	return slices.Sorted(slices.Values(res.Datacenters)), nil
}
