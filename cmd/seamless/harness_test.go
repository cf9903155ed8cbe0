package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// The tests in this package run the real seamless binary around the real
// HAProxy: what a reload drops or keeps is HAProxy's to decide.

var seamlessBin string

func TestMain(m *testing.M) {
	// The HTTPS frontend's default :443 would be shared by every test:
	// the tests that serve HTTPS bind a free port of their own.
	os.Setenv("SEAMLESS_HTTPS_BIND", "")
	testenv.RunWithSeamless(m, ".", &seamlessBin)
}

// backend is an HTTP server in the test process: "/" answers at once,
// "/slow?ms=N" after N milliseconds and reports on started when it begins.
type backend struct {
	addr    string
	started chan string
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	b := &backend{started: make(chan string, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case b.started <- r.URL.RawQuery:
		default:
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			io.WriteString(w, "slow ok\n")
		case <-r.Context().Done():
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	b.addr = ln.Addr().String()
	return b
}

// site is a HAProxy configuration whose version the tests can change and
// observe: /version answers the number of the config that served it.
type site struct {
	path     string
	port     int
	backend  string
	global   string // extra lines for the global section
	extraFE  string
	tail     string // sections after the backend
	noIdleKA bool
}

func (s *site) write(t testing.TB, version int) {
	t.Helper()
	idle := "    option idle-close-on-response\n"
	if s.noIdleKA {
		idle = ""
	}
	cfg := fmt.Sprintf(`global
    log stderr format raw local0 notice
%sdefaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
%sfrontend fe
    bind 127.0.0.1:%d
%s    http-request return status 200 content-type text/plain string "v%d" if { path /version }
    default_backend be
backend be
    server s1 %s
%s`, s.global, idle, s.port, s.extraFE, version, s.backend, s.tail)
	writeAtomic(t, s.path, cfg)
}

// writeAtomic replaces a file the way a template renderer would.
func writeAtomic(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newSite(t *testing.T, be *backend) *site {
	return &site{path: filepath.Join(t.TempDir(), "haproxy.cfg"), port: testenv.FreePort(t), backend: be.addr}
}

func (s *site) addr() string { return testenv.Addr(s.port) }

// syncBuffer collects a process's output for failure messages and greps.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// instance is a running seamless.
type instance struct {
	t      *testing.T
	cmd    *exec.Cmd
	pid    int // seamless's pid as seen from here (PID 1 inside a namespace)
	status string
	runDir string
	out    *syncBuffer
	exited chan struct{}
	code   int
}

type startOpts struct {
	pid1 bool     // run as PID 1 of a new PID namespace
	env  []string // extra SEAMLESS_* variables
	args []string // defaults to "haproxy -f <site>"
	wrap []string // a command that execs seamless (prlimit ...)
}

func startSeamless(t *testing.T, s *site, o startOpts) *instance {
	t.Helper()
	in := &instance{t: t, runDir: filepath.Join(t.TempDir(), "run"), out: &syncBuffer{}, exited: make(chan struct{})}
	in.status = testenv.Addr(testenv.FreePort(t))
	args := o.args
	if args == nil {
		args = []string{"haproxy", "-f", s.path}
	}
	argv := append(append(append([]string{}, o.wrap...), seamlessBin), args...)
	if o.pid1 {
		argv = append([]string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"}, argv...)
	}
	in.cmd = exec.Command(argv[0], argv[1:]...)
	in.cmd.Env = append(os.Environ(), "SEAMLESS_RUN_DIR="+in.runDir, "SEAMLESS_STATUS_ADDR="+in.status,
		"SEAMLESS_LOG_LEVEL=debug")
	in.cmd.Env = append(in.cmd.Env, o.env...)
	in.cmd.Stdout, in.cmd.Stderr = in.out, in.out
	// Killed with the test process, whose cleanup a timeout's panic
	// skips; seamless's own parent-death signal then stops HAProxy.
	in.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = in.cmd.Wait()
		in.code = in.cmd.ProcessState.ExitCode()
		close(in.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-in.exited:
		default:
			// A graceful stop first: the test then also shows that
			// seamless takes HAProxy down with it.
			_ = syscall.Kill(in.pid, syscall.SIGTERM)
			select {
			case <-in.exited:
			case <-time.After(20 * time.Second):
				t.Errorf("seamless did not stop within 20s of SIGTERM")
				_ = syscall.Kill(-in.cmd.Process.Pid, syscall.SIGKILL)
				<-in.exited
			}
		}
		testenv.Eventually(t, 10*time.Second, "no HAProxy outlives seamless", func() bool {
			return len(procfs.Mentioning(in.runDir)) == 0
		})
		if t.Failed() {
			t.Logf("seamless output:\n%s", in.out.String())
		}
	})
	in.pid = in.cmd.Process.Pid
	if o.pid1 {
		testenv.Eventually(t, 10*time.Second, "seamless started inside the namespace", func() bool {
			kids := procfs.Children(in.cmd.Process.Pid)
			if len(kids) == 1 {
				in.pid = kids[0].Pid
				return true
			}
			return false
		})
	}
	return in
}

// serving starts a backend and seamless in front of it with config
// version v, and waits until it serves.
func serving(t *testing.T, v int, o startOpts) (*backend, *site, *instance) {
	t.Helper()
	be := startBackend(t)
	s := newSite(t, be)
	s.write(t, v)
	in := startSeamless(t, s, o)
	in.waitReady(s)
	return be, s, in
}

// waitReady waits until /healthz is 200 and the frontend answers.
func (in *instance) waitReady(s *site) {
	in.t.Helper()
	testenv.Eventually(in.t, 20*time.Second, "seamless healthy and serving", func() bool {
		select {
		case <-in.exited:
			in.t.Fatalf("seamless exited with %d before it was ready", in.code)
		default:
		}
		code, _ := testenv.Get("http://" + in.status + "/healthz")
		if code != 200 {
			return false
		}
		code, _ = testenv.Get("http://" + s.addr() + "/version")
		return code == 200
	})
}

func (in *instance) signal(sig syscall.Signal) {
	in.t.Helper()
	if err := syscall.Kill(in.pid, sig); err != nil {
		in.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait returns seamless's exit code, failing after timeout.
func (in *instance) wait(timeout time.Duration) int {
	in.t.Helper()
	select {
	case <-in.exited:
		return in.code
	case <-time.After(timeout):
		in.t.Fatalf("seamless did not exit within %s", timeout)
		return -1
	}
}

// metric reads one sample from /metrics.
func (in *instance) metric(name string) float64 {
	in.t.Helper()
	return testenv.Metric(in.t, in.status, name)
}

const (
	successes = `seamless_reloads_total{result="success"}`
	failures  = `seamless_reloads_total{result="failure"}`
)

func (in *instance) cli() *haproxy.MasterCLI {
	return haproxy.NewMasterCLI(filepath.Join(in.runDir, "master.sock"))
}

func (in *instance) showProc() haproxy.Procs {
	in.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := in.cli().WaitShowProc(ctx, haproxy.Procs.HasWorkers)
	if err != nil {
		in.t.Fatal(err)
	}
	return p
}

// version asks the frontend which config version serves it.
func served(s *site) string {
	_, body := testenv.Get("http://" + s.addr() + "/version")
	return body
}
