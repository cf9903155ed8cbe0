package template

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// toTOML encodes a map (usually from explode) as a TOML document, laid out
// as consul-template's TOML library does: plain keys first, then tables,
// sorted by key within each, a blank line before every top-level table and
// two spaces of indentation per nesting level. Structs are encoded by
// their exported fields, in order.
func toTOML(v any) (string, error) {
	rv := indirect(reflect.ValueOf(v))
	if rv.Kind() != reflect.Map && rv.Kind() != reflect.Struct {
		return "", fmt.Errorf("toTOML: top-level value must be a map, not %T", v)
	}
	var e tomlEncoder
	if err := e.table(nil, rv); err != nil {
		return "", fmt.Errorf("toTOML: %w", err)
	}
	return strings.TrimSpace(e.b.String()), nil
}

type tomlEncoder struct{ b strings.Builder }

// indirect follows pointers and interfaces; an invalid Value means nil.
func indirect(v reflect.Value) reflect.Value {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return reflect.Value{}
		}
		v = v.Elem()
	}
	return v
}

type tomlField struct {
	key string
	val reflect.Value
}

// fields lists a map's or struct's entries, nil ones left out.
func fields(v reflect.Value) ([]tomlField, error) {
	var out []tomlField
	switch v.Kind() {
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("cannot encode a map with %s keys", v.Type().Key())
		}
		for _, k := range v.MapKeys() {
			if fv := indirect(v.MapIndex(k)); present(fv) {
				out = append(out, tomlField{k.String(), fv})
			}
		}
		slices.SortFunc(out, func(a, b tomlField) int { return strings.Compare(a.key, b.key) })
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			if fv := indirect(v.Field(i)); present(fv) {
				out = append(out, tomlField{f.Name, fv})
			}
		}
	}
	return out, nil
}

// present is false for nil values, which TOML cannot express: they are
// left out.
func present(v reflect.Value) bool {
	if !v.IsValid() {
		return false
	}
	return !(v.Kind() == reflect.Map || v.Kind() == reflect.Slice) || !v.IsNil()
}

func isTable(v reflect.Value) bool {
	if _, ok := v.Interface().(time.Time); ok {
		return false
	}
	return v.Kind() == reflect.Map || v.Kind() == reflect.Struct
}

func isTableArray(v reflect.Value) bool {
	if v.Kind() != reflect.Slice && v.Kind() != reflect.Array || v.Len() == 0 {
		return false
	}
	first := indirect(v.Index(0))
	return first.IsValid() && isTable(first)
}

func (e *tomlEncoder) newline() {
	if e.b.Len() > 0 {
		e.b.WriteByte('\n')
	}
}

func (e *tomlEncoder) table(path []string, v reflect.Value) error {
	fs, err := fields(v)
	if err != nil {
		return err
	}
	indent := strings.Repeat("  ", len(path))
	var subs []tomlField
	for _, f := range fs {
		if isTable(f.val) || isTableArray(f.val) {
			subs = append(subs, f)
			continue
		}
		e.b.WriteString(indent + tomlKey(f.key) + " = ")
		if err := e.value(f.val); err != nil {
			return err
		}
		e.b.WriteByte('\n')
	}
	for _, f := range subs {
		sub := append(slices.Clone(path), f.key)
		header := tomlHeader(sub)
		if isTable(f.val) {
			if len(sub) == 1 {
				e.newline()
			}
			e.b.WriteString(indent + "[" + header + "]\n")
			if err := e.table(sub, f.val); err != nil {
				return err
			}
			continue
		}
		for i := range f.val.Len() {
			elem := indirect(f.val.Index(i))
			if !elem.IsValid() {
				continue
			}
			if !isTable(elem) {
				return fmt.Errorf("array %s mixes tables and values", header)
			}
			e.newline()
			e.b.WriteString(indent + "[[" + header + "]]\n")
			if err := e.table(sub, elem); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *tomlEncoder) value(v reflect.Value) error {
	if t, ok := v.Interface().(time.Time); ok {
		e.b.WriteString(t.Format(time.RFC3339Nano))
		return nil
	}
	switch {
	case v.Kind() == reflect.String:
		e.b.WriteString(tomlString(v.String()))
	case v.Kind() == reflect.Bool:
		e.b.WriteString(strconv.FormatBool(v.Bool()))
	case isInt(v):
		e.b.WriteString(strconv.FormatInt(v.Int(), 10))
	case isUint(v):
		e.b.WriteString(strconv.FormatUint(v.Uint(), 10))
	case isFloat(v):
		e.b.WriteString(tomlFloat(v.Float(), v.Type().Bits()))
	case v.Kind() == reflect.Slice || v.Kind() == reflect.Array:
		e.b.WriteByte('[')
		for i := range v.Len() {
			elem := indirect(v.Index(i))
			if !elem.IsValid() {
				return fmt.Errorf("cannot encode an array with a nil element")
			}
			if i > 0 {
				e.b.WriteString(", ")
			}
			if err := e.value(elem); err != nil {
				return err
			}
		}
		e.b.WriteByte(']')
	case isTable(v):
		fs, err := fields(v)
		if err != nil {
			return err
		}
		e.b.WriteByte('{')
		for i, f := range fs {
			if i > 0 {
				e.b.WriteString(", ")
			}
			e.b.WriteString(tomlKey(f.key) + " = ")
			if err := e.value(f.val); err != nil {
				return err
			}
		}
		e.b.WriteByte('}')
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}

func tomlFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "+inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'f', -1, bits)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

func tomlHeader(path []string) string {
	parts := make([]string, len(path))
	for i, p := range path {
		parts[i] = tomlKey(p)
	}
	return strings.Join(parts, ".")
}

// tomlKey leaves a bare key (letters, digits, "_", "-") alone and quotes
// any other.
func tomlKey(k string) string {
	if k == "" {
		return `""`
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return tomlString(k)
		}
	}
	return k
}

// tomlString is a basic (double-quoted) TOML string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 || r == 0x7f {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
