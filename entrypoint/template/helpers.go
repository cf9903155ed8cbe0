package template

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"iter"
	"reflect"
	"regexp"
	"strings"
	"unicode"

	"dario.cat/mergo"
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
