package loadgen

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// With TLS, each connection shakes hands (one per request in NewConn
// mode), the Host header is the server name, and a server that does not
// speak TLS is a handshake failure.
func TestTLS(t *testing.T) {
	var conns atomic.Int64
	var host atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host.Store(r.Host)
		io.WriteString(w, "ok\n")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := &tls.Config{ServerName: "shop.test", InsecureSkipVerify: true}
	l := start(t, Config{Target: srv.Listener.Addr().String(), Mode: NewConn, Workers: 1, MaxRequests: 10, TLS: cfg})
	r := waitDone(t, l, 20*time.Second)
	if r.Requests != 10 || r.Failed != 0 || r.LastBody != "ok" {
		t.Errorf("over TLS: requests=%d failed=%d errors=%v body %q, want 10 ok", r.Requests, r.Failed, r.Errors, r.LastBody)
	}
	if conns.Load() != 10 || host.Load() != "shop.test" {
		t.Errorf("server saw %d connections, Host %q; want 10 and shop.test", conns.Load(), host.Load())
	}

	plain, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	l = start(t, Config{Target: plain, Mode: KeepAlive, Workers: 1, MaxRequests: 3, TLS: cfg})
	r = waitDone(t, l, 20*time.Second)
	if r.Failed != 3 || len(r.Errors) != 1 {
		t.Fatalf("TLS to a plain HTTP server: failed=%d errors=%v, want 3 handshake failures", r.Failed, r.Errors)
	}
	for class := range r.Errors {
		if !strings.HasPrefix(class, "handshake: ") {
			t.Errorf("failure class %q, want handshake: ...", class)
		}
	}
}
