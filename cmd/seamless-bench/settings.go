package main

import (
	"fmt"
	"slices"
	"strings"
)

// variant is one value of a SEAMLESS_* variable that the rows of a
// discovery benchmark run seamless with: set, or left at the binary's
// default (which `seamless env` tells).
type variant struct {
	name  string // SEAMLESS_WAIT
	value string // what seamless runs with
	set   bool   // false: the binary's default, not passed
}

// label is what the tables show: the value, marked when it is the default.
func (v variant) label() string {
	switch {
	case v.set:
		return v.value
	case v.value == "":
		return "(default)"
	}
	return v.value + " (default)"
}

// parseVariants reads a comma-separated flag value such as "default,0"
// for the variable name. "default" is the binary's own value; a variable
// the binary does not know can only be left at its (absent) default.
func parseVariants(name, list string, defaults map[string]string) ([]variant, error) {
	def, known := defaults[name]
	var out []variant
	for v := range strings.SplitSeq(list, ",") {
		switch v = strings.TrimSpace(v); {
		case v == "default":
			out = append(out, variant{name: name, value: def})
		case !known:
			return nil, fmt.Errorf("this seamless has no %s (see `seamless env`); use default", name)
		case v == "":
			return nil, fmt.Errorf("%s: empty value in %q", name, list)
		default:
			out = append(out, variant{name: name, value: v, set: true})
		}
	}
	return out, nil
}

// envFlag collects -env NAME=VALUE flags: seamless's own variables and
// the Go runtime's memory and processor settings, which go to seamless
// alone (set in the benchmark's environment they would reach Consul and
// the peers too).
type envFlag map[string]string

// goRuntimeEnv are the Go runtime's variables -env takes.
var goRuntimeEnv = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS"}

func (e *envFlag) String() string { return fmt.Sprint(map[string]string(*e)) }

func (e *envFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || !strings.HasPrefix(name, "SEAMLESS_") && !slices.Contains(goRuntimeEnv, name) {
		return fmt.Errorf("%q is not SEAMLESS_NAME=VALUE, GOGC=VALUE, GOMEMLIMIT=VALUE or GOMAXPROCS=VALUE", s)
	}
	if *e == nil {
		*e = envFlag{}
	}
	(*e)[name] = value
	return nil
}

// rowEnv is the environment a row passes to seamless: extra (-env), then
// the variants it sets.
func rowEnv(extra envFlag, vs ...variant) map[string]string {
	env := map[string]string{}
	for k, v := range extra {
		env[k] = v
	}
	for _, v := range vs {
		if v.set {
			env[v.name] = v.value
		}
	}
	return env
}
