package template

import (
	"errors"
	"fmt"
	"reflect"
)

// The math helpers take the piped value last: `{{ 10 | subtract 2 }}` is
// 8. As in consul-template, two signed integers (or a signed and an
// unsigned one) give an int64, two unsigned ones a uint64, anything with a
// float a float64.

type number struct {
	kind byte // 'i', 'u' or 'f'
	i    int64
	u    uint64
	f    float64
}

func isUint(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	}
	return false
}

func toNumber(v any) (number, bool) {
	rv := reflect.ValueOf(v)
	switch {
	case isInt(rv):
		return number{kind: 'i', i: rv.Int(), f: float64(rv.Int())}, true
	case isUint(rv):
		return number{kind: 'u', u: rv.Uint(), i: int64(rv.Uint()), f: float64(rv.Uint())}, true
	case isFloat(rv):
		return number{kind: 'f', f: rv.Float()}, true
	}
	return number{}, false
}

func (n number) value() any {
	switch n.kind {
	case 'i':
		return n.i
	case 'u':
		return n.u
	}
	return n.f
}

var errDivZero = errors.New("integer division by zero")

func numbers(op string, a, b any) (x, y number, err error) {
	x, ok := toNumber(a)
	if !ok {
		return x, y, fmt.Errorf("%s: unknown type for %v (%T)", op, a, a)
	}
	y, ok = toNumber(b)
	if !ok {
		return x, y, fmt.Errorf("%s: unknown type for %v (%T)", op, b, b)
	}
	return x, y, nil
}

// arith computes a op b.
func arith(op string, a, b any) (any, error) {
	x, y, err := numbers(op, a, b)
	if err != nil {
		return nil, err
	}
	switch {
	case x.kind == 'f' || y.kind == 'f':
		switch op {
		case "add":
			return x.f + y.f, nil
		case "subtract":
			return x.f - y.f, nil
		case "multiply":
			return x.f * y.f, nil
		case "divide":
			return x.f / y.f, nil
		}
		return nil, fmt.Errorf("%s: unknown type for %v (%T)", op, b, b)
	case x.kind == 'u' && y.kind == 'u':
		if (op == "divide" || op == "modulo") && y.u == 0 {
			return nil, fmt.Errorf("%s: %w", op, errDivZero)
		}
		switch op {
		case "add":
			return x.u + y.u, nil
		case "subtract":
			return x.u - y.u, nil
		case "multiply":
			return x.u * y.u, nil
		case "divide":
			return x.u / y.u, nil
		}
		return x.u % y.u, nil
	}
	if (op == "divide" || op == "modulo") && y.i == 0 {
		return nil, fmt.Errorf("%s: %w", op, errDivZero)
	}
	switch op {
	case "add":
		return x.i + y.i, nil
	case "subtract":
		return x.i - y.i, nil
	case "multiply":
		return x.i * y.i, nil
	case "divide":
		return x.i / y.i, nil
	}
	return x.i % y.i, nil
}

// extremum returns the smaller (minimum) or larger (maximum) of a and b in
// its own type; b on a tie.
func extremum(op string, a, b any) (any, error) {
	x, y, err := numbers(op, a, b)
	if err != nil {
		return nil, err
	}
	var less bool // x < y
	switch {
	case x.kind == 'f' || y.kind == 'f':
		less = x.f < y.f
	case x.kind == 'u' && y.kind == 'u':
		less = x.u < y.u
	default:
		less = x.i < y.i
	}
	var greater bool
	switch {
	case x.kind == 'f' || y.kind == 'f':
		greater = x.f > y.f
	case x.kind == 'u' && y.kind == 'u':
		greater = x.u > y.u
	default:
		greater = x.i > y.i
	}
	if (op == "minimum" && less) || (op == "maximum" && greater) {
		return x.value(), nil
	}
	return y.value(), nil
}
