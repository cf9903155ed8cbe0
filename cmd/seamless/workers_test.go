package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// seamless_haproxy_workers{generation="old"} follows the old workers out:
// the last one exits when its last request ends, long after the reload
// that counted it, and no reload happens then to count again.
func TestOldWorkersGaugeFollowsTheirExit(t *testing.T) {
	be, s, in := serving(t, 1, startOpts{})
	result := slowRequest(t, s, 1500)
	receive(t, be.started, "slow request reached the backend")
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 20*time.Second, "the reload counts one old worker", func() bool {
		v, ok := metricIfAny(in, `seamless_haproxy_workers{generation="old"}`)
		return ok && v == 1
	})
	if r := receive(t, result, "in-flight request answered"); r != "200 slow ok" {
		t.Fatalf("in-flight request: %s", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := in.cli().WaitShowProc(ctx, func(p haproxy.Procs) bool { return len(p.Old) == 0 }); err != nil {
		t.Fatal(err)
	}
	if v := in.metric(`seamless_haproxy_workers{generation="old"}`); v != 0 {
		t.Errorf(`seamless_haproxy_workers{generation="old"} = %v after the old worker exited, want 0`, v)
	}
	if v := in.metric(`seamless_haproxy_workers{generation="current"}`); v != 1 {
		t.Errorf(`seamless_haproxy_workers{generation="current"} = %v, want 1`, v)
	}
}

// metricIfAny reads one sample from /metrics; ok is false while it is
// not exported yet.
func metricIfAny(in *instance, name string) (v float64, ok bool) {
	code, body := testenv.Get("http://" + in.status + "/metrics")
	if code != http.StatusOK {
		return 0, false
	}
	for line := range strings.Lines(body) {
		if s, found := strings.CutPrefix(strings.TrimSpace(line), name+" "); found {
			f, err := strconv.ParseFloat(s, 64)
			return f, err == nil
		}
	}
	return 0, false
}
