package routes

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// SEAMLESS_PASSIVE_CHECKS: a backend that stops listening before the
// catalog says so (it crashed, or it stopped while seamless still
// debounced, checked and reloaded its removal) costs a retry, not a
// request. The first refused connection takes its server out of rotation
// and the request goes to another; HAProxy's checks alone need three
// failures, and a redispatch can land on another dead server: with three
// of five servers refusing, 11–27 of 4,000 keep-alive requests got a 503
// without the option.
func TestARefusingServerCostsARetryNotARequest(t *testing.T) {
	testenv.HAProxy(t)
	var insts []model.Instance
	for _, id := range []string{"live1", "live2"} {
		addr, port := backend(t, id)
		insts = append(insts, inst("web", id, addr, port, "seamless.http.host=127.0.0.1"))
	}
	for i, p := range testenv.FreePorts(t, 3) { // nothing listens there
		insts = append(insts, inst("web", "dead"+string(rune('1'+i)), "127.0.0.1", p, "seamless.http.host=127.0.0.1"))
	}
	front := testenv.Addr(testenv.FreePort(t))
	out := render(t, mustNew(t, Options{HTTPBind: front, PassiveChecks: true}), catalog(insts...))
	haproxyCheck(t, out.Config)
	startHAProxy(t, out.Config)
	testenv.Eventually(t, 10*time.Second, "HAProxy serves the service", func() bool {
		code, _ := get(front, "127.0.0.1", "/")
		return code == http.StatusOK
	})

	for _, m := range []loadgen.Mode{loadgen.KeepAlive, loadgen.NewConn} {
		l, err := loadgen.Start(context.Background(), loadgen.Config{
			Target: front, Mode: m, Workers: 4, MaxRequests: 4000, MaxDuration: 3 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		<-l.Done()
		r := l.Snapshot()
		t.Logf("%s: %d requests, %d failed %v", m, r.Requests, r.Failed, r.Errors)
		if r.Failed != 0 {
			t.Errorf("%s: %d of %d requests failed: %v", m, r.Failed, r.Requests, r.Errors)
		}
	}
}

// Without checks nothing would bring a server back that its traffic took
// out of rotation: the option then renders nothing (config refuses the
// pair at start; a library caller gets plain servers).
func TestPassiveChecksWithoutChecksRenderNoObserve(t *testing.T) {
	out := render(t, mustNew(t, Options{HTTPBind: ":80", PassiveChecks: true, NoHealthChecks: true}),
		catalog(inst("web", "web1", "10.0.0.1", 80, "seamless.http.host=a.example")))
	if hasCheck(out.Config) || bytes.Contains(out.Config, []byte("observe")) {
		t.Fatalf("a server is checked or observed:\n%s", out.Config)
	}
}
