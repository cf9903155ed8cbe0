package routes

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Routes is the validated route model of a catalog. Every string in it that
// reaches a configuration (names, hosts, paths, addresses) has been checked
// against a small character set; Service and Instance fields keep the
// catalog's own (untrusted) names for reports.
type Routes struct {
	// Services that have at least one route, by name.
	Services []Service
	// Rules are the HTTP routes in the order HAProxy tries them: exact
	// hosts, then wildcard hosts (longest first), then rules for any host;
	// within a host, the longest path first. The rule for any host and
	// path "/", if there is one, is last: it catches what nothing else does.
	Rules []Rule
	// Listeners are the TCP ports, by port.
	Listeners []Listener
	// shape is the cache's assembly these routes are (cache.go), the same
	// while the rules, listeners and backends stay; nil from Build.
	shape *assembly
}

// Service is one routed service.
type Service struct {
	Name string // as registered
	// HTTPBackend and TCPBackend are the backends' names, "" when the
	// service has no route of that kind. They depend only on the name.
	HTTPBackend string
	TCPBackend  string
	// Redirect: an instance asked for seamless.http.tls=redirect; the
	// HTTP backend then sends plain HTTP requests to HTTPS.
	Redirect bool
	// Servers are the instances that pass the health filter, by name.
	// Both backends of a service hold the same servers.
	Servers []Server
}

// Server is one instance as a server line.
type Server struct {
	// Name is unique in the service and depends only on the instance (see
	// Ident), so that it survives other instances coming and going.
	Name     string
	Instance string // the instance's ID, unique within the service
	// ServiceID is the ID as registered, which names the server (Consul's
	// IDs are unique per node only; Instance adds the node).
	ServiceID string
	Address   Address
	Port      int
	Weight    int // 1–256
	Status    string
}

// Addr is host:port as a server line takes it.
func (s Server) Addr() string { return s.Address.HostPort(s.Port) }

// Rule routes requests for Host (any host when "") whose path starts with
// the segments of Path to a backend.
type Rule struct {
	Host    string // "a.example", "*.example" or ""
	Path    string // "/" or "/api"
	Service string
	Backend string
}

// CatchAll reports whether the rule matches every request.
func (r Rule) CatchAll() bool { return r.Host == "" && r.Path == "/" }

func (r Rule) String() string {
	h := "any host"
	if r.Host != "" {
		h = "host " + r.Host
	}
	return h + " path " + r.Path
}

// Listener is a TCP frontend.
type Listener struct {
	Port    int
	Service string
	Backend string
}

// Skip is something left out of the configuration, and why.
type Skip struct {
	Service  string // as registered
	Instance string // the instance's ID; "" when a tag or the service is concerned
	Reason   string // words for an operator
	// Kind classifies the reason for the metrics: one of the Refused*
	// constants.
	Kind string
}

// Kinds of Skip, the reason label of seamless_routes_refused_total.
const (
	RefusedTag      = "invalid_tag"      // an instance with an unusable seamless.* tag
	RefusedInstance = "invalid_instance" // a bad name, address, port or weight
	RefusedService  = "invalid_service"  // a service name that cannot be used
	RefusedConflict = "conflict"         // a route or port another service registered first
	RefusedReserved = "reserved_port"    // a TCP port seamless's own frontends use
)

func (s Skip) String() string {
	b := "service " + quote(s.Service)
	if s.Instance != "" {
		b += " instance " + quote(s.Instance)
	}
	return b + ": " + s.Reason
}

// Policy is what Build needs besides the catalog.
type Policy struct {
	// Health filters the instances that become servers (model.HealthFilter;
	// empty means passing). Routes come from every instance's tags, so
	// that a service whose instances all fail keeps its routes and answers
	// 503, instead of its requests falling through to another rule.
	Health []string
	// Reserved are ports no seamless.tcp.port may take, with what holds
	// them ("SEAMLESS_HTTP_BIND").
	Reserved map[int]string
	// Sources lists source names by precedence (SEAMLESS_SOURCES): a
	// conflict between services of two sources goes to the earlier one.
	Sources []string
}

// Build turns a catalog into routes. Services without seamless.* tags are
// not routed. Whatever cannot be used is left out and reported as a Skip;
// the rest applies. An instance is used only when it passes
// model.CheckInstance and all of its seamless.* tags are valid: a bad tag
// never leaves the rest of the instance's tags to make a wider route.
// Conflicts (one host and path, or one TCP port, claimed by several
// services) go to the service registered first (see candidate.before).
// The result depends only on the catalog's contents, not on the order of
// its instances.
func Build(c model.Catalog, p Policy) (Routes, []Skip) { return buildCached(c, p, nil) }

// buildCached is Build, through cache when it is not nil (the Policy must
// not change between its calls); see cache.go.
func buildCached(c model.Catalog, p Policy, cache *serviceCache) (Routes, []Skip) {
	if cache != nil {
		return cache.build(c, p)
	}
	insts := sortedInstances(c.All())
	var sk skips
	var cands []candidate
	for i := 0; i < len(insts); {
		j := nextService(insts, i)
		if cand, ok := buildService(insts[i:j], p, &sk); ok {
			cands = append(cands, cand)
		}
		i = j
	}
	return assemble(cands, p.Reserved, &sk), sk.sorted()
}

// instanceOrder is the order Build reads a catalog in.
func instanceOrder(a, b model.Instance) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Node, b.Node), cmp.Compare(a.Address, b.Address),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.ID, b.ID), cmp.Compare(a.Source, b.Source))
}

// sortedInstances returns insts in instanceOrder: insts itself, read only,
// when it is (a merged catalog is), or a sorted copy.
func sortedInstances(insts []model.Instance) []model.Instance {
	if slices.IsSortedFunc(insts, instanceOrder) {
		return insts
	}
	insts = slices.Clone(insts)
	slices.SortStableFunc(insts, instanceOrder)
	return insts
}

// nextService returns the end of the service that starts at i.
func nextService(insts []model.Instance, i int) int {
	j := i + 1
	for j < len(insts) && insts[j].Name == insts[i].Name {
		j++
	}
	return j
}

// candidate is a service before conflicts between services are resolved.
type candidate struct {
	name    string
	rules   []Rule // Host and Path only
	ports   []int
	servers []Server
	// redirect: an instance of the service asked for HTTPS only.
	redirect bool
	// The registration of the service's earliest instance: its source's
	// precedence (rank, then source for sources not in Policy.Sources)
	// and model.Instance.Registered (0, unknown, as the largest).
	rank       int
	source     string
	registered uint64
}

// registration is the order key of one instance.
func registration(in model.Instance, sources []string) (rank int, source string, reg uint64) {
	rank = slices.Index(sources, in.Source)
	if rank < 0 {
		rank = len(sources)
	}
	reg = in.Registered
	if reg == 0 {
		reg = math.MaxUint64
	}
	return rank, in.Source, reg
}

// compareRegistration orders candidates by registration, then by name.
func compareRegistration(a, b candidate) int {
	return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.source, b.source),
		cmp.Compare(a.registered, b.registered), cmp.Compare(a.name, b.name))
}

// precedence says in words why holder keeps what c claims too.
func precedence(holder, c candidate) string {
	switch {
	case holder.rank != c.rank || holder.source != c.source:
		return fmt.Sprintf("its source %s comes before %s in SEAMLESS_SOURCES", quote(holder.source), quote(c.source))
	case holder.registered != c.registered:
		return "it was registered first"
	}
	return "both were registered at once and its name sorts first"
}

func hasSeamlessTag(tags []string) bool {
	return slices.ContainsFunc(tags, func(t string) bool {
		return len(t) >= len(tagPrefix) && strings.EqualFold(t[:len(tagPrefix)], tagPrefix)
	})
}

// buildService reads the tags and servers of one service's instances.
func buildService(insts []model.Instance, p Policy, sk *skips) (candidate, bool) {
	name := insts[0].Name
	if !slices.ContainsFunc(insts, func(in model.Instance) bool { return hasSeamlessTag(in.Tags) }) {
		return candidate{}, false
	}
	if err := model.CheckName("service name", name); err != nil {
		sk.add(RefusedService, name, "", "service left out: "+err.Error())
		return candidate{}, false
	}
	type hp struct{ host, path string }
	var routes []hp
	// Room for every instance: the list is kept while the service does
	// not change, and append's growth would keep up to half as much again.
	c := candidate{name: name, rank: math.MaxInt, servers: make([]Server, 0, len(insts))}
	for _, in := range insts {
		if err := model.CheckInstance(in); err != nil {
			sk.add(RefusedInstance, name, instanceLabel(in), err.Error()+"; instance left out")
			continue
		}
		t, problems := ParseTags(in.Tags)
		if len(problems) > 0 {
			for _, pr := range problems {
				sk.add(RefusedTag, name, "", pr+"; every instance with it is left out (an instance is routed with all of its seamless tags or not at all)")
			}
			continue
		}
		hosts, paths := t.Hosts, t.Paths
		if len(hosts) == 0 && len(paths) > 0 {
			hosts = []string{""}
		}
		if len(paths) == 0 {
			paths = []string{"/"}
		}
		if !t.Empty() {
			for _, h := range hosts {
				for _, pa := range paths {
					if r := (hp{h, pa}); !slices.Contains(routes, r) {
						routes = append(routes, r)
					}
				}
			}
		}
		c.redirect = c.redirect || t.Redirect
		for _, port := range t.Ports {
			if !slices.Contains(c.ports, port) {
				c.ports = append(c.ports, port)
			}
		}
		if rank, src, reg := registration(in, p.Sources); compareRegistration(candidate{rank: rank, source: src, registered: reg},
			candidate{rank: c.rank, source: c.source, registered: c.registered}) < 0 {
			c.rank, c.source, c.registered = rank, src, reg
		}
		if !model.HealthFilter(p.Health, in.Status) {
			continue
		}
		srv, err := server(in)
		if err != nil {
			sk.add(RefusedInstance, name, instanceLabel(in), err.Error()+"; instance left out")
			continue
		}
		c.servers = append(c.servers, srv)
	}
	if len(routes) == 0 && len(c.ports) == 0 {
		sk.add("", name, "", "service not routed: none of its instances with seamless tags can be used")
		return candidate{}, false
	}
	for _, r := range routes {
		c.rules = append(c.rules, Rule{Host: r.host, Path: r.path, Service: name})
	}
	slices.Sort(c.ports)
	nameServers(c.servers)
	return c, true
}

func instanceLabel(in model.Instance) string {
	if in.ID != "" {
		return in.ID
	}
	return net.JoinHostPort(in.Address, strconv.Itoa(in.Port))
}

// server validates one instance's address, port and weight.
func server(in model.Instance) (Server, error) {
	addr, err := ParseAddress(in.Address)
	if err != nil {
		return Server{}, err
	}
	if in.Port < 1 || in.Port > 65535 {
		if in.Port == 0 {
			return Server{}, fmt.Errorf("the instance has no port")
		}
		return Server{}, fmt.Errorf("port %d is outside 1–65535", in.Port)
	}
	w := in.Weight
	if in.Status == model.StatusWarning && in.WarningWeight != 0 {
		w = in.WarningWeight
	}
	if w == 0 {
		w = 1 // unset: HAProxy's default
	}
	if w < 1 || w > MaxWeight {
		return Server{}, fmt.Errorf("weight %d is outside HAProxy's range 1–%d", w, MaxWeight)
	}
	return Server{Instance: in.ID, ServiceID: in.ServiceID(), Address: addr, Port: in.Port, Weight: w, Status: in.Status}, nil
}

// nameServers gives servers their names: Ident of the instance ID (of
// address:port when it has none). When several instances of the service
// map to one name (the same ID on two nodes), each of them gets a hash of
// what tells them apart, so a name still depends on its instance alone.
func nameServers(srvs []Server) {
	base := func(s Server) string {
		if s.ServiceID != "" {
			return Ident(s.ServiceID)
		}
		return Ident(s.Addr())
	}
	count := map[string]int{}
	for _, s := range srvs {
		count[base(s)]++
	}
	for i := range srvs {
		s := &srvs[i]
		s.Name = base(*s)
		if count[s.Name] > 1 {
			s.Name += "-" + hash8(s.Instance, s.Address.Host, strconv.Itoa(s.Port))
		}
	}
	slices.SortFunc(srvs, func(a, b Server) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Addr(), b.Addr()),
			cmp.Compare(a.Weight, b.Weight), cmp.Compare(a.Instance, b.Instance))
	})
	names := make([]string, len(srvs))
	for i, s := range srvs {
		names[i] = s.Name
	}
	for i, n := range uniqueNames(names) {
		srvs[i].Name = n
	}
}

func hash8(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:4])
}

// assemble names backends and settles conflicts between services: the
// service registered first keeps a route or port, so that a newcomer never
// takes what another holds, whatever its name. cands come by name.
func assemble(cands []candidate, reserved map[int]string, sk *skips) Routes {
	idents := make([]string, len(cands))
	for i, c := range cands {
		idents[i] = Ident(c.name)
	}
	idents = uniqueNames(idents) // by name, so that a backend's name does not depend on who registered first

	order := make([]int, len(cands))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareRegistration(cands[a], cands[b]) })

	var rt Routes
	type hp struct{ host, path string }
	ruleOwner := map[hp]int{}
	portOwner := map[int]int{}
	services := make([]*Service, len(cands))
	for _, i := range order {
		c := cands[i]
		svc := Service{Name: c.name, Servers: c.servers}
		for _, r := range c.rules {
			k := hp{r.Host, r.Path}
			if owner, taken := ruleOwner[k]; taken {
				sk.add(RefusedConflict, c.name, "", fmt.Sprintf("route for %s refused: service %s has it too and keeps it: %s",
					r, quote(cands[owner].name), precedence(cands[owner], c)))
				continue
			}
			ruleOwner[k] = i
			svc.HTTPBackend = "http-" + idents[i]
			svc.Redirect = c.redirect
			r.Backend = svc.HTTPBackend
			rt.Rules = append(rt.Rules, r)
		}
		for _, port := range c.ports {
			if holder, ok := reserved[port]; ok {
				sk.add(RefusedReserved, c.name, "", fmt.Sprintf("tag %s=%d left out: port %d is %s's", TagTCPPort, port, port, holder))
				continue
			}
			if owner, taken := portOwner[port]; taken {
				sk.add(RefusedConflict, c.name, "", fmt.Sprintf("tag %s=%d refused: service %s has that port too and keeps it: %s",
					TagTCPPort, port, quote(cands[owner].name), precedence(cands[owner], c)))
				continue
			}
			portOwner[port] = i
			svc.TCPBackend = "tcp-" + idents[i]
			rt.Listeners = append(rt.Listeners, Listener{Port: port, Service: c.name, Backend: svc.TCPBackend})
		}
		if svc.HTTPBackend != "" || svc.TCPBackend != "" {
			services[i] = &svc
		}
	}
	for _, s := range services {
		if s != nil {
			rt.Services = append(rt.Services, *s)
		}
	}
	slices.SortFunc(rt.Rules, compareRules)
	slices.SortFunc(rt.Listeners, func(a, b Listener) int { return cmp.Compare(a.Port, b.Port) })
	return rt
}

// compareRules orders rules as HAProxy must try them: the most specific
// host first (exact names by name, then wildcards from the longest, then
// any host), and within a host the longest path first.
func compareRules(a, b Rule) int {
	rank := func(r Rule) int {
		switch {
		case r.Host == "":
			return 2
		case strings.HasPrefix(r.Host, "*."):
			return 1
		}
		return 0
	}
	longerWildcard := 0
	if rank(a) == 1 && rank(b) == 1 {
		longerWildcard = cmp.Compare(len(b.Host), len(a.Host))
	}
	return cmp.Or(cmp.Compare(rank(a), rank(b)), longerWildcard, cmp.Compare(a.Host, b.Host),
		cmp.Compare(len(b.Path), len(a.Path)), cmp.Compare(a.Path, b.Path))
}

// skips collects Skips once each.
type skips struct {
	list []Skip
	seen map[Skip]bool
}

func (s *skips) add(kind, service, instance, reason string) {
	k := Skip{Service: service, Instance: instance, Reason: reason, Kind: kind}
	if s.seen == nil {
		s.seen = map[Skip]bool{}
	}
	if !s.seen[k] {
		s.seen[k] = true
		s.list = append(s.list, k)
	}
}

func (s *skips) sorted() []Skip {
	slices.SortFunc(s.list, func(a, b Skip) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Instance, b.Instance), cmp.Compare(a.Reason, b.Reason))
	})
	return s.list
}
