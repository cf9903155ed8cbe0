package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// These run seamless as PID 1 of a new PID namespace, as in a container.

func requireUnshare(t *testing.T) {
	t.Helper()
	testenv.HAProxy(t)
	if os.Geteuid() != 0 {
		t.Skip("unshare --pid needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed")
	}
}

// orphanMaker is a haproxy that leaves orphans behind every time it runs
// (start-up and every haproxy -c): they are reparented to PID 1, which must
// reap them.
func orphanMaker(t *testing.T) string {
	t.Helper()
	real := testenv.HAProxy(t)
	p := filepath.Join(t.TempDir(), "haproxy-with-orphans")
	script := fmt.Sprintf("#!/bin/sh\n(true &) ; (sleep 0.05 &) ; (exit 3 &)\nexec %s \"$@\"\n", real)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPID1ReapsOrphans(t *testing.T) {
	requireUnshare(t)
	s := newSite(t, startBackend(t))
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{pid1: true, env: []string{"SEAMLESS_HAPROXY_BIN=" + orphanMaker(t)},
		args: []string{"-f", s.path}})
	in.waitReady(s)
	for i := range 20 {
		before := in.metric(successes)
		in.signal(syscall.SIGHUP)
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("reload %d", i), func() bool { return in.metric(successes) > before })
	}
	// 21 runs of the wrapper left 63 orphans, plus HAProxy's old workers.
	testenv.Eventually(t, 10*time.Second, "no zombie in the namespace", func() bool {
		for _, p := range procfs.Descendants(in.pid) {
			if p.Zombie() {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, 10*time.Second, "only the master and one worker left", func() bool {
		return len(procfs.Descendants(in.pid)) == 2
	})
	if !strings.Contains(in.out.String(), "reaped orphan") {
		t.Error("no orphan was reaped by seamless")
	}
	in.signal(syscall.SIGTERM)
	if code := in.wait(15 * time.Second); code != 0 {
		t.Errorf("exit code %d after a clean drain, want 0", code)
	}
}

func TestPID1PropagatesExitCodes(t *testing.T) {
	requireUnshare(t)
	t.Run("master killed by a signal: 128+signal", func(t *testing.T) {
		_, _, in := serving(t, 1, startOpts{pid1: true})
		master := in.showProc().Master.Pid
		// The master's pid inside the namespace; find it from here.
		var hostPid int
		for _, p := range procfs.Children(in.pid) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid)); strings.Contains(string(b), fmt.Sprintf("NSpid:\t%d\t%d", p.Pid, master)) {
				hostPid = p.Pid
			}
		}
		if hostPid == 0 {
			t.Fatalf("master %d not found below seamless", master)
		}
		if err := syscall.Kill(hostPid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if code := in.wait(15 * time.Second); code != 128+9 {
			t.Errorf("exit code %d, want %d", code, 128+9)
		}
		if !strings.Contains(in.out.String(), "haproxy master exited on its own") {
			t.Error("the master's death was not logged")
		}
	})
	t.Run("haproxy refuses to start: its exit code", func(t *testing.T) {
		s := newSite(t, startBackend(t))
		s.extraFE = "    bogus-directive\n"
		s.write(t, 1)
		in := startSeamless(t, s, startOpts{pid1: true})
		if code := in.wait(15 * time.Second); code != 1 {
			t.Errorf("exit code %d, want HAProxy's 1", code)
		}
	})
}

// TestStopSignalsDrainInFlightRequests: SIGTERM (docker stop) and SIGPWR
// (LXC, Incus) let a slow request finish, new connections are refused
// meanwhile, and seamless exits 0 as soon as the drain is done.
func TestStopSignalsDrainInFlightRequests(t *testing.T) {
	requireUnshare(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGPWR} {
		t.Run(sig.String(), func(t *testing.T) {
			be, s, in := serving(t, 1, startOpts{pid1: true, env: []string{"SEAMLESS_STOP_GRACE=30s"}})

			result := slowRequest(t, s, 1500)
			receive(t, be.started, "slow request reached the backend")
			in.signal(sig)
			testenv.Eventually(t, 5*time.Second, "new connections refused while draining", func() bool {
				c, err := net.DialTimeout("tcp", s.addr(), time.Second)
				if err == nil {
					c.Close()
				}
				return err != nil
			})
			if r := receive(t, result, "in-flight request answered"); r != "200 slow ok" {
				t.Errorf("in-flight request got %q, want 200", r)
			}
			if code := in.wait(5 * time.Second); code != 0 {
				t.Errorf("exit code %d after a clean drain, want 0", code)
			}
			if strings.Contains(in.out.String(), "drain did not finish") {
				t.Error("the drain was cut short")
			}
		})
	}
}

// TestTERMDuringAReloadStillDrains: a stop that lands while the master
// re-executes must wait for it; plain HAProxy loses a SIGUSR1 sent then and
// keeps accepting until it is killed.
func TestTERMDuringAReloadStillDrains(t *testing.T) {
	requireUnshare(t)
	be, s, in := serving(t, 1, startOpts{pid1: true, env: []string{"SEAMLESS_STOP_GRACE=30s"}})

	result := slowRequest(t, s, 1500)
	receive(t, be.started, "slow request reached the backend")
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 10*time.Second, "reload sent to the master", func() bool {
		return strings.Contains(in.out.String(), "configuration valid, reloading")
	})
	in.signal(syscall.SIGTERM)
	if r := receive(t, result, "in-flight request answered"); r != "200 slow ok" {
		t.Errorf("in-flight request got %q, want 200", r)
	}
	if code := in.wait(10 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if strings.Contains(in.out.String(), "drain did not finish") {
		t.Error("the drain was cut short")
	}
}

// receive waits for one value, failing the test instead of hanging.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting: %s", what)
		var zero T
		return zero
	}
}

// TestDrainIsBounded: a request longer than SEAMLESS_STOP_GRACE is cut and
// seamless still exits, well before a container runtime would SIGKILL it.
func TestDrainIsBounded(t *testing.T) {
	requireUnshare(t)
	be, s, in := serving(t, 1, startOpts{pid1: true, env: []string{"SEAMLESS_STOP_GRACE=500ms"}})

	result := slowRequest(t, s, 60_000)
	receive(t, be.started, "slow request reached the backend")
	begin := time.Now()
	in.signal(syscall.SIGTERM)
	in.wait(15 * time.Second)
	if d := time.Since(begin); d > 10*time.Second {
		t.Errorf("took %s to stop with a 500ms grace", d)
	}
	if r := receive(t, result, "cut request ended"); strings.HasPrefix(r, "200") {
		t.Errorf("a request longer than the grace completed: %q", r)
	}
	if !strings.Contains(in.out.String(), "drain did not finish") {
		t.Error("the cut drain was not logged")
	}
}

func slowRequest(t *testing.T, s *site, ms int) <-chan string {
	t.Helper()
	out := make(chan string, 1)
	go func() {
		c := http.Client{Timeout: 90 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://%s/slow?ms=%d", s.addr(), ms))
		if err != nil {
			out <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}()
	return out
}

// slowLua writes a Lua file that makes HAProxy's real loads (not haproxy
// -c) take three seconds, and touches marker when one begins.
func slowLua(t *testing.T) (path, marker string) {
	t.Helper()
	dir := t.TempDir()
	path, marker = filepath.Join(dir, "slow.lua"), filepath.Join(dir, "loading")
	lua := fmt.Sprintf(`if os.getenv("HAPROXY_MWORKER") then os.execute("touch %s; sleep 3") end`, marker)
	if err := os.WriteFile(path, []byte(lua+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, marker
}

func waitFile(t *testing.T, path, what string) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, what, func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
}

// TestStopWhileHAProxyStartsDrains: a stop signal while HAProxy still loads
// its configuration must not kill it with an early SIGUSR1 (exit 138) nor
// leave it serving until the hard stop; and /healthz is not 200 before the
// frontend serves.
func TestStopWhileHAProxyStartsDrains(t *testing.T) {
	requireUnshare(t)
	// Before 3.1 the master loads the configuration before any worker
	// exists, without HAPROXY_MWORKER set, so the slow file cannot single
	// out the real load; from 3.1 the worker loads it while listed.
	out, err := exec.Command(testenv.HAProxy(t), "-v").Output()
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(out)); len(f) < 3 || f[2] < "3.1" {
		t.Skipf("HAProxy %s loads its configuration in the master", f[2])
	}
	lua, loading := slowLua(t)
	s := newSite(t, startBackend(t))
	s.global = "    lua-load " + lua + "\n"
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{pid1: true, env: []string{"SEAMLESS_STOP_GRACE=30s"}})
	waitFile(t, loading, "HAProxy loading its configuration")
	if code, _ := testenv.Get("http://" + in.status + "/healthz"); code == 200 {
		t.Error("/healthz is 200 while HAProxy still loads")
	}
	in.signal(syscall.SIGTERM)
	if code := in.wait(20 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if strings.Contains(in.out.String(), "drain did not finish") {
		t.Error("stopped hard instead of draining")
	}
}

// TestSignalsDuringAReloadAreNotForwarded: a master that re-executes would
// lose a forwarded signal or die of it; seamless holds back and says so.
func TestSignalsDuringAReloadAreNotForwarded(t *testing.T) {
	requireUnshare(t)
	lua, loading := slowLua(t)
	_, s, in := serving(t, 1, startOpts{pid1: true})
	s.global = "    lua-load " + lua + "\n"
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	waitFile(t, loading, "HAProxy busy reloading")
	in.signal(syscall.SIGUSR1)
	testenv.Eventually(t, 10*time.Second, "signal dropped with a warning", func() bool {
		return strings.Contains(in.out.String(), "dropping signal")
	})
	testenv.Eventually(t, 30*time.Second, "the reload completes and serves", func() bool {
		return served(s) == "v2" && in.metric(successes) == 1
	})
	select {
	case <-in.exited:
		t.Fatalf("seamless exited (%d) after a signal during a reload", in.code)
	default:
	}
}

// TestStopDuringStartUpIsNotLost: a `docker stop` while seamless still
// checks the configuration at start-up must become a drain, not Go's
// default exit with status 2.
func TestStopDuringStartUpIsNotLost(t *testing.T) {
	requireUnshare(t)
	wrapper, gate, waiting := gatedHAProxy(t)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSite(t, startBackend(t))
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{pid1: true, env: []string{"SEAMLESS_HAPROXY_BIN=" + wrapper}, args: []string{"-f", s.path}})
	waitFile(t, waiting, "start-up validation held")
	in.signal(syscall.SIGTERM)
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	if code := in.wait(20 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}
