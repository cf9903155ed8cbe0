package template

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

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
