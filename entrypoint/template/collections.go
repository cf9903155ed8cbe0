package template

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"dario.cat/mergo"
)

// byKey groups pairs by the first segment of their key, which it strips;
// pairs with nothing after it are left out.
func byKey(pairs []*KeyPair) map[string]map[string]*KeyPair {
	m := map[string]map[string]*KeyPair{}
	for _, p := range pairs {
		top, rest, _ := strings.Cut(p.Key, "/")
		if rest == "" {
			continue
		}
		if m[top] == nil {
			m[top] = map[string]*KeyPair{}
		}
		cp := *p
		cp.Key = rest
		m[top][rest] = &cp
	}
	return m
}

// byTag groups services (from service, services or node) by tag.
func byTag(v any) (map[string][]any, error) {
	m := map[string][]any{}
	switch list := v.(type) {
	case nil:
	case []*HealthService:
		for _, s := range list {
			for _, t := range s.Tags {
				m[t] = append(m[t], s)
			}
		}
	case []*CatalogSnippet:
		for _, s := range list {
			for _, t := range s.Tags {
				m[t] = append(m[t], s)
			}
		}
	case []*CatalogNodeService:
		for _, s := range list {
			for _, t := range s.Tags {
				m[t] = append(m[t], s)
			}
		}
	default:
		return nil, fmt.Errorf("byTag: wrong argument type %T", v)
	}
	return m, nil
}

// byPort groups instances by port.
func byPort(v any) (map[int][]any, error) {
	m := map[int][]any{}
	switch list := v.(type) {
	case nil:
	case []*HealthService:
		for _, s := range list {
			m[s.Port] = append(m[s.Port], s)
		}
	case []*CatalogNodeService:
		for _, s := range list {
			m[s.Port] = append(m[s.Port], s)
		}
	default:
		return nil, fmt.Errorf("byPort: wrong argument type %T", v)
	}
	return m, nil
}

var metaUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// byMeta groups instances by the values of comma-separated meta keys,
// joined by "_"; a key suffixed "|int" is zero-padded to five digits so
// that groups sort numerically.
func byMeta(keys string, services []*HealthService) (map[string][]*HealthService, error) {
	groups := map[string][]*HealthService{}
	metas := strings.Split(keys, ",")
	for _, s := range services {
		parts := make([]string, 0, len(metas))
		for _, k := range metas {
			name, isInt := strings.CutSuffix(k, "|int")
			v := s.ServiceMeta[name]
			switch {
			case isInt:
				if v == "" {
					v = "0"
				}
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("byMeta: cannot parse %q as a number: %w", v, err)
				}
				v = fmt.Sprintf("%05d", n)
			case v == "":
				v = "_no_" + name + "_"
			}
			parts = append(parts, metaUnsafe.ReplaceAllString(v, "_"))
		}
		key := strings.Join(parts, "_")
		groups[key] = append(groups[key], s)
	}
	return groups, nil
}

// explode turns pairs into nested maps, one level per key segment.
func explode(pairs []*KeyPair) (map[string]any, error) {
	m := map[string]any{}
	for _, p := range pairs {
		if err := explodeInto(m, p.Key, p.Value, p.Key); err != nil {
			return nil, fmt.Errorf("explode: %w", err)
		}
	}
	return m, nil
}

// explodeMap turns a flat map with "/"-separated keys into nested maps.
func explodeMap(in map[string]any) (map[string]any, error) {
	m := map[string]any{}
	keys := make([]string, 0, len(in))
	for k := range in {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := explodeInto(m, k, in[k], k); err != nil {
			return nil, fmt.Errorf("explodeMap: %w", err)
		}
	}
	return m, nil
}

func explodeInto(m map[string]any, k string, v any, full string) error {
	top, rest, nested := strings.Cut(k, "/")
	if !nested {
		if k != "" {
			m[k] = v
		}
		return nil
	}
	if _, ok := m[top]; !ok {
		m[top] = map[string]any{}
	}
	sub, ok := m[top].(map[string]any)
	if !ok {
		return fmt.Errorf("not a map: %q: %q already has value %q", full, top, m[top])
	}
	return explodeInto(sub, rest, v, k)
}

// mergeMap merges src into dst (dst wins unless an option says otherwise),
// deeply, as consul-template does with mergo.
func mergeMap(dst, src map[string]any, opts ...func(*mergo.Config)) (map[string]any, error) {
	if dst == nil {
		dst = map[string]any{}
	}
	if err := mergo.Map(&dst, src, opts...); err != nil {
		return nil, err
	}
	return dst, nil
}
