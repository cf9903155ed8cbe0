// Package demo holds the test of `make demo` (demo/run.sh), run as a user
// runs it: in a terminal, stopped with Ctrl-C.
package demo

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/seamless-lb/seamless/internal/testenv"
)

var bin string // directory with seamless and demo-backend

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "seamless-demo-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	for _, pkg := range []string{"seamless", "demo-backend"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, pkg), "../cmd/"+pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// openPTY returns the master and the terminal of a new pseudo-terminal.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal("unlockpt:", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal("ptsname:", err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// syncBuffer is the terminal's output, read while the demo runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The demo in a terminal: a 3 s request is in flight through HAProxy when
// the user presses Ctrl-C. The request completes, then everything stops:
// seamless, HAProxy and the backends (README: "Ctrl-C drains and stops").
func TestCtrlCDrainsAndStops(t *testing.T) {
	testenv.HAProxy(t)
	ports := testenv.FreePorts(t, 6)
	httpPort, statsPort, statusPort := ports[0], ports[1], ports[2]
	backends := ports[3:]

	// demo/haproxy.cfg on free ports.
	cfg, err := os.ReadFile("haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer(":5001", ":"+strconv.Itoa(httpPort), ":8404", ":"+strconv.Itoa(statsPort),
		":9001", ":"+strconv.Itoa(backends[0]), ":9002", ":"+strconv.Itoa(backends[1]), ":9003", ":"+strconv.Itoa(backends[2]))
	tmp := t.TempDir()
	cfgPath := filepath.Join(tmp, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(r.Replace(string(cfg))), 0o644); err != nil {
		t.Fatal(err)
	}

	master, tty := openPTY(t)
	defer master.Close()
	cmd := exec.Command("./run.sh")
	cmd.Env = append(os.Environ(),
		"DEMO_BIN_DIR="+bin, "DEMO_CONFIG="+cfgPath, "DEMO_RUN_DIR="+filepath.Join(tmp, "run"),
		"DEMO_PIDFILE="+filepath.Join(tmp, "demo.pid"), "DEMO_STATUS_ADDR="+testenv.Addr(statusPort),
		fmt.Sprintf("DEMO_BACKEND_PORTS=%d %d %d", backends[0], backends[1], backends[2]))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	// As a shell starts a command in a terminal: a session of its own with
	// the terminal as its controlling terminal, in the foreground.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var out syncBuffer
	copied := make(chan struct{})
	go func() { defer close(copied); io.Copy(&out, master) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil { // still running: end the session
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("terminal:\n%s", out.String())
		}
	}()

	web := "http://" + testenv.Addr(httpPort)
	testenv.Eventually(t, 20*time.Second, "the demo serves", func() bool {
		code, _ := testenv.Get(web + "/")
		return code == http.StatusOK
	})

	type result struct {
		code int
		body string
		err  error
	}
	slow := make(chan result, 1)
	go func() {
		c := http.Client{Timeout: 20 * time.Second}
		resp, err := c.Get(web + "/slow?ms=3000")
		if err != nil {
			slow <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		slow <- result{code: resp.StatusCode, body: string(b), err: err}
	}()
	// In flight once HAProxy counts a session on the web frontend.
	stats := "http://" + testenv.Addr(statsPort) + "/haproxy?stats;csv"
	testenv.Eventually(t, 10*time.Second, "the slow request reaches HAProxy", func() bool {
		_, body := testenv.Get(stats)
		for line := range strings.Lines(body) {
			if f := strings.Split(line, ","); len(f) > 4 && f[0] == "web" && f[1] == "FRONTEND" {
				n, _ := strconv.Atoi(f[4])
				return n > 0
			}
		}
		return false
	})

	if _, err := master.Write([]byte{0x03}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	pressed := time.Now()

	select {
	case r := <-slow:
		if r.err != nil || r.code != http.StatusOK || !strings.Contains(r.body, "after 3000ms") {
			t.Errorf("the request in flight at Ctrl-C: %d %q %v", r.code, r.body, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the slow request did not end")
	}
	select {
	case err := <-exited:
		t.Logf("the demo exited %v, %s after Ctrl-C", err, time.Since(pressed).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("the demo did not exit within 20s of Ctrl-C")
	}
	// Nothing is left listening: HAProxy, seamless, the backends.
	for _, p := range ports[:6] {
		if code, _ := testenv.Get("http://" + testenv.Addr(p) + "/"); code != 0 {
			t.Errorf("port %d still answers after the demo stopped", p)
		}
	}
}
