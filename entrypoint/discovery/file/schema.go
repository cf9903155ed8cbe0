package file

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// schema checks the tree of one file against the services file format (see
// the package documentation) and builds its instances. Names, tags and
// meta are carried as written: escaping them for HAProxy is the renderer's
// business.
type schema struct {
	file  string
	nodes int // visited, against maxNodes
}

// maxNodes bounds the nodes a file may expand to through YAML aliases, so
// that a few lines of anchors cannot make a scan quadratic or fill the
// memory. A file of maxInstancesPerFile instances with ten tags each
// visits about 100,000.
const maxNodes = 200_000

var errTooBig = errors.New("too many values once YAML aliases are expanded")

func (s *schema) errorf(n *yaml.Node, format string, args ...any) error {
	return &fileError{File: s.file, Line: max(n.Line, 1), Msg: fmt.Sprintf(format, args...)}
}

// resolve follows an alias to its anchored node and counts the visit.
func (s *schema) resolve(n *yaml.Node) (*yaml.Node, error) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if s.nodes++; s.nodes > maxNodes {
		return nil, s.errorf(n, "%v", errTooBig)
	}
	return n, nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// describe names the type of a node for an error.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!null":
		return "null"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!str":
		return "a string"
	}
	return "a value tagged " + n.Tag
}

// fields calls fn for each key and value of the mapping n, rejecting keys
// that are not strings, merge keys and keys that repeat.
func (s *schema) fields(n *yaml.Node, what string, fn func(key string, k, v *yaml.Node) error) error {
	n, err := s.resolve(n)
	if err != nil {
		return err
	}
	if n.Kind != yaml.MappingNode {
		return s.errorf(n, "%s must be a mapping, not %s", what, describe(n))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := s.resolve(n.Content[i])
		if err != nil {
			return err
		}
		if k.Tag == "!!merge" {
			return s.errorf(k, "merge keys (<<) are not supported: write the fields out (anchors and aliases of whole values work)")
		}
		key, err := s.str(k, "a key in "+what)
		if err != nil {
			return err
		}
		if line, dup := seen[key]; dup {
			return s.errorf(k, "%q appears twice in %s (first on line %d)", key, what, line)
		}
		seen[key] = k.Line
		if err := fn(key, k, n.Content[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// str returns a scalar's text as written: numbers, booleans and dates are
// strings too (`version: 1.10` is "1.10"); null and collections are not.
func (s *schema) str(n *yaml.Node, what string) (string, error) {
	n, err := s.resolve(n)
	if err != nil {
		return "", err
	}
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", s.errorf(n, "%s must be a string, not %s", what, describe(n))
	}
	switch n.Tag {
	case "!!str", "!!int", "!!float", "!!bool", "!!timestamp":
		return n.Value, nil
	}
	return "", s.errorf(n, "%s: the tag %s is not supported", what, n.Tag)
}

// strs returns a list of strings; null is an empty list.
func (s *schema) strs(n *yaml.Node, what string) ([]string, error) {
	n, err := s.resolve(n)
	if err != nil || isNull(n) {
		return nil, err
	}
	if n.Kind != yaml.SequenceNode {
		return nil, s.errorf(n, "%s must be a list of strings, not %s", what, describe(n))
	}
	out := make([]string, 0, len(n.Content))
	for _, item := range n.Content {
		v, err := s.str(item, "each of "+what)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// strMap returns a mapping of strings to strings; null is an empty one.
func (s *schema) strMap(n *yaml.Node, what string) (map[string]string, error) {
	r, err := s.resolve(n)
	if err != nil || isNull(r) {
		return nil, err
	}
	out := map[string]string{}
	err = s.fields(n, what, func(key string, _, v *yaml.Node) error {
		val, err := s.str(v, what+" "+strconv.Quote(key))
		out[key] = val
		return err
	})
	return out, err
}

var decimal = regexp.MustCompile(`^[-+]?(0|[1-9][0-9]*)$`)

// integer returns a decimal integer, saturated at the int64 limits.
// Octal, hexadecimal and 1_000 are refused: `port: 010` is 8 to YAML 1.1 and
// 10 to YAML 1.2.
func (s *schema) integer(n *yaml.Node, what string) (int64, error) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		return 0, s.errorf(n, "%s must be an integer, not %s", what, describe(n))
	}
	if !decimal.MatchString(n.Value) {
		return 0, s.errorf(n, "%s must be a decimal integer, not %s", what, n.Value)
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		v = math.MaxInt64
		if n.Value[0] == '-' {
			v = math.MinInt64
		}
	}
	return v, nil
}

// service checks the file's top-level mapping and its instances.
func (s *schema) service(root *yaml.Node) (*service, error) {
	var (
		svc     service
		tags    []string
		meta    map[string]string
		list    *yaml.Node
		hasName bool
	)
	err := s.fields(root, "the file", func(key string, k, v *yaml.Node) error {
		var err error
		switch key {
		case "name":
			hasName, svc.line = true, k.Line
			if svc.name, err = s.str(v, "name"); err == nil && svc.name == "" {
				err = s.errorf(k, "name is empty")
			}
		case "tags":
			tags, err = s.strs(v, "tags")
		case "meta":
			meta, err = s.strMap(v, "meta")
		case "instances":
			list = v
		default:
			err = s.errorf(k, "unknown field %q (a service has name, tags, meta and instances)", key)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if !hasName {
		return nil, s.errorf(root, "no name: the file must name its service (name: web)")
	}
	if list == nil {
		return &svc, nil
	}
	if list, err = s.resolve(list); err != nil || isNull(list) {
		return &svc, err
	}
	if list.Kind != yaml.SequenceNode {
		return nil, s.errorf(list, "instances must be a list, not %s", describe(list))
	}
	if n := len(list.Content); n > maxInstancesPerFile {
		return nil, s.errorf(list, "%d instances; a services file holds at most %d", n, maxInstancesPerFile)
	}
	ids := map[string]int{}
	endpoints := map[string]int{}
	for i, item := range list.Content {
		in, line, err := s.instance(item, i+1)
		if err != nil {
			return nil, err
		}
		in.Name = svc.name
		in.Tags = mergeTags(tags, in.Tags)
		in.Meta = mergeMeta(meta, in.Meta)
		endpoint := net.JoinHostPort(in.Address, strconv.Itoa(in.Port))
		if in.ID == "" {
			in.ID = endpoint
		}
		if first, dup := ids[in.ID]; dup {
			return nil, &fileError{File: s.file, Line: line, Msg: fmt.Sprintf("instance id %q is already used on line %d (ids default to address:port)", in.ID, first)}
		}
		if first, dup := endpoints[endpoint]; dup {
			return nil, &fileError{File: s.file, Line: line, Msg: fmt.Sprintf("instance %s is already listed on line %d", endpoint, first)}
		}
		ids[in.ID], endpoints[endpoint] = line, line
		svc.instances = append(svc.instances, in)
	}
	return &svc, nil
}

// instance checks the i-th (1-based) instance; it returns the line of its
// mapping.
func (s *schema) instance(n *yaml.Node, i int) (model.Instance, int, error) {
	in := model.Instance{Source: Name, Status: model.StatusPassing}
	var hasAddress, hasPort bool
	r, err := s.resolve(n)
	if err != nil {
		return in, 0, err
	}
	line := max(n.Line, 1) // of the item, which may be an alias
	what := fmt.Sprintf("instance %d", i)
	err = s.fields(n, what, func(key string, k, v *yaml.Node) error {
		var err error
		if v, err = s.resolve(v); err != nil || (isNull(v) && key != "address" && key != "port") {
			return err // an optional field set to null is left out
		}
		switch key {
		case "address":
			hasAddress = true
			if in.Address, err = s.str(v, "address"); err == nil && in.Address == "" {
				err = s.errorf(v, "address is empty")
			}
		case "port":
			hasPort = true
			var p int64
			if p, err = s.integer(v, "port"); err == nil && (p < 1 || p > 65535) {
				err = s.errorf(v, "port %s is outside 1-65535", v.Value)
			}
			in.Port = int(p)
		case "weight":
			var w int64
			if w, err = s.integer(v, "weight"); err == nil && (w < 1 || w > math.MaxInt32) {
				err = s.errorf(v, "weight %s is outside 1-%d (leave weight out for HAProxy's default; remove the instance to stop sending it traffic)", v.Value, math.MaxInt32)
			}
			in.Weight = int(w)
		case "id":
			if in.ID, err = s.str(v, "id"); err == nil && in.ID == "" {
				err = s.errorf(v, "id is empty (leave it out for address:port)")
			}
		case "tags":
			in.Tags, err = s.strs(v, "tags")
		case "meta":
			in.Meta, err = s.strMap(v, "meta")
		default:
			err = s.errorf(k, "unknown field %q (an instance has address, port, weight, id, tags and meta)", key)
		}
		return err
	})
	switch {
	case err != nil:
	case !hasAddress:
		err = s.errorf(r, "%s has no address", what)
	case !hasPort:
		err = s.errorf(r, "%s has no port", what)
	}
	return in, line, err
}

// mergeTags returns the service's tags followed by the instance's that the
// service does not have; nil when there are none.
func mergeTags(service, instance []string) []string {
	var out []string
	for _, t := range slices.Concat(service, instance) {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// mergeMeta returns the service's meta with the instance's over it; nil
// when both are empty.
func mergeMeta(service, instance map[string]string) map[string]string {
	if len(service)+len(instance) == 0 {
		return nil
	}
	out := make(map[string]string, len(service)+len(instance))
	maps.Copy(out, service)
	maps.Copy(out, instance)
	return out
}
