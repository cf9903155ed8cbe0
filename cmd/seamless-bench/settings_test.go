package main

import "testing"

func TestEnvFlagTakesSeamlessAndGoRuntimeVariablesOnly(t *testing.T) {
	for _, tc := range []struct {
		arg string
		ok  bool
	}{
		{"SEAMLESS_WAIT=0", true},
		{"GOMEMLIMIT=224MiB", true},
		{"GOGC=50", true},
		{"GOMAXPROCS=2", true},
		{"GODEBUG=gctrace=1", false},
		{"CONSUL_HTTP_TOKEN=x", false},
		{"SEAMLESS_WAIT", false},
	} {
		var e envFlag
		err := e.Set(tc.arg)
		if (err == nil) != tc.ok {
			t.Errorf("Set(%q) = %v, want ok %v", tc.arg, err, tc.ok)
			continue
		}
		if tc.ok && len(e) != 1 {
			t.Errorf("Set(%q) kept %v, want one variable", tc.arg, e)
		}
	}
}
