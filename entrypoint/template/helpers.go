package template

import (
	"bytes"
	"crypto/hmac"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"iter"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"dario.cat/mergo"
	yaml2 "go.yaml.in/yaml/v2"
	yaml3 "go.yaml.in/yaml/v3"
)

// helperFuncs are consul-template's helpers that need nothing but their
// arguments.
var helperFuncs = map[string]any{
	"base64Decode":          base64Decode,
	"base64Encode":          func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"base64URLDecode":       base64URLDecode,
	"base64URLEncode":       func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) },
	"byKey":                 byKey,
	"byMeta":                byMeta,
	"byPort":                byPort,
	"byTag":                 byTag,
	"contains":              func(needle, list any) bool { return in(list, needle) },
	"containsAll":           containsFunc(true, false),
	"containsAny":           containsFunc(false, false),
	"containsNone":          containsFunc(true, true),
	"containsNotAll":        containsFunc(false, true),
	"explode":               explode,
	"explodeMap":            explodeMap,
	"hmacSHA256Hex":         hmacSHA256Hex,
	"in":                    in,
	"indent":                indent,
	"join":                  join,
	"loop":                  loop,
	"md5sum":                func(s string) string { return fmt.Sprintf("%x", md5.Sum([]byte(s))) },
	"mergeMap":              func(dst, src map[string]any) (map[string]any, error) { return mergeMap(dst, src) },
	"mergeMapWithOverride":  func(dst, src map[string]any) (map[string]any, error) { return mergeMap(dst, src, mergo.WithOverride) },
	"parseBool":             parseBool,
	"parseFloat":            parseFloat,
	"parseInt":              parseInt,
	"parseJSON":             parseJSON,
	"parseUint":             parseUint,
	"parseYAML":             parseYAML,
	"regexMatch":            regexMatch,
	"regexReplaceAll":       regexReplaceAll,
	"replaceAll":            func(from, to, s string) string { return strings.ReplaceAll(s, from, to) },
	"sha256Hex":             func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) },
	"split":                 split,
	"splitToMap":            splitToMap,
	"toJSON":                toJSON,
	"toJSONPretty":          toJSONPretty,
	"toLower":               strings.ToLower,
	"toTOML":                toTOML,
	"toTitle":               toTitle,
	"toUnescapedJSON":       func(v any) (string, error) { return unescapedJSON(v, "") },
	"toUnescapedJSONPretty": func(v any) (string, error) { return unescapedJSON(v, "  ") },
	"toUpper":               strings.ToUpper,
	"toYAML":                toYAML,
	"trim":                  func(cutset, s string) string { return strings.Trim(s, cutset) },
	"trimPrefix":            func(prefix, s string) string { return strings.TrimPrefix(s, prefix) },
	"trimSpace":             strings.TrimSpace,
	"trimSuffix":            func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },

	"add":      func(b, a any) (any, error) { return arith("add", a, b) },
	"subtract": func(b, a any) (any, error) { return arith("subtract", a, b) },
	"multiply": func(b, a any) (any, error) { return arith("multiply", a, b) },
	"divide":   func(b, a any) (any, error) { return arith("divide", a, b) },
	"modulo":   func(b, a any) (any, error) { return arith("modulo", a, b) },
	"minimum":  func(b, a any) (any, error) { return extremum("minimum", a, b) },
	"maximum":  func(b, a any) (any, error) { return extremum("maximum", a, b) },
}

func base64Decode(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("base64Decode: %w", err)
	}
	return string(b), nil
}

func base64URLDecode(s string) (string, error) {
	b, err := base64.URLEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("base64URLDecode: %w", err)
	}
	return string(b), nil
}

func hmacSHA256Hex(message, key string) string {
	h := hmac.New(sha256.New, []byte(key))
	h.Write([]byte(message))
	return hex.EncodeToString(h.Sum(nil))
}

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

// in reports whether needle is in list: an element of a slice or array
// (strings match strings of the same type, numbers of any width match by
// value), or a substring of a string.
func in(list, needle any) bool {
	lv, nv := reflect.ValueOf(list), reflect.ValueOf(needle)
	if !lv.IsValid() || !nv.IsValid() {
		return false
	}
	switch lv.Kind() {
	case reflect.String:
		return nv.Type() == lv.Type() && strings.Contains(lv.String(), nv.String())
	case reflect.Slice, reflect.Array:
		for i := range lv.Len() {
			if sameValue(lv.Index(i), nv) {
				return true
			}
		}
	}
	return false
}

func sameValue(a, b reflect.Value) bool {
	for a.Kind() == reflect.Interface && !a.IsNil() {
		a = a.Elem()
	}
	switch {
	case isInt(a) && isInt(b):
		return a.Int() == b.Int()
	case isFloat(a) && isFloat(b):
		return a.Float() == b.Float()
	case a.Kind() == reflect.String && b.Kind() == reflect.String:
		return a.Type() == b.Type() && a.String() == b.String()
	}
	return false
}

func isInt(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return true
	}
	return false
}

func isFloat(v reflect.Value) bool {
	return v.Kind() == reflect.Float32 || v.Kind() == reflect.Float64
}

// containsFunc builds containsAll (all, !none), containsAny, containsNone
// and containsNotAll: needles is any list, haystack as for `in`.
func containsFunc(all, negate bool) func(needles, haystack any) (bool, error) {
	return func(needles, haystack any) (bool, error) {
		nv := reflect.ValueOf(needles)
		if nv.Kind() != reflect.Slice && nv.Kind() != reflect.Array {
			return false, fmt.Errorf("wrong argument type %T: want a list of needles", needles)
		}
		for i := range nv.Len() {
			found := in(haystack, nv.Index(i).Interface())
			if negate {
				found = !found
			}
			// all: every needle must pass; any: one is enough.
			if all && !found {
				return false, nil
			}
			if !all && found {
				return true, nil
			}
		}
		return all, nil
	}
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

// indent prefixes every non-empty line with n spaces.
func indent(n int, s string) (string, error) {
	if n < 0 {
		return "", fmt.Errorf("indent value must be a positive integer")
	}
	pad := strings.Repeat(" ", n)
	var b strings.Builder
	start := true
	for i := 0; i < len(s); i++ {
		if start && s[i] != '\n' {
			b.WriteString(pad)
		}
		b.WriteByte(s[i])
		start = s[i] == '\n'
	}
	return b.String(), nil
}

// loop yields the integers from 0 (or the first argument) up to but not
// including the last argument; numbers may be given as strings.
func loop(args ...any) (iter.Seq[int64], error) {
	var start, stop int64
	var err error
	switch len(args) {
	case 1:
		stop, err = toInt64(args[0])
	case 2:
		if start, err = toInt64(args[0]); err == nil {
			stop, err = toInt64(args[1])
		}
	default:
		return nil, fmt.Errorf("loop: wrong number of arguments, expected 1 or 2, but got %d", len(args))
	}
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	return func(yield func(int64) bool) {
		for i := start; i < stop; i++ {
			if !yield(i) {
				return
			}
		}
	}, nil
}

func toInt64(v any) (int64, error) {
	rv := reflect.ValueOf(v)
	switch {
	case isInt(rv):
		return rv.Int(), nil
	case isUint(rv):
		return int64(rv.Uint()), nil
	case rv.Kind() == reflect.String:
		return parseInt(rv.String())
	}
	return 0, fmt.Errorf("bad argument type %T", v)
}

// join joins a list of strings (or of anything, printed with fmt).
func join(sep string, list any) (string, error) {
	switch l := list.(type) {
	case []string:
		return strings.Join(l, sep), nil
	case ServiceTags:
		return strings.Join(l, sep), nil
	}
	lv := reflect.ValueOf(list)
	if lv.Kind() != reflect.Slice && lv.Kind() != reflect.Array {
		return "", fmt.Errorf("join: wrong argument type %T", list)
	}
	parts := make([]string, lv.Len())
	for i := range parts {
		parts[i] = fmt.Sprint(lv.Index(i).Interface())
	}
	return strings.Join(parts, sep), nil
}

// split splits s, trimmed of surrounding space, on sep; "" is no element.
func split(sep, s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return []string{}
	}
	return strings.Split(s, sep)
}

// splitToMap splits s on sep1, then every item once on sep2 into a key and
// a value; items without sep2 are left out.
func splitToMap(sep1, sep2, s string) map[string]string {
	m := map[string]string{}
	s = strings.TrimSpace(s)
	if s == "" {
		return m
	}
	for _, item := range strings.Split(s, sep1) {
		if k, v, ok := strings.Cut(item, sep2); ok {
			m[k] = v
		}
	}
	return m
}

// The parse* helpers read "" as the zero value, as consul-template does
// for a key that is not fetched yet.

func parseBool(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("parseBool: %w", err)
	}
	return b, nil
}

func parseFloat(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("parseFloat: %w", err)
	}
	return f, nil
}

func parseInt(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parseInt: %w", err)
	}
	return n, nil
}

func parseUint(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parseUint: %w", err)
	}
	return n, nil
}

func parseJSON(s string) (any, error) {
	if s == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("parseJSON: %w", err)
	}
	return v, nil
}

// parseYAML decodes with string-keyed maps (consul-template's YAML library
// yields interface-keyed ones, which toJSON cannot encode).
func parseYAML(s string) (any, error) {
	if s == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := yaml3.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("parseYAML: %w", err)
	}
	return v, nil
}

func regexMatch(re, s string) (bool, error) {
	c, err := regexp.Compile(re)
	if err != nil {
		return false, err
	}
	return c.MatchString(s), nil
}

func regexReplaceAll(re, repl, s string) (string, error) {
	c, err := regexp.Compile(re)
	if err != nil {
		return "", err
	}
	return c.ReplaceAllString(s, repl), nil
}

func toJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("toJSON: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}

func toJSONPretty(v any) (string, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("toJSONPretty: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}

func unescapedJSON(v any, indent string) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("toUnescapedJSON: %w", err)
	}
	return strings.TrimRight(b.String(), "\r\n"), nil
}

// toYAML encodes as consul-template does (the yaml.v2 layout: two-space
// indentation, sequences not indented under their key).
func toYAML(v any) (string, error) {
	b, err := yaml2.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("toYAML: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}

// toTitle upper-cases the first letter of every word and leaves the rest
// alone.
func toTitle(s string) string {
	var b strings.Builder
	prev := ' '
	for _, r := range s {
		if isWordStart(prev) {
			b.WriteRune(unicode.ToTitle(r))
		} else {
			b.WriteRune(r)
		}
		prev = r
	}
	return b.String()
}

func isWordStart(prev rune) bool {
	return !(unicode.IsLetter(prev) || unicode.IsDigit(prev) || prev == '_' || prev == '\'' || unicode.IsMark(prev))
}
