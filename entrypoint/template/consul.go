package template

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The types below are what consul-template's functions return, with the
// same field names, so templates written for it read them unchanged. Every
// string in them comes from outside and is untrusted: pass names through
// haproxyName, arguments through haproxyQuote, and check addresses with
// validHost before they reach a configuration line.

// ServiceTags is a sorted list of tags.
type ServiceTags []string

// Contains reports whether the tag is in the list.
func (t ServiceTags) Contains(tag string) bool { return slices.Contains(t, tag) }

// Weights are an instance's load-balancing weights when passing and when
// warning (Consul's default for both is 1).
type Weights struct {
	Passing int
	Warning int
}

// ServiceAddress is one of an instance's tagged addresses.
type ServiceAddress struct {
	Address string
	Port    int
}

// HealthCheck is one health check of an instance or of its node.
type HealthCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
}

// HealthChecks are the checks behind an instance's status.
type HealthChecks []*HealthCheck

// AggregatedStatus is the worst status of the checks: maintenance,
// critical, warning, then passing (Consul's order).
func (c HealthChecks) AggregatedStatus() string {
	worst := model.StatusPassing
	for _, ch := range c {
		if statusRank(ch.Status) > statusRank(worst) {
			worst = ch.Status
		}
	}
	return worst
}

func statusRank(s string) int {
	switch s {
	case model.StatusMaintenance:
		return 3
	case model.StatusCritical:
		return 2
	case model.StatusWarning:
		return 1
	}
	return 0
}

// HealthService is one instance of a service, as `service` returns it.
type HealthService struct {
	Node                   string
	NodeID                 string
	Kind                   string
	NodeAddress            string
	NodeDatacenter         string
	NodeTaggedAddresses    map[string]string
	NodeMeta               map[string]string
	ServiceMeta            map[string]string
	Address                string
	ServiceTaggedAddresses map[string]ServiceAddress
	ID                     string
	Name                   string
	Tags                   ServiceTags
	Checks                 HealthChecks
	Status                 string
	Port                   int
	Weights                Weights
	Namespace              string
	// Source is the seamless source that reported the instance ("consul",
	// "docker", "file:..."); consul-template has no such field.
	Source string
}

// CatalogSnippet is one service as `services` returns it: its name and the
// union of its instances' tags.
type CatalogSnippet struct {
	Name string
	Tags ServiceTags
}

// Node is a node of the catalog.
type Node struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
}

// CatalogNode is a node and the instances it runs, as `node` returns it.
type CatalogNode struct {
	Node     *Node
	Services []*CatalogNodeService
}

// CatalogNodeService is one instance on a node.
type CatalogNodeService struct {
	ID                string
	Service           string
	Tags              ServiceTags
	Meta              map[string]string
	Port              int
	Address           string
	EnableTagOverride bool
}

// KeyPair is one KV pair; Key is relative to the prefix asked for (`ls`,
// `tree`) and Path is the full key.
type KeyPair struct {
	Path        string
	Key         string
	Value       string
	CreateIndex uint64
	ModifyIndex uint64
	LockIndex   uint64
	Flags       uint64
	Session     string
}

// The argument grammar is consul-template's: service names have no dots
// (a dot separates the tag), node names and datacenters may.
const (
	dcPart    = `(?:@(?P<dc>[[:word:].\-]+))?`
	nearPart  = `(?:~(?P<near>[[:word:].\-]+))?`
	queryPart = `(?:\?(?P<query>[^@~|]*))?`
)

var (
	serviceRe  = regexp.MustCompile(`\A(?:(?P<tag>[[:word:]=:.\-]+)\.)?(?P<name>[[:word:]\-]+)` + queryPart + dcPart + nearPart + `(?:\|(?P<filter>[[:word:], ]+))?\z`)
	servicesRe = regexp.MustCompile(`\A` + queryPart + dcPart + `\z`)
	nodesRe    = regexp.MustCompile(`\A` + queryPart + dcPart + nearPart + `\z`)
	nodeRe     = regexp.MustCompile(`\A(?P<name>[[:word:].\-]*)` + queryPart + dcPart + `\z`)
	kvRe       = regexp.MustCompile(`\A/?(?P<key>[^@]+)` + dcPart + `\z`)
	// kvQueryRe is the "?ns=...&partition=..." suffix newer consul-template
	// versions accept after a key.
	kvQueryRe = regexp.MustCompile(`\?(?:ns|partition|peer)=[^?]*\z`)
)

var serviceNameRe = regexp.MustCompile(`\A[[:word:]\-]+\z`)

// ValidServiceName reports whether `service` can ask for name: letters,
// digits, "_" and "-" (consul-template's grammar, where a dot would start
// a tag). A template ranging over `services` uses it to skip names it
// could not query rather than fail the render.
func ValidServiceName(name string) bool { return serviceNameRe.MatchString(name) }

func match(re *regexp.Regexp, s string) (map[string]string, bool) {
	m := re.FindStringSubmatch(s)
	if m == nil {
		return nil, false
	}
	out := map[string]string{}
	for i, name := range re.SubexpNames() {
		if name != "" {
			out[name] = m[i]
		}
	}
	return out, true
}

func checkQueryPart(m map[string]string) error {
	if q := m["query"]; q != "" {
		return fmt.Errorf("?%s: Consul namespaces, partitions and peers are not supported by seamless", q)
	}
	return nil
}

type serviceQuery struct {
	tag, name, dc, near string
	filter              []string
}

func parseServiceQuery(s string, defaultFilter []string) (serviceQuery, error) {
	m, ok := match(serviceRe, s)
	if !ok {
		return serviceQuery{}, fmt.Errorf("invalid service %q: want [tag.]name[@dc][~near][|filter]", s)
	}
	if err := checkQueryPart(m); err != nil {
		return serviceQuery{}, err
	}
	q := serviceQuery{tag: m["tag"], name: m["name"], dc: m["dc"], near: m["near"], filter: defaultFilter}
	if m["filter"] != "" {
		f, err := parseFilter(m["filter"])
		if err != nil {
			return serviceQuery{}, fmt.Errorf("service %q: %w", s, err)
		}
		q.filter = f
	}
	return q, nil
}

// parseFilter validates a comma-separated health filter; empty is nil,
// which model.HealthFilter reads as passing.
func parseFilter(s string) ([]string, error) {
	var out []string
	for _, f := range model.ParseHealth(s) {
		switch f {
		case "any", model.StatusPassing, model.StatusWarning, model.StatusCritical, model.StatusMaintenance:
			out = append(out, f)
		default:
			return nil, fmt.Errorf("invalid health filter %q (want any, passing, warning, critical or maintenance)", f)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func parseServicesQuery(s string) (dc string, err error) {
	m, ok := match(servicesRe, s)
	if !ok {
		return "", fmt.Errorf("invalid services argument %q: want @dc", s)
	}
	return m["dc"], checkQueryPart(m)
}

func parseNodesQuery(s string) (dc string, err error) {
	m, ok := match(nodesRe, s)
	if !ok {
		return "", fmt.Errorf("invalid nodes argument %q: want @dc[~near]", s)
	}
	return m["dc"], checkQueryPart(m)
}

type nodeQuery struct{ name, dc string }

func parseNodeQuery(s string) (nodeQuery, error) {
	m, ok := match(nodeRe, s)
	if !ok {
		return nodeQuery{}, fmt.Errorf("invalid node %q: want [name][@dc]", s)
	}
	return nodeQuery{name: m["name"], dc: m["dc"]}, checkQueryPart(m)
}

func parseKVQuery(s string, kind model.QueryKind) (model.Query, error) {
	m, ok := match(kvRe, s)
	if !ok {
		return model.Query{}, fmt.Errorf("invalid key %q: want path[@dc]", s)
	}
	if q := kvQueryRe.FindString(m["key"]); q != "" {
		return model.Query{}, fmt.Errorf("%s: Consul namespaces, partitions and peers are not supported by seamless", q)
	}
	return model.Query{Kind: kind, Key: m["key"], Datacenter: m["dc"]}, nil
}

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
	return res.Catalog, true
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
	cat, ok := r.catalog(q.dc)
	if !ok {
		return out, nil
	}
	for i := range cat.Instances {
		in := &cat.Instances[i]
		if in.Name != q.name || (q.tag != "" && !slices.Contains(in.Tags, q.tag)) || !model.HealthFilter(q.filter, in.Status) {
			continue
		}
		out = append(out, newHealthService(in, cmp.Or(in.Datacenter, cat.Datacenter, q.dc)))
	}
	slices.SortStableFunc(out, func(a, b *HealthService) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
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
		ID:                     in.ID,
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
	for _, c := range in.Checks {
		hs.Checks = append(hs.Checks, &HealthCheck{
			Node: c.Node, CheckID: c.CheckID, Name: c.Name, Status: c.Status,
			Notes: c.Notes, Output: c.Output, ServiceID: c.ServiceID, ServiceName: c.ServiceName,
		})
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
			ID: in.ID, Service: in.Name, Tags: sortedTags(in.Tags), Meta: cloneMap(in.Meta),
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

// pair returns the pair of a QueryKey result.
func pair(res model.Result, key string) (model.KVPair, bool) {
	for _, p := range res.Pairs {
		if p.Key == key {
			return p, true
		}
	}
	if len(res.Pairs) > 0 {
		return res.Pairs[0], true
	}
	return model.KVPair{}, false
}

// key implements `key "path[@dc]"`. consul-template blocks the render
// until the key exists; here an absent key is an error, so the running
// configuration stays until it exists (use keyOrDefault or keyExists for
// optional keys).
func (r *render) key(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	q, err := parseKVQuery(s, model.QueryKey)
	if err != nil {
		return "", err
	}
	res, ok := r.result(q)
	if !ok {
		return "", nil
	}
	p, ok := pair(res, q.Key)
	if !ok {
		return "", fmt.Errorf("key %q does not exist (use keyOrDefault or keyExists for a key that may be absent)", s)
	}
	return p.Value, nil
}

// keyExists implements `keyExists "path[@dc]"`.
func (r *render) keyExists(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	q, err := parseKVQuery(s, model.QueryKey)
	if err != nil {
		return false, err
	}
	res, ok := r.result(q)
	if !ok {
		return false, nil
	}
	_, exists := pair(res, q.Key)
	return exists, nil
}

// keyOrDefault implements `keyOrDefault "path[@dc]" "default"`: the default
// when the key is absent, empty, or not fetched yet.
func (r *render) keyOrDefault(s, def string) (string, error) {
	if s == "" {
		return def, nil
	}
	q, err := parseKVQuery(s, model.QueryKey)
	if err != nil {
		return "", err
	}
	res, ok := r.result(q)
	if !ok {
		return def, nil
	}
	if p, ok := pair(res, q.Key); ok && p.Value != "" {
		return p.Value, nil
	}
	return def, nil
}

// list implements ls, safeLs, tree and safeTree. Keys are made relative to
// the prefix. ls keeps direct children only (no "/" left in the relative
// key), tree every key but "folders" (keys ending in "/"). The safe forms
// refuse an empty result: consul-template then silently waits; seamless
// returns an error, which keeps the running configuration as well, and
// says why.
func (r *render) list(s, fn string, recursive, safe bool) ([]*KeyPair, error) {
	out := []*KeyPair{}
	if s == "" {
		return out, nil
	}
	q, err := parseKVQuery(s, model.QueryPrefix)
	if err != nil {
		return nil, err
	}
	res, ok := r.result(q)
	if !ok {
		return out, nil
	}
	for _, p := range res.Pairs {
		rel := strings.TrimLeft(strings.TrimPrefix(p.Key, q.Key), "/")
		if recursive {
			if rel == "" || strings.HasSuffix(rel, "/") {
				continue
			}
		} else if rel == "" || strings.Contains(rel, "/") {
			continue
		}
		out = append(out, &KeyPair{
			Path: p.Key, Key: rel, Value: p.Value, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex,
			LockIndex: p.LockIndex, Flags: p.Flags, Session: p.Session,
		})
	}
	slices.SortStableFunc(out, func(a, b *KeyPair) int { return cmp.Compare(a.Path, b.Path) })
	if safe && len(out) == 0 {
		return nil, fmt.Errorf("%s %q: no keys under the prefix; refusing to render an empty list", fn, s)
	}
	return out, nil
}
