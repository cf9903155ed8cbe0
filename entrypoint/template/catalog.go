package template

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// view is a catalog as the catalog functions read it: without what a
// template must not see (see cleanRun), as the runs of instances the
// catalog holds (one per service in a sorted catalog). A view is never
// written once made; the next render's view of the same query shares
// what did not change (newView).
type view struct {
	dc      string // the catalog's datacenter, else the one asked for
	from    []model.Node
	nodes   []model.Node       // from, cleaned
	nodeOut []string           // what cleaning left out of from
	runs    []*run             // in the catalog's order
	keys    []runKey           // runs' lists
	byName  map[string][]int32 // indices in runs of those left with an instance; a catalog not sorted by service may hold a name in several
	names   []string           // byName's keys, sorted
	skipped []string           // what cleaning left out, reported at every render
}

// run is one list of a catalog's instances as the template functions read
// it, converted when first asked. Successive catalogs share the lists of
// the services that did not change, so a view takes the previous view's
// run of each such list: a change converts what changed.
// A template is handed copies of a run's HealthServices (HealthService.copy)
// and shares its tag unions: nothing a template calls writes the elements
// of a slice, only a deep merge writes into maps and structs.
type run struct {
	clean   []model.Instance // the list less what the template must not see; the list itself when clean
	skipped []string         // what cleaning left out
	tags    ServiceTags      // sorted union of clean's tags, once tagsDone
	health  []*HealthService // clean's, sorted by node then ID, once healthDone

	tagsDone, healthDone bool
}

// name is the service's name, or "" when cleaning left no instance.
func (rn *run) name() string {
	if len(rn.clean) == 0 {
		return ""
	}
	return rn.clean[0].Name
}

// runKey names a list: catalogs are never written, and the key keeps the
// list's array alive, so the address names one content. The datacenter
// its instances fall back to is the view's: a run is taken only from the
// previous view of the same query and datacenter.
type runKey struct {
	first *model.Instance
	n     int
}

// converted is what a render made of its inputs that the next one may
// reuse: views and specs are functions of their keys alone (a view is
// checked against the catalog it is reused for).
type converted struct {
	views map[model.Query]*view
	specs map[string]serviceQuery // `service` arguments, parsed
}

// runCache holds what the latest render that had it converted, and the
// fragments' outputs, checked against what they read. One render at a
// time uses it; a render that finds it in use converts everything.
type runCache struct {
	mu    sync.Mutex
	last  converted
	frags keptOutputs
}

// catalog returns the catalog of dc ("" = the merged local one), or false
// when the state has no answer yet.
func (r *render) catalog(dc string) (*view, bool) {
	// A fragment's kept output checks its `service` calls against the
	// view at every item: the last view asked for spares the lookups.
	if r.lastView != nil && r.lastDC == dc {
		return r.lastView, true
	}
	q := model.LocalCatalog
	if dc != "" {
		q = model.Query{Kind: model.QueryCatalog, Datacenter: dc}
	}
	res, ok := r.result(q)
	if !ok {
		return nil, false
	}
	v, ok := r.used.views[q]
	if !ok {
		c := res.Catalog
		if c == nil {
			c = &model.Catalog{}
		}
		v = r.newView(c, cmp.Or(c.Datacenter, dc), r.cached.views[q])
		r.skipped = append(r.skipped, v.skipped...)
		if r.used.views == nil {
			r.used.views = map[model.Query]*view{}
		}
		r.used.views[q] = v
	}
	r.lastView, r.lastDC = v, dc
	return v, true
}

// newView makes c's view, sharing with prev, the previous render's view of
// the same query, what did not change: the runs of the lists c shares
// with it, its nodes when c's are the same, and its index of names when
// every service is where it was. A change to one service costs a walk of
// the lists and the conversion of that service. A node whose name or
// address fails model.CheckName or model.CheckAddress is left out whole,
// and so are its instances (without its identity an instance means
// nothing); a control character in any other field of a node leaves out
// only that field, as cleanRun does for instances.
func (r *render) newView(c *model.Catalog, dc string, prev *view) *view {
	if prev == nil || prev.dc != dc {
		prev = &view{}
	}
	v := &view{dc: dc, from: c.Nodes}
	sameNodes := model.SameList(prev.from, c.Nodes)
	if sameNodes {
		v.nodes, v.nodeOut = prev.nodes, prev.nodeOut
	} else {
		v.nodes, v.nodeOut = cleanNodes(c.Nodes, r.t.opts.RawMeta)
	}
	v.runs = make([]*run, 0, len(prev.runs))
	v.keys = make([]runKey, 0, len(prev.runs))
	var byKey map[runKey]*run // prev's runs, made at the first list that moved
	samePlaces, freshReports := true, false
	for list := range c.Services() {
		k := runKey{first: &list[0], n: len(list)}
		i := len(v.runs)
		if i < len(prev.keys) && prev.keys[i] == k {
			v.runs, v.keys = append(v.runs, prev.runs[i]), append(v.keys, k)
			continue
		}
		// A service whose list changed in place has no run to take; one
		// that moved may (services came or went before it).
		var rn *run
		if i >= len(prev.keys) || prev.keys[i].first.Name != list[0].Name {
			if byKey == nil {
				byKey = make(map[runKey]*run, len(prev.runs))
				for j, p := range prev.runs {
					byKey[prev.keys[j]] = p
				}
			}
			rn = byKey[k]
		}
		if rn == nil {
			rn = cleanRun(list, r.t.opts.RawMeta)
			freshReports = freshReports || len(rn.skipped) > 0
		}
		samePlaces = samePlaces && i < len(prev.runs) && prev.runs[i].name() == rn.name()
		v.runs, v.keys = append(v.runs, rn), append(v.keys, k)
	}
	if samePlaces && len(v.runs) == len(prev.runs) && prev.byName != nil {
		v.byName, v.names = prev.byName, prev.names
	} else {
		v.byName = map[string][]int32{}
		for i, rn := range v.runs {
			if name := rn.name(); name != "" {
				if v.byName[name] == nil {
					v.names = append(v.names, name)
				}
				v.byName[name] = append(v.byName[name], int32(i))
			}
		}
		slices.Sort(v.names)
	}
	// A clean catalog stays clean unless a list converted now is not.
	if prev.byName == nil || !sameNodes || len(prev.skipped) > 0 || freshReports {
		v.skipped = v.reports()
	}
	return v
}

// cleanNodes returns nodes less what a template must not see, and what
// it left out.
func cleanNodes(nodes []model.Node, rawMeta bool) ([]model.Node, []string) {
	out := make([]model.Node, 0, len(nodes))
	var reports []string
	report := func(s string) { reports = append(reports, s) }
	for _, n := range nodes {
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
		n.Meta = cleanMap(what, "meta", n.Meta, rawMeta, report)
		n.TaggedAddresses = cleanMap(what, "tagged address", n.TaggedAddresses, false, report)
		out = append(out, n)
	}
	return out, reports
}

// reports is what cleaning left out of the view's nodes and runs, each
// once.
func (v *view) reports() []string {
	var out []string
	var seen map[string]bool
	add := func(ss []string) {
		for _, s := range ss {
			if seen == nil {
				seen = map[string]bool{}
			}
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	add(v.nodeOut)
	for _, rn := range v.runs {
		add(rn.skipped)
	}
	return out
}

// sameRuns reports whether service name is runs in v.
func (v *view) sameRuns(name string, runs []*run) bool {
	idx := v.byName[name]
	if len(idx) != len(runs) {
		return false
	}
	for j, i := range idx {
		if v.runs[i] != runs[j] {
			return false
		}
	}
	return true
}

// cleanRun keeps out of the template what a template printing values
// raw, as consul-template templates do, would let write into HAProxy's
// configuration. An instance that fails model.CheckInstance (the rule the
// built-in template applies too: names without whitespace or control
// characters, an address that is an IP or a DNS name) is left out whole.
// A control character (a newline above all) anywhere else leaves out only
// what holds it: that tag, that meta or tagged-address key, that node ID,
// kind or namespace. A template that never prints the field keeps the
// instance, as with consul-template. With rawMeta, meta values keep
// theirs (a multi-line certificate inserted with indent). KV values are
// not filtered (multi-line values are legitimate); templates quote them
// with haproxyQuote.
func cleanRun(list []model.Instance, rawMeta bool) *run {
	rn := &run{clean: list}
	var reported map[string]bool
	dirty := false
	report := func(s string) {
		dirty = true
		if !reported[s] {
			if reported == nil {
				reported = map[string]bool{}
			}
			reported[s] = true
			rn.skipped = append(rn.skipped, s)
		}
	}
	var out []model.Instance // nil while every instance is kept as it is
	for i, in := range list {
		dirty = false
		in, ok := cleanInstance(in, rawMeta, report)
		if !dirty && out == nil {
			continue
		}
		if out == nil {
			out = append(make([]model.Instance, 0, len(list)), list[:i]...)
		}
		if ok {
			out = append(out, in)
		}
	}
	if out != nil {
		rn.clean = out
	}
	return rn
}

// cleanInstance is in less what the template must not see (cleanRun), or
// false when nothing of it may be seen.
func cleanInstance(in model.Instance, rawMeta bool, report func(string)) (model.Instance, bool) {
	if err := model.CheckInstance(in); err != nil {
		report(fmt.Sprintf("service %q instance %q: %v; instance left out", in.Name, in.ID, err))
		return in, false
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
	in.Meta = cleanMap(what, "meta", in.Meta, rawMeta, report)
	in.TaggedAddresses = cleanMap(what, "tagged address", in.TaggedAddresses, false, report)
	in.NodeMeta = cleanMap(node, "meta", in.NodeMeta, rawMeta, report)
	in.NodeTaggedAddresses = cleanMap(node, "tagged address", in.NodeTaggedAddresses, false, report)
	return in, true
}

// healthServices returns the run's instances as `service` returns them,
// falling back to datacenter dc (its view's, the only one it is in).
func (rn *run) healthServices(dc string) []*HealthService {
	if !rn.healthDone {
		all := make([]HealthService, len(rn.clean))
		rn.health = make([]*HealthService, len(rn.clean))
		for i := range rn.clean {
			fillHealthService(&all[i], &rn.clean[i], cmp.Or(rn.clean[i].Datacenter, dc))
			rn.health[i] = &all[i]
		}
		slices.SortStableFunc(rn.health, compareHealthServices)
		rn.healthDone = true
	}
	return rn.health
}

func compareHealthServices(a, b *HealthService) int {
	return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.ID, b.ID))
}

// tagUnion returns the sorted union of the run's tags.
func (rn *run) tagUnion() ServiceTags {
	if !rn.tagsDone {
		var tags []string
		for _, in := range rn.clean {
			tags = append(tags, in.Tags...)
		}
		slices.Sort(tags)
		rn.tags = ServiceTags(slices.Compact(tags))
		rn.tagsDone = true
	}
	return rn.tags
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
	spec := strings.Join(args, "|")
	q, err := r.serviceQuery(spec)
	if err != nil {
		return nil, err
	}
	if w := r.t.opts.Watched; w != nil && !w(q.name) {
		// Rendered as empty it would drop a backend's servers: an
		// incomplete configuration must not be applied.
		return nil, fmt.Errorf("service %q is not watched: SEAMLESS_CONSUL_SERVICES names the services the template may read; add it", q.name)
	}
	v, ok := r.catalog(q.dc)
	if !ok {
		return out, nil
	}
	idx := v.byName[q.name]
	runs := make([]*run, len(idx))
	for j, i := range idx {
		runs[j] = v.runs[i]
	}
	if r.rec != nil {
		r.rec.deps = append(r.rec.deps, serviceDep{q: q, runs: runs})
	}
	for _, rn := range runs {
		for _, hs := range rn.healthServices(v.dc) {
			if (q.tag != "" && !slices.Contains(hs.Tags, q.tag)) || !model.HealthFilter(q.filter, hs.Status) {
				continue
			}
			out = append(out, hs)
		}
	}
	if len(runs) > 1 {
		slices.SortStableFunc(out, compareHealthServices)
	}
	if r.t.readOnly {
		return out, nil
	}
	own := make([]HealthService, len(out))
	for i, hs := range out {
		own[i] = hs.copy()
		out[i] = &own[i]
	}
	return out, nil
}

// copy is hs with maps and checks of its own. A run's HealthServices
// outlive the render, and a template can write what it is handed: a deep
// merge (mergeMap, sprig_merge…) writes into the maps and structs its
// destination reaches.
func (hs *HealthService) copy() HealthService {
	c := *hs
	c.NodeTaggedAddresses = cloneMap(hs.NodeTaggedAddresses)
	c.NodeMeta = cloneMap(hs.NodeMeta)
	c.ServiceMeta = cloneMap(hs.ServiceMeta)
	c.ServiceTaggedAddresses = maps.Clone(hs.ServiceTaggedAddresses)
	c.Tags = slices.Clone(hs.Tags)
	c.Checks = make(HealthChecks, len(hs.Checks))
	for i, ch := range hs.Checks {
		cc := *ch
		c.Checks[i] = &cc
	}
	return c
}

// serviceQuery is parseServiceQuery with the template's default filter:
// a template asks the same few shapes of every service at every render.
func (r *render) serviceQuery(spec string) (serviceQuery, error) {
	if q, ok := r.used.specs[spec]; ok {
		return q, nil
	}
	q, ok := r.cached.specs[spec]
	if !ok {
		var err error
		if q, err = parseServiceQuery(spec, r.t.health); err != nil {
			return q, err
		}
	}
	if r.used.specs == nil {
		r.used.specs = make(map[string]serviceQuery, len(r.cached.specs))
	}
	r.used.specs[spec] = q
	return q, nil
}

// fillHealthService makes *hs in's. Its string maps are in's own (a
// model's maps are never written); copy gives a template maps of its own.
func fillHealthService(hs *HealthService, in *model.Instance, dc string) {
	*hs = HealthService{
		Node:                   in.Node,
		NodeID:                 in.NodeID,
		Kind:                   in.Kind,
		NodeAddress:            in.NodeAddress,
		NodeDatacenter:         dc,
		NodeTaggedAddresses:    in.NodeTaggedAddresses,
		NodeMeta:               in.NodeMeta,
		ServiceMeta:            in.Meta,
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
	v, ok := r.catalog(dc)
	if !ok {
		return out, nil
	}
	// Made anew at every render, a template may write what it is handed;
	// in one block, not one allocation per service.
	all := make([]CatalogSnippet, len(v.names))
	out = make([]*CatalogSnippet, len(v.names))
	for j, name := range v.names {
		idx := v.byName[name]
		tags := v.runs[idx[0]].tagUnion()
		if len(idx) > 1 {
			tags = nil
			for _, i := range idx {
				tags = append(tags, v.runs[i].tagUnion()...)
			}
			slices.Sort(tags)
			tags = slices.Compact(tags)
		}
		all[j] = CatalogSnippet{Name: name, Tags: tags}
		out[j] = &all[j]
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
	v, ok := r.catalog(dc)
	if !ok {
		return out, nil
	}
	for i := range v.nodes {
		out = append(out, newNode(&v.nodes[i], v.dc))
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
	v, ok := r.catalog(q.dc)
	if !ok {
		return nil, nil
	}
	i := slices.IndexFunc(v.nodes, func(n model.Node) bool { return n.Name == name })
	if i < 0 {
		return nil, nil
	}
	cn := &CatalogNode{Node: newNode(&v.nodes[i], v.dc), Services: []*CatalogNodeService{}}
	for _, rn := range v.runs {
		for _, in := range rn.clean {
			if in.Node != name {
				continue
			}
			cn.Services = append(cn.Services, &CatalogNodeService{
				ID: in.ServiceID(), Service: in.Name, Tags: sortedTags(in.Tags), Meta: cloneMap(in.Meta),
				Port: in.Port, Address: in.Address,
			})
		}
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
