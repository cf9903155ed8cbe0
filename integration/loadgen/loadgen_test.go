package loadgen

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// rawServer serves each accepted connection with handle until the test ends.
func rawServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// waitDone fails the test if the run does not end on its own in time.
func waitDone(t *testing.T, l *Load, within time.Duration) Result {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(within):
		l.Stop()
		t.Fatalf("run did not end within %v", within)
	}
	return l.Stop()
}

func start(t *testing.T, cfg Config) *Load {
	t.Helper()
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = 30 * time.Second
	}
	l, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Stop() })
	return l
}

func TestIdleCloseAsClientSendsIsAFailure(t *testing.T) {
	tests := []struct {
		name  string
		reset bool // close with RST instead of FIN
		class string
	}{
		{"server closes with FIN", false, "EOF"},
		{"server closes with RST", true, "read: connection reset by peer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var requests, conns atomic.Int64
			// Answer one request per connection as if keeping it alive,
			// then take the next request and close instead of answering:
			// what an old worker does to an idle connection at soft-stop.
			addr := rawServer(t, func(c net.Conn) {
				conns.Add(1)
				br := bufio.NewReader(c)
				for i := range 2 {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					requests.Add(1)
					if i == 0 {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					}
				}
				if tt.reset {
					c.(*net.TCPConn).SetLinger(0)
				}
			})
			l := start(t, Config{Target: addr, Mode: KeepAlive, Workers: 1, MaxRequests: 10})
			r := waitDone(t, l, 20*time.Second)

			if r.Requests != 10 || r.Failed != 5 || r.Errors[tt.class] != 5 {
				t.Errorf("got requests=%d failed=%d errors=%v, want 10, 5, {%s:5}",
					r.Requests, r.Failed, r.Errors, tt.class)
			}
			// Exactly one request on the wire per attempt: nothing retried.
			if got := requests.Load(); got != 10 {
				t.Errorf("server saw %d requests, want 10 (a retry happened?)", got)
			}
			if got := conns.Load(); got != 5 {
				t.Errorf("server saw %d connections, want 5", got)
			}
		})
	}
}

// countingServer is an httptest server that counts new connections.
func countingServer(t *testing.T, h http.HandlerFunc) (string, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), &conns
}

func TestConnections(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }
	closing := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "ok\n")
	}
	tests := []struct {
		name      string
		mode      Mode
		handler   http.HandlerFunc
		wantConns int64
	}{
		{"keep-alive reuses one connection", KeepAlive, ok, 1},
		{"Connection: close answers redial and are not failures", KeepAlive, closing, 20},
		{"new connection per request", NewConn, ok, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, conns := countingServer(t, tt.handler)
			l := start(t, Config{Target: addr, Mode: tt.mode, Workers: 1, MaxRequests: 20})
			r := waitDone(t, l, 20*time.Second)
			if r.Requests != 20 || r.Failed != 0 {
				t.Errorf("requests=%d failed=%d errors=%v, want 20 and 0", r.Requests, r.Failed, r.Errors)
			}
			if got := conns.Load(); got != tt.wantConns {
				t.Errorf("server saw %d connections, want %d", got, tt.wantConns)
			}
			if r.LastBody != "ok" {
				t.Errorf("LastBody = %q, want %q", r.LastBody, "ok")
			}
		})
	}
}

func TestStatus503IsAFailure(t *testing.T) {
	addr, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no server available", http.StatusServiceUnavailable)
	})
	l := start(t, Config{Target: addr, Mode: KeepAlive, Workers: 2, MaxRequests: 10})
	r := waitDone(t, l, 20*time.Second)
	if r.Requests != 10 || r.Failed != 10 || r.Errors["status 503"] != 10 {
		t.Errorf("requests=%d failed=%d errors=%v, want 10, 10, {status 503:10}", r.Requests, r.Failed, r.Errors)
	}
	if r.LastBody != "" {
		t.Errorf("LastBody = %q from a failed response", r.LastBody)
	}
}

// TestFailuresAreTimed: a failure's time places it beside what the test
// did; a run without one has none.
func TestFailuresAreTimed(t *testing.T) {
	var fail atomic.Bool
	addr, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "no server available", http.StatusServiceUnavailable)
		}
	})
	ok := waitDone(t, start(t, Config{Target: addr, Mode: KeepAlive, MaxRequests: 5}), 20*time.Second)
	if ok.Failed != 0 || !ok.FirstFailure.IsZero() || !ok.LastFailure.IsZero() {
		t.Errorf("a run without failures: failed=%d first=%v last=%v", ok.Failed, ok.FirstFailure, ok.LastFailure)
	}
	fail.Store(true)
	before := time.Now()
	r := waitDone(t, start(t, Config{Target: addr, Mode: KeepAlive, Workers: 2, MaxRequests: 6}), 20*time.Second)
	after := time.Now()
	if r.Failed != 6 {
		t.Fatalf("failed=%d, want 6", r.Failed)
	}
	if r.FirstFailure.Before(before) || r.LastFailure.After(after) || !r.LastFailure.After(r.FirstFailure) {
		t.Errorf("failures between %v and %v, want within %v..%v, the last after the first", r.FirstFailure, r.LastFailure, before, after)
	}
}

func TestConnectRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	l := start(t, Config{Target: addr, Mode: NewConn, Workers: 1, MaxRequests: 3})
	r := waitDone(t, l, 20*time.Second)
	if r.Failed != 3 || r.Errors["connect: connection refused"] != 3 {
		t.Errorf("failed=%d errors=%v, want 3 x connect: connection refused", r.Failed, r.Errors)
	}
}

func TestMaxRequestsIsExact(t *testing.T) {
	addr, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {})
	l := start(t, Config{Target: addr, Mode: KeepAlive, Workers: 8, MaxRequests: 500})
	r := waitDone(t, l, 20*time.Second)
	if r.Requests != 500 || r.Failed != 0 {
		t.Errorf("requests=%d failed=%d, want 500 and 0", r.Requests, r.Failed)
	}
}

func TestMaxDurationEndsTheRun(t *testing.T) {
	addr, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {})
	l := start(t, Config{Target: addr, Mode: KeepAlive, Workers: 2,
		MaxRequests: 1 << 40, MaxDuration: 100 * time.Millisecond})
	r := waitDone(t, l, 20*time.Second)
	if r.Elapsed < 100*time.Millisecond || r.Requests == 0 || r.Failed != 0 {
		t.Errorf("elapsed=%v requests=%d failed=%d, want >= 100ms, > 0, 0", r.Elapsed, r.Requests, r.Failed)
	}
}

func TestStopAbandonsRequestsInFlight(t *testing.T) {
	received := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	addr := rawServer(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		received <- struct{}{}
		<-release // never answer
	})
	l := start(t, Config{Target: addr, Mode: KeepAlive, Workers: 1, MaxRequests: 1, Timeout: time.Minute})
	<-received
	stopped := make(chan Result)
	go func() { stopped <- l.Stop() }()
	select {
	case r := <-stopped:
		if r.Requests != 0 || r.Failed != 0 {
			t.Errorf("requests=%d failed=%d, want the abandoned request not counted", r.Requests, r.Failed)
		}
		if again := l.Stop(); again.Requests != r.Requests || again.Elapsed != r.Elapsed {
			t.Errorf("second Stop = %+v, want %+v", again, r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not interrupt a blocked read")
	}
}

func TestStartValidates(t *testing.T) {
	ok := Config{Target: "127.0.0.1:80", MaxRequests: 1, MaxDuration: time.Second}
	tests := []struct {
		name   string
		change func(*Config)
		valid  bool
	}{
		{"loopback IPv4", func(c *Config) {}, true},
		{"any 127/8 address", func(c *Config) { c.Target = "127.0.0.2:80" }, true},
		{"loopback IPv6", func(c *Config) { c.Target = "[::1]:80" }, true},
		{"remote address", func(c *Config) { c.Target = "192.0.2.1:80" }, false},
		{"unspecified address", func(c *Config) { c.Target = "0.0.0.0:80" }, false},
		{"host name", func(c *Config) { c.Target = "localhost:80" }, false},
		{"no port", func(c *Config) { c.Target = "127.0.0.1" }, false},
		{"no request bound", func(c *Config) { c.MaxRequests = 0 }, false},
		{"no duration bound", func(c *Config) { c.MaxDuration = 0 }, false},
		{"unknown mode", func(c *Config) { c.Mode = 7 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.change(&cfg)
			_, err := validate(cfg)
			if (err == nil) != tt.valid {
				t.Errorf("validate(%+v) error = %v, want valid=%v", cfg, err, tt.valid)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080},
			Err: &os.SyscallError{Syscall: op, Err: err}}
	}
	tests := []struct {
		phase string
		err   error
		want  string
	}{
		{"connect", opErr("dial", syscall.ECONNREFUSED), "connect: connection refused"},
		{"read", opErr("read", syscall.ECONNRESET), "read: connection reset by peer"},
		{"write", opErr("write", syscall.EPIPE), "write: broken pipe"},
		{"read", io.EOF, "EOF"},
		{"read body", fmt.Errorf("body: %w", io.ErrUnexpectedEOF), "unexpected EOF"},
		{"read", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "read: timeout"},
		{"read", errors.New(`malformed HTTP status code "xyz"`), "read: malformed response"},
		{"connect", &net.OpError{Op: "dial", Err: errors.New("lookup 10.0.0.1:99 failed")}, "connect: lookup _ failed"},
	}
	for _, tt := range tests {
		if got := classify(tt.phase, tt.err); got != tt.want {
			t.Errorf("classify(%q, %v) = %q, want %q", tt.phase, tt.err, got, tt.want)
		}
	}
}
