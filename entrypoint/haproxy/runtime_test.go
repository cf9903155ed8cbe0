package haproxy

import (
	"slices"
	"testing"
)

// Captured from HAProxy 2.6 after "set server b/s2 addr 127.0.0.1 port
// 19002", "weight 5", "state ready" on a server disabled in the
// configuration, and "state drain" on s1.
const serversState26 = `1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
2 b 1 s1 127.0.0.1 0 8 1 1 0 8 2 0 6 0 0 0 - 19001 - 0 0 - - 0
2 b 2 s2 127.0.0.1 2 4 5 1 1 1 0 2 6 0 0 0 - 19002 - 0 0 - - 0
3 c 1 s1 127.0.0.1 0 5 1 1 0 8 2 0 6 0 0 0 - 1 - 0 0 - - 0

`

func TestParseServersState(t *testing.T) {
	got, err := ParseServersState(serversState26)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		be, srv, mode string
		port, weight  int
	}{
		{"b", "s1", "drain", 19001, 1},
		{"b", "s2", "ready", 19002, 5}, // configured disabled, set ready
		{"c", "s1", "maint", 1, 1},     // configured disabled
	}
	if len(got) != len(want) {
		t.Fatalf("%d servers, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Backend != w.be || g.Server != w.srv || g.Mode() != w.mode || g.Port != w.port || g.Weight != w.weight {
			t.Errorf("server %d = %+v (mode %s), want %+v", i, g, g.Mode(), w)
		}
	}
	if _, err := ParseServersState("Unknown command\n"); err == nil {
		t.Error("an error answer parsed")
	}
}

// Answers end with an empty line; one with nothing to say is that line
// alone (as HAProxy 2.6-3.2 answer `set server` that worked).
func TestSplitAnswers(t *testing.T) {
	out := "\nNo such server.\n\n\n1\n# be_id be_name\n2 web 1 s1\n\nCan't find backend.\n\n"
	want := []string{"", "No such server.\n", "", "1\n# be_id be_name\n2 web 1 s1\n", "Can't find backend.\n"}
	if got := splitAnswers(out); !slices.Equal(got, want) {
		t.Errorf("splitAnswers(%q) = %q, want %q", out, got, want)
	}
	if got := splitAnswers(""); len(got) != 0 {
		t.Errorf("no output: %q", got)
	}
}
