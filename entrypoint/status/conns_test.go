package status

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/metrics"
)

// childFDs is the descriptor limit of the status server under test: the
// field test's, where held connections starved /healthz and haproxy -c.
const childFDs = 256

// TestHelperStatusServer is the server of TestHealthzAnswersWhileIdle-
// ConnectionsAreHeld, in a process of its own with its descriptors
// limited to childFDs; it prints its address and serves until stdin
// closes.
func TestHelperStatusServer(t *testing.T) {
	if os.Getenv("SEAMLESS_STATUS_TEST_CHILD") != "1" {
		t.Skip("run by TestHealthzAnswersWhileIdleConnectionsAreHeld")
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: childFDs, Max: childFDs}); err != nil {
		t.Fatal(err)
	}
	ok := func() error { return nil }
	srv, err := Listen("127.0.0.1:0", metrics.New().Registry, ok, ok, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		cancel()
	}()
	fmt.Println("addr", srv.Addr())
	if err := srv.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// 1,000 idle connections, four times the server's descriptors, must not
// keep /healthz from answering.
func TestHealthzAnswersWhileIdleConnectionsAreHeld(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStatusServer$", "-test.v")
	cmd.Env = append(os.Environ(), "SEAMLESS_STATUS_TEST_CHILD=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	lines := bufio.NewScanner(out)
	var addr string
	for lines.Scan() {
		if a, ok := strings.CutPrefix(lines.Text(), "addr "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		t.Fatal("the server did not start")
	}
	go func() {
		for lines.Scan() { // drain, so that the child never blocks on its output
		}
	}()

	const idle = 1000
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range idle {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("after %d connections: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 3 {
		resp, err := client.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("probe %d with %d idle connections held: %v", i, idle, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe %d: status %d", i, resp.StatusCode)
		}
	}
}

// At the cap, an idle connection makes room; one serving a request is
// left alone.
func TestCapClosesIdleConnectionsNotActiveOnes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &capListener{Listener: ln, max: 2, log: slog.New(slog.DiscardHandler)}
	release, started := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		fmt.Fprint(w, "slow")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	srv := &http.Server{Handler: mux, ConnState: cl.connState}
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })

	slow := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		slow <- err
	}()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow request did not start")
	}
	idleConn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idleConn.Close()
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatalf("probe at the cap: %v", err)
	}
	resp.Body.Close()
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("the active connection was closed to make room: %v", err)
	}
	idleConn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := idleConn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the idle connection was not closed: %v", err)
	}
}
