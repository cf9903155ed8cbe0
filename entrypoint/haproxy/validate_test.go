package haproxy

import (
	"reflect"
	"testing"
)

func TestCleanEnv(t *testing.T) {
	in := []string{"PATH=/bin", "HAPROXY_MWORKER_REEXEC=1", "HAPROXY_STARTUPLOGS_FD=5",
		"HAPROXY_MWORKER=1", "HAPROXY_LOCALPEER=x", "BACKEND_PORT=80", "MY_HAPROXY_MWORKER=keep",
		"HAPROXY_CLIENT_TIMEOUT=30s"}
	want := []string{"PATH=/bin", "BACKEND_PORT=80", "MY_HAPROXY_MWORKER=keep", "HAPROXY_CLIENT_TIMEOUT=30s"}
	if got := CleanEnv(in); !reflect.DeepEqual(got, want) {
		t.Errorf("CleanEnv = %q, want %q", got, want)
	}
}

func TestAlerts(t *testing.T) {
	out := `[NOTICE]   (1) : haproxy version is 2.6.12
[ALERT]    (1443) : config : parsing [h.cfg:12] : unknown keyword 'bogus' in 'frontend' section
[WARNING]  (1443) : something harmless
[ALERT]    (1443) : config : Fatal errors found in configuration.
`
	want := []string{
		"config : parsing [h.cfg:12] : unknown keyword 'bogus' in 'frontend' section",
		"config : Fatal errors found in configuration.",
	}
	if got := Alerts(out); !reflect.DeepEqual(got, want) {
		t.Errorf("Alerts = %q, want %q", got, want)
	}
}
