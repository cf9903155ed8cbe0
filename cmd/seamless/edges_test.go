package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// runBinaryWithin runs seamless like runBinary, killed after limit: a
// command that blocks must fail the test, not hang it.
func runBinaryWithin(t *testing.T, limit time.Duration, env []string, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, seamlessBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	start := time.Now()
	err := cmd.Run()
	took = time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("seamless %v still running after %s", args, limit)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), o.String(), e.String(), took
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, o.String(), e.String(), took
}

// appendSection adds a section at the end of the site's file.
func appendSection(t *testing.T, s *site, section string) {
	t.Helper()
	b, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, s.path, string(b)+section)
}

const programSection = "program hello\n    command /bin/sleep 3600\n"

// programGlobal: 3.1+ refuses program sections unless allowed in global.
const programGlobal = ".if version_atleast(3.1)\n    expose-deprecated-directives\n.endif\n"

// Issue 10 item 10: a program section needs master-worker mode, which the
// master has; validation must load the file as the master does (-W).
func TestProgramSectionChecksAndReloads(t *testing.T) {
	testenv.HAProxy(t)
	s := newSite(t, startBackend(t))
	s.global = programGlobal
	s.write(t, 1)
	appendSection(t, s, programSection)
	code, out, errOut, _ := runBinaryWithin(t, 20*time.Second, nil, "check", "-f", s.path)
	if code != 0 {
		t.Errorf("check of a config with a program section: exit %d, %q %q", code, out, errOut)
	}

	in := startSeamless(t, s, startOpts{})
	in.waitReady(s)
	s.write(t, 2)
	appendSection(t, s, programSection)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the reload with a program section confirmed", func() bool {
		return in.metric(successes) == 1 || in.metric(failures) > 0
	})
	if f := in.metric(failures); f != 0 {
		t.Fatalf("%v reloads failed", f)
	}
	testenv.Eventually(t, 10*time.Second, "v2 serves", func() bool { return served(s) == "v2" })
}

// refusedWithin bounds how long a refusal of a file that is not a regular
// file may take: far below any reload timeout, with room for a busy
// machine.
const refusedWithin = 2 * time.Second

// Issue 10 item 11: a FIFO where the configuration should be would block
// haproxy -c (and seamless's own scans) until a writer appears. It is
// refused at once, naming the path; the next HUP is not held up.
func TestAFIFOAsConfigIsRefusedAtOnce(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 1, startOpts{env: []string{"SEAMLESS_RELOAD_TIMEOUT=20s"}})
	good, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(s.path, 0o644); err != nil {
		t.Fatal(err)
	}

	code, _, errOut, took := runBinaryWithin(t, 20*time.Second, nil, "check", "-f", s.path)
	if code != exitInvalid || !strings.Contains(errOut, s.path) || !strings.Contains(errOut, "not a regular file") {
		t.Errorf("check of a FIFO: exit %d, stderr %q; want %d naming %s", code, errOut, exitInvalid, s.path)
	}
	if took > refusedWithin {
		t.Errorf("check of a FIFO took %s", took)
	}

	sent := time.Now()
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the FIFO refused", func() bool {
		return in.metric("seamless_config_errors_total") == 1
	})
	if took := time.Since(sent); took > refusedWithin {
		t.Errorf("the refusal took %s", took)
	}
	if out := in.out.String(); !strings.Contains(out, s.path) || !strings.Contains(out, "not a regular file") {
		t.Error("the log does not say that the path is not a regular file")
	}

	if err := os.Remove(s.path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.path, bytes.Replace(good, []byte(`"v1"`), []byte(`"v2"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	sent = time.Now()
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the next HUP applies v2", func() bool { return served(s) == "v2" })
	t.Logf("the HUP after the refusal applied in %s", time.Since(sent))
}

// A directory with no *.cfg file (what a bind mount of a missing file
// creates) loads nothing; HAProxy only prints its usage. Say why.
func TestAnEmptyConfigDirectoryIsExplained(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	code, _, errOut, _ := runBinaryWithin(t, 20*time.Second, nil, "check", "-f", dir)
	if code != exitInvalid || !strings.Contains(errOut, dir) || !strings.Contains(errOut, "no *.cfg") {
		t.Errorf("check of an empty directory: exit %d, stderr %q", code, errOut)
	}
}

// Issue 10 item 9: a reload whose new bind fails makes HAProxy pause the
// running listeners while the new worker tries, and new connections fail
// meanwhile. seamless binds each address the candidate adds first, and
// never sends a reload that would fail so.
func TestABindThatWouldFailIsRefusedBeforeTheReload(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 1, startOpts{})
	before := in.showProc()
	nc, ka := startLoad(t, s)

	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	s.extraFE = "    bind " + held.Addr().String() + "\n"
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the candidate refused or reloaded", func() bool {
		return in.metric("seamless_config_errors_total") == 1 || in.metric(successes)+in.metric(failures) > 0 &&
			in.metric("seamless_config_errors_total") == 0
	})
	if in.metric("seamless_config_errors_total") != 1 {
		t.Fatal("the taken address was not refused as a configuration error")
	}
	out := in.out.String()
	if !strings.Contains(out, held.Addr().String()) || !strings.Contains(out, "haproxy.cfg:11") {
		t.Error("the refusal does not name the address and the file:line of its bind")
	}
	after := in.showProc()
	if after.Master.Reloads != before.Master.Reloads || !maps.Equal(after.WorkerPids(), before.WorkerPids()) {
		t.Errorf("HAProxy was reloaded: show proc before %+v, after %+v", before, after)
	}
	if in.metric(successes) != 0 {
		t.Error("a reload was confirmed")
	}
	// Let the load run on past the refusal.
	n := nc.Snapshot().Requests
	testenv.Eventually(t, 10*time.Second, "load goes on", func() bool { return nc.Snapshot().Requests > n+200 })
	if v := served(s); v != "v1" {
		t.Errorf("serving %q, want v1", v)
	}

	s.extraFE = ""
	s.write(t, 3)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the next good file applies", func() bool { return served(s) == "v3" })
	requireNoFailures(t, "new connection per request", stopLoad(t, nc))
	requireNoFailures(t, "keep-alive without retries", stopLoad(t, ka))
}

// The bind guard learns what runs from every reload, not only from the
// start: a port the running configuration gave up is probed again when a
// later file binds it. Its Loaded never reached it through the reload
// log's checker, so here the port still counted as HAProxy's, was not
// probed, and the reload was sent and failed to bind.
func TestAPortAReloadGaveUpIsProbedWhenBoundAgain(t *testing.T) {
	testenv.HAProxy(t)
	s := newSite(t, startBackend(t))
	addr := testenv.Addr(testenv.FreePort(t))
	s.extraFE = "    bind " + addr + "\n"
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{})
	in.waitReady(s)

	s.extraFE = ""
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "v2, without the second bind", func() bool { return served(s) == "v2" })
	var held net.Listener
	testenv.Eventually(t, 10*time.Second, "the port given up free for another process", func() bool {
		l, err := net.Listen("tcp", addr)
		held = l
		return err == nil
	})
	defer held.Close()

	before := in.showProc()
	s.extraFE = "    bind " + addr + "\n"
	s.write(t, 3)
	in.signal(syscall.SIGHUP)
	// A refusal counts as a failed reload too.
	testenv.Eventually(t, 30*time.Second, "the candidate refused or its reload failed", func() bool {
		return in.metric(failures) > 0 || served(s) == "v3"
	})
	if in.metric("seamless_config_errors_total") != 1 || !strings.Contains(in.out.String(), addr) {
		t.Error("the taken address was not refused as a configuration error naming it")
	}
	if after := in.showProc(); after.Master.Reloads != before.Master.Reloads {
		t.Errorf("the reload was sent: the taken address was not probed (show proc before %+v, after %+v)", before, after)
	}
	if v := served(s); v != "v2" {
		t.Errorf("serving %q, want v2", v)
	}
}

// The same in discovery mode: a rendering that adds a taken address is
// never reloaded into; the last good one keeps serving, and since the port
// may be freed (it is not the configuration's fault) the rendering is
// retried and applies by itself once it is.
func TestDiscoveryNeverReloadsIntoATakenAddress(t *testing.T) {
	testenv.HAProxy(t)
	addr := testenv.Addr(testenv.FreePort(t))
	tmpl := filepath.Join(t.TempDir(), "haproxy.cfg.tmpl")
	const base = `defaults
    mode http
    option idle-close-on-response
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend www
    bind %s
%s    http-request return status 200 content-type text/plain string "%s"
`
	writeAtomic(t, tmpl, fmt.Sprintf(base, addr, "", "v1"))
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_TEMPLATE=" + tmpl,
		"SEAMLESS_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SEAMLESS_DISCOVERY_TIMEOUT=1s"}})
	get := func() string { _, body := testenv.Get("http://" + addr + "/"); return body }
	testenv.Eventually(t, 20*time.Second, "v1 serves", func() bool { return get() == "v1" })
	before := in.showProc()

	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	writeAtomic(t, tmpl, fmt.Sprintf(base, addr, "    bind "+held.Addr().String()+"\n", "v2"))
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the rendering held back or reloaded", func() bool {
		return in.metric(`seamless_config_applies_total{result="failed"}`) > 0 || in.metric(successes)+in.metric(failures) > 0
	})
	if in.metric("seamless_config_errors_total") != 0 || in.metric(`seamless_config_applies_total{result="refused"}`) != 0 {
		t.Error("a taken address counted as a configuration error")
	}
	if !strings.Contains(in.out.String(), "cannot bind "+held.Addr().String()) {
		t.Error("the log does not name the address")
	}
	if after := in.showProc(); after.Master.Reloads != before.Master.Reloads || !maps.Equal(after.WorkerPids(), before.WorkerPids()) {
		t.Errorf("HAProxy was reloaded: show proc before %+v, after %+v", before, after)
	}
	if v := get(); v != "v1" {
		t.Errorf("serving %q, want v1", v)
	}
	held.Close()
	testenv.Eventually(t, 30*time.Second, "the rendering applies once the address is free", func() bool { return get() == "v2" })

	writeAtomic(t, tmpl, fmt.Sprintf(base, addr, "", "v3"))
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "the next good rendering applies", func() bool { return get() == "v3" })
}

// Started on a FIFO, HAProxy's master would block reading it forever, never
// healthy: seamless stops at once, naming the path.
func TestStartOnAFIFOExitsNamingIt(t *testing.T) {
	testenv.HAProxy(t)
	pipe := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy", "-f", pipe}})
	if code := in.wait(10 * time.Second); code != exitUsage {
		t.Errorf("exit %d, want %d", code, exitUsage)
	}
	if out := in.out.String(); !strings.Contains(out, pipe) || !strings.Contains(out, "not a regular file") {
		t.Errorf("the log does not name the FIFO:\n%s", out)
	}
}
