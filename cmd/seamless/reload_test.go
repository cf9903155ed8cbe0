package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// startLoad runs both kinds of client at once: one connection per request,
// and keep-alive clients that never retry (the ones plain master-worker
// fails at reloads).
func startLoad(t *testing.T, s *site) (newConn, keepAlive *loadgen.Load) {
	t.Helper()
	mk := func(m loadgen.Mode) *loadgen.Load {
		l, err := loadgen.Start(context.Background(), loadgen.Config{
			Target: s.addr(), Mode: m, Workers: 8,
			MaxRequests: 5_000_000, MaxDuration: 5 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Stop() })
		return l
	}
	return mk(loadgen.NewConn), mk(loadgen.KeepAlive)
}

// stopLoad stops l once it has sent the requests requireNoFailures asks
// for: a scenario that ends quickly on a fast machine would otherwise be
// blamed on the load.
func stopLoad(t *testing.T, l *loadgen.Load) loadgen.Result {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the load sends 100 requests", func() bool {
		return l.Snapshot().Requests >= minRequests
	})
	return l.Stop()
}

// minRequests is the least a load must have sent to show anything.
const minRequests = 100

func requireNoFailures(t *testing.T, name string, r loadgen.Result) {
	t.Helper()
	t.Logf("%s: %d requests, %d failed %v", name, r.Requests, r.Failed, r.Errors)
	if r.Requests < minRequests {
		t.Errorf("%s: only %d requests; the load did not run", name, r.Requests)
	}
	if r.Failed != 0 {
		t.Errorf("%s: %d of %d requests failed: %v", name, r.Failed, r.Requests, r.Errors)
	}
}

// TestHUPUnderLoadDropsNothing: 100 SIGHUPs, the config changing before
// every other one, under both kinds of client: no request fails, every
// reload is confirmed, and the last config is the one running.
func TestHUPUnderLoadDropsNothing(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 0, startOpts{})
	nc, ka := startLoad(t, s)

	const hups = 100
	last := 0
	for i := 1; i <= hups; i++ {
		if i%2 == 0 {
			last = i
			s.write(t, last)
		}
		before := in.metric(successes)
		in.signal(syscall.SIGHUP)
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("reload %d confirmed", i), func() bool {
			return in.metric(successes) > before
		})
	}
	testenv.Eventually(t, 10*time.Second, "last config serves", func() bool { return served(s) == fmt.Sprintf("v%d", last) })
	requireNoFailures(t, "new connection per request", stopLoad(t, nc))
	requireNoFailures(t, "keep-alive without retries", stopLoad(t, ka))
	if f := in.metric(failures); f != 0 {
		t.Errorf("%v reloads failed", f)
	}
	if got := in.metric(successes); got != hups {
		t.Errorf("%v confirmed reloads, want %d", got, hups)
	}
}

// TestHUPStormEndsWithTheLastFile: 50 HUPs 5 ms apart, the file changing
// before each. Plain HAProxy drops signals that arrive while it re-executes;
// here they coalesce and the newest file ends up running.
func TestHUPStormEndsWithTheLastFile(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 0, startOpts{})
	nc, ka := startLoad(t, s)

	const storm = 50
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 1; i <= storm; i++ {
		s.write(t, i)
		in.signal(syscall.SIGHUP)
		<-tick.C
	}
	// The kernel merges a signal that is already pending, so fewer than 50
	// requests may reach seamless; what matters is that the newest file runs.
	testenv.Eventually(t, 30*time.Second, "the last file runs", func() bool { return served(s) == fmt.Sprintf("v%d", storm) })
	requireNoFailures(t, "new connection per request", stopLoad(t, nc))
	requireNoFailures(t, "keep-alive without retries", stopLoad(t, ka))
	t.Logf("%d HUPs became %v reloads (%v coalesced)", storm, in.metric(successes), in.metric("seamless_reload_requests_coalesced_total"))
	if f := in.metric(failures); f != 0 {
		t.Errorf("%v reloads failed", f)
	}
}

// TestInvalidConfigKeepsServing: a broken file on HUP is refused with
// HAProxy's file:line message, traffic keeps flowing on the old config, and
// the next good file is applied.
func TestInvalidConfigKeepsServing(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 1, startOpts{})
	nc, ka := startLoad(t, s)

	s.extraFE = "    bogus-directive here\n"
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "refusal counted", func() bool {
		return in.metric("seamless_config_errors_total") == 1 && in.metric(failures) == 1
	})
	if !strings.Contains(in.out.String(), "haproxy.cfg:11]") || !strings.Contains(in.out.String(), "bogus-directive") {
		t.Error("the log does not name the file, line and directive")
	}
	if v := served(s); v != "v1" {
		t.Errorf("serving %q after a refused config, want v1", v)
	}

	s.extraFE = ""
	s.write(t, 3)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "fixed config applied and confirmed", func() bool {
		return served(s) == "v3" && in.metric(successes) == 1
	})
	requireNoFailures(t, "new connection per request", stopLoad(t, nc))
	requireNoFailures(t, "keep-alive without retries", stopLoad(t, ka))
}

// TestFailedReloadIsVisible: a bind error passes haproxy -c but fails the
// reload. Plain HAProxy hides it; seamless counts and logs it while the old
// worker keeps serving. seamless probes the addresses it can read before
// a reload; one in a .if block it leaves to HAProxy, as here.
func TestFailedReloadIsVisible(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 1, startOpts{})

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s.extraFE = fmt.Sprintf(".if 1\n    bind %s\n.endif\n", busy.Addr())
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "failed reload counted", func() bool { return in.metric(failures) == 1 })
	if in.metric("seamless_config_errors_total") != 0 {
		t.Error("a bind error in a .if block was counted as a config error; seamless does not evaluate .if")
	}
	testenv.Eventually(t, 5*time.Second, "failure logged with HAProxy's message", func() bool {
		out := in.out.String()
		return strings.Contains(out, "reload failed") && strings.Contains(out, "cannot bind socket")
	})
	if v := served(s); v != "v1" {
		t.Errorf("serving %q, want v1 from the old worker", v)
	}
	// 3.1+ lists the surviving worker as an old one; the drain must still
	// find it.
	in.signal(syscall.SIGTERM)
	if code := in.wait(10 * time.Second); code != 0 {
		t.Errorf("exit code %d after a failed reload and a drain, want 0", code)
	}
	if strings.Contains(in.out.String(), "drain did not finish") || strings.Contains(in.out.String(), "cannot drain") {
		t.Error("the drain after a failed reload was cut short")
	}
}

// TestSignalsDuringAReloadCoalesce holds the first reload's validation at a
// gate while 50 more HUPs arrive: they must turn into exactly one follow-up
// reload. A build that drops them would stop at one reload, one that
// reloads per signal would do many.
func TestSignalsDuringAReloadCoalesce(t *testing.T) {
	wrapper, gate, waiting := gatedHAProxy(t)
	s := newSite(t, startBackend(t))
	s.write(t, 0)
	in := startSeamless(t, s, startOpts{env: []string{"SEAMLESS_HAPROXY_BIN=" + wrapper}, args: []string{"-f", s.path}})
	in.waitReady(s)

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 10*time.Second, "first validation held at the gate", func() bool {
		_, err := os.Stat(waiting)
		return err == nil
	})
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 1; i <= 50; i++ {
		s.write(t, i)
		in.signal(syscall.SIGHUP)
		<-tick.C
	}
	testenv.Eventually(t, 10*time.Second, "every HUP received", func() bool {
		// The kernel merges a pending signal, so count what arrived.
		return in.metric("seamless_reload_requests_total") >= 2
	})
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "two reloads, the last file running", func() bool {
		return in.metric(successes) == 2 && served(s) == "v50"
	})
	requests := in.metric("seamless_reload_requests_total")
	if got := in.metric("seamless_reload_requests_coalesced_total"); got != requests-2 {
		t.Errorf("%v of %v requests coalesced, want all but the two that started reloads", got, requests)
	}
}

// TestKilledSeamlessTakesHAProxyDown: outside a container nothing else
// would stop an orphaned HAProxy that keeps its ports.
func TestKilledSeamlessTakesHAProxyDown(t *testing.T) {
	testenv.HAProxy(t)
	_, _, in := serving(t, 1, startOpts{})
	if len(procfs.Mentioning(in.runDir)) == 0 {
		t.Fatal("no HAProxy process found to begin with")
	}
	in.signal(syscall.SIGKILL)
	in.wait(10 * time.Second)
	testenv.Eventually(t, 10*time.Second, "HAProxy gone", func() bool { return len(procfs.Mentioning(in.runDir)) == 0 })
}

// TestSlowReloadEndsWithTheNewestFile: a configuration that takes longer
// to load than SEAMLESS_RELOAD_TIMEOUT, and a newer file asked for while
// HAProxy is still busy with it. The newer request must not be lost.
func TestSlowReloadEndsWithTheNewestFile(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	slow, loading := filepath.Join(dir, "slow.lua"), filepath.Join(dir, "loading")
	// Slow only where HAProxy loads it for real, not under haproxy -c; the
	// marker says HAProxy has read the file and is busy with it.
	lua := fmt.Sprintf(`if os.getenv("HAPROXY_MWORKER") then os.execute("touch %s; sleep 3") end`, loading)
	if err := os.WriteFile(slow, []byte(lua+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The timeout is under the 3 s load, and far enough above a fast
	// reload on a loaded machine (3.2 answers once the worker is ready).
	_, s, in := serving(t, 1, startOpts{env: []string{"SEAMLESS_RELOAD_TIMEOUT=2s"}})

	s.global = "    lua-load " + slow + "\n"
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 10*time.Second, "HAProxy busy loading the slow file", func() bool {
		_, err := os.Stat(loading)
		return err == nil
	})
	s.global = ""
	s.write(t, 3)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 40*time.Second, "the newest file runs", func() bool { return served(s) == "v3" })
	testenv.Eventually(t, 10*time.Second, "its reload confirmed", func() bool { return in.metric(successes) >= 1 })
}

// gatedHAProxy is a haproxy whose `-c` runs wait while the file gate
// exists, after touching waiting: a validation held as long as a test
// needs.
func gatedHAProxy(t *testing.T) (wrapper, gate, waiting string) {
	t.Helper()
	real := testenv.HAProxy(t)
	dir := t.TempDir()
	gate, waiting = filepath.Join(dir, "gate"), filepath.Join(dir, "waiting")
	wrapper = filepath.Join(dir, "haproxy")
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
  if [ "$a" = "-c" ] && [ -e %[1]s ]; then
    touch %[2]s
    while [ -e %[1]s ]; do sleep 0.01; done
  fi
done
exec %[3]s "$@"
`, gate, waiting, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper, gate, waiting
}
