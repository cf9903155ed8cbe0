package haproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/reaper"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// These tests run the real HAProxy: what a reload does is HAProxy's to
// decide, not ours to imitate.

func startReaper(t *testing.T) *reaper.Reaper {
	t.Helper()
	rp := reaper.New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return rp
}

func writeConfig(t *testing.T, path string, port int, extra string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(configText(port, extra)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// configText is writeConfig's configuration.
func configText(port int, extra string) string {
	return fmt.Sprintf(`global
    log stderr format raw local0 notice
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
frontend fe
    bind 127.0.0.1:%d
%s    http-request return status 200 content-type text/plain string "ok"
`, port, extra)
}

func TestValidatorRealHAProxy(t *testing.T) {
	bin := testenv.HAProxy(t)
	rp := startReaper(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "haproxy.cfg")
	writeConfig(t, cfg, testenv.FreePort(t), "")
	v := &Validator{Bin: bin, Args: []string{"-c", "-f", cfg}, Env: append(os.Environ(), "HAPROXY_MWORKER_REEXEC=1"), Run: rp.Output}
	if err := v.Check(context.Background()); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}

	writeConfig(t, cfg, testenv.FreePort(t), "    bogus-keyword here\n")
	err := v.Check(context.Background())
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("invalid config: got %v, want *ConfigError", err)
	}
	if !strings.Contains(ce.Error(), "haproxy.cfg:10") || !strings.Contains(ce.Error(), "bogus-keyword") {
		t.Errorf("error does not name the file, line and keyword: %v", ce)
	}

	v.Bin = filepath.Join(dir, "no-such-haproxy")
	if err := v.Check(context.Background()); err == nil || errors.As(err, &ce) {
		t.Errorf("a missing executable must be an error, not a config error: %v", err)
	}
}

func TestVersionRealHAProxy(t *testing.T) {
	bin := testenv.HAProxy(t)
	v, err := Version(context.Background(), startReaper(t).Output, bin)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v, ".") {
		t.Errorf("version %q does not look like one", v)
	}
}

// TestMasterCLIReload confirms a good reload and a failed one (a bind error
// that haproxy -c cannot see) through the real master CLI.
func TestMasterCLIReload(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	port := testenv.FreePort(t)
	writeConfig(t, cfg, port, "")
	cli := startMaster(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := cli.WaitShowProc(ctx, func(p Procs) bool { return len(p.Workers) == 1 })
	if err != nil {
		t.Fatal(err)
	}

	res, err := cli.Reload(ctx)
	if err != nil || !res.OK {
		t.Fatalf("reload of an unchanged config: ok=%v err=%v messages=%q procs=%+v", res.OK, err, res.Messages, res.Procs)
	}
	if len(res.NewWorkers) != 1 || res.NewWorkers[0] == first.Workers[0].Pid {
		t.Errorf("new workers %v, want one that is not %d", res.NewWorkers, first.Workers[0].Pid)
	}
	if res.Procs.Master.Reloads != first.Master.Reloads+1 {
		t.Errorf("reload counter %d, want %d", res.Procs.Master.Reloads, first.Master.Reloads+1)
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	writeConfig(t, cfg, port, fmt.Sprintf("    bind %s\n", busy.Addr()))
	res, err = cli.Reload(ctx)
	if err != nil {
		t.Fatalf("failed reload not confirmed: %v", err)
	}
	if res.OK {
		t.Fatal("a reload whose bind fails was reported as a success")
	}
	if !res.Procs.HasWorkers() {
		t.Errorf("after a failed reload no worker serves: %+v", res.Procs)
	}

	writeConfig(t, cfg, port, "")
	res, err = cli.Reload(ctx)
	if err != nil || !res.OK {
		t.Fatalf("reload after fixing the config: ok=%v err=%v", res.OK, err)
	}
}

// `show servers state <backend>` answers the servers of that backend
// alone, in the format ServersState parses; an unknown backend is an
// error, not an empty answer.
func TestBackendServersStateRealHAProxy(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	writeConfig(t, cfg, testenv.FreePort(t), "")
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(f, "backend web\n    server s1 127.0.0.1:1 disabled\n    server s2 127.0.0.1:2\n"+
		"backend api\n    server s1 127.0.0.1:3\n")
	f.Close()
	cli := startMaster(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 3.1+ lists the worker while it still loads, before "@1" reaches it.
	if _, err := cli.WaitWorkerReady(ctx); err != nil {
		t.Fatal(err)
	}
	rt := Runtime{CLI: cli}
	got, err := rt.BackendServersState(ctx, []string{"web"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got {
		names = append(names, fmt.Sprintf("%s/%s:%d:%s", s.Backend, s.Server, s.Port, s.Mode()))
	}
	if want := "web/s1:1:maint web/s2:2:ready"; strings.Join(names, " ") != want {
		t.Errorf("web's servers: %s, want %s", strings.Join(names, " "), want)
	}
	if _, err := rt.BackendServersState(ctx, []string{"nope"}); err == nil {
		t.Error("an unknown backend answered no error")
	}
	// Several backends are read in one connection, each answer its own.
	got, err = rt.BackendServersState(ctx, []string{"api", "web"})
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, s := range got {
		names = append(names, fmt.Sprintf("%s/%s:%d:%s", s.Backend, s.Server, s.Port, s.Mode()))
	}
	if want := "api/s1:3:ready web/s1:1:maint web/s2:2:ready"; strings.Join(names, " ") != want {
		t.Errorf("api's and web's servers: %s, want %s", strings.Join(names, " "), want)
	}
	if _, err := rt.BackendServersState(ctx, []string{"api", "nope"}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("an unknown backend after a known one: %v, want an error naming it", err)
	}
}

// commandSocket is a Unix socket that reads each connection's first
// line, keeps it, and has answer write the reply; serially, one
// connection at a time. It returns a MasterCLI on it and what it kept.
func commandSocket(t *testing.T, serially bool, answer func(cmd string, c net.Conn)) (*MasterCLI, func() []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cmd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var (
		mu    sync.Mutex
		lines []string
	)
	serve := func(c net.Conn) {
		defer c.Close()
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return
		}
		cmd := strings.TrimSpace(line)
		mu.Lock()
		lines = append(lines, cmd)
		mu.Unlock()
		answer(cmd, c)
	}
	go func() {
		for c, err := l.Accept(); err == nil; c, err = l.Accept() {
			if serially {
				serve(c)
			} else {
				go serve(c)
			}
		}
	}()
	return NewMasterCLI(path), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// recordingMaster is a Unix socket in front of the master CLI at addr
// that passes each connection's first line on and keeps it, one
// connection at a time, as the runtime API makes them.
func recordingMaster(t *testing.T, addr string) (*MasterCLI, func() []string) {
	t.Helper()
	return commandSocket(t, true, func(cmd string, c net.Conn) {
		out, _ := NewMasterCLI(addr).Do(context.Background(), cmd)
		_, _ = io.WriteString(c, out)
	})
}

// The runtime API goes over the worker's own socket once it names the
// master's current worker, follows a reload to the new worker, and falls
// back to the master when the socket reaches no one.
func TestRuntimeOverTheWorkerSocketRealHAProxy(t *testing.T) {
	h := startWithWorkerSocket(t)
	cfg, wsock, b, direct, master, seen := h.cfg, h.wsock, h.config, h.direct, h.master, h.seen
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var vias []string
	rt := Runtime{CLI: master, Worker: NewWorkerSocket(wsock), Connected: func(v string) { vias = append(vias, v) }}
	// went checks that every connection since the last call went via.
	went := func(via string) {
		t.Helper()
		if len(vias) == 0 || slices.ContainsFunc(vias, func(v string) bool { return v != via }) {
			t.Errorf("connections went %q, want each %s", vias, via)
		}
		vias = nil
	}
	weight := func(want int) {
		t.Helper()
		got, err := rt.BackendServersState(ctx, []string{"api", "web"})
		if err != nil {
			t.Fatal(err)
		}
		// Read through the master too: the worker it names as current.
		out, err := direct.Do(ctx, "@1 show servers state web")
		if err != nil {
			t.Fatal(err)
		}
		viaMaster, err := ParseServersState(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 || got[2].Server != "s2" || got[2].Weight != want || viaMaster[1].Weight != want {
			t.Fatalf("web/s2 weight over the runtime %+v, through the master %+v; want %d", got, viaMaster, want)
		}
	}
	forwarded := func() (n int) {
		for _, l := range seen() {
			if strings.Contains(l, "@1") {
				n++
			}
		}
		return n
	}

	if err := rt.Apply(ctx, []string{"set server web/s2 weight 7"}); err != nil {
		t.Fatal(err)
	}
	weight(7)
	if n := forwarded(); n != 0 {
		t.Errorf("%d commands went through the master, want none: %q", n, seen())
	}
	went(ViaWorker)

	res, err := direct.Reload(ctx)
	if err != nil || !res.OK {
		t.Fatalf("reload: %+v %v", res, err)
	}
	if _, err := direct.WaitWorkerReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.Apply(ctx, []string{"set server web/s2 weight 9"}); err != nil {
		t.Fatal(err)
	}
	weight(9) // the new worker, which starts from the configuration's 1
	if n := forwarded(); n != 0 {
		t.Errorf("after the reload %d commands went through the master, want none: %q", n, seen())
	}
	went(ViaWorker)
	applyAndRead(t, ctx, rt, 8)
	if len(vias) != 1 {
		t.Errorf("commands and their read-back took %d connections, want 1", len(vias))
	}
	went(ViaWorker)
	refusedAndRead(t, ctx, rt)
	went(ViaWorker)

	// Another process at the path (a new worker the master does not
	// keep): its answers do not count, and the change goes through the
	// master to the worker that serves.
	if err := os.Remove(wsock); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", wsock)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for c, err := other.Accept(); err == nil; c, err = other.Accept() {
			_, _ = bufio.NewReader(c).ReadString('\n')
			_, _ = io.WriteString(c, "Name: HAProxy\nPid: 1\n\n\n")
			c.Close()
		}
	}()
	before := forwarded()
	if err := rt.Apply(ctx, []string{"set server web/s2 weight 4"}); err != nil {
		t.Fatal(err)
	}
	weight(4)
	if n := forwarded() - before; n == 0 {
		t.Errorf("another process at the socket's path took the commands: %q", seen())
	}
	went(ViaMaster)
	other.Close()

	// A reload that fails on a busy port: whichever process last took
	// the socket's path, the change reaches the worker the master keeps.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	good := b
	if err := os.WriteFile(cfg, append(slices.Clone(good), fmt.Sprintf("frontend busy\n    bind %s\n", busy.Addr())...), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := direct.Reload(ctx); err == nil && res.OK {
		t.Fatalf("a reload onto a busy port succeeded: %+v", res)
	}
	if err := rt.Apply(ctx, []string{"set server web/s2 weight 3"}); err != nil {
		t.Fatal(err)
	}
	weight(3)
	if err := os.WriteFile(cfg, good, 0o644); err != nil {
		t.Fatal(err)
	}

	before = forwarded()
	if err := os.Remove(wsock); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := rt.Apply(ctx, []string{"set server web/s2 weight 5"}); err != nil {
		t.Fatal(err)
	}
	if n := forwarded() - before; n != 1 {
		t.Errorf("with the socket gone, %d commands went through the master, want 1: %q", n, seen())
	}
	weight(5)
	went(ViaMaster)
	// Two backends' states are read in one connection.
	before, lines := forwarded(), len(seen())
	if got, err := rt.BackendServersState(ctx, []string{"api", "web"}); err != nil || len(got) != 3 {
		t.Fatalf("api's and web's servers: %+v %v", got, err)
	}
	if n := forwarded() - before; n != 1 {
		t.Errorf("two backends' states took %d connections, want 1: %q", n, seen()[lines:])
	}
	before = forwarded()
	applyAndRead(t, ctx, rt, 2)
	if n := forwarded() - before; n != 1 {
		t.Errorf("through the master, commands and their read-back took %d connections, want 1", n)
	}
	went(ViaMaster)
	refusedAndRead(t, ctx, rt)
}

// workerSocketHAProxy is a master whose worker binds the worker socket,
// with backends web (s1 disabled, s2) and api (s1).
type workerSocketHAProxy struct {
	cfg, wsock string
	config     []byte          // cfg's content
	direct     *MasterCLI      // the master CLI
	master     *MasterCLI      // the master CLI, through recordingMaster
	seen       func() []string // the lines sent to master
}

func startWithWorkerSocket(t *testing.T) workerSocketHAProxy {
	t.Helper()
	dir := t.TempDir()
	h := workerSocketHAProxy{cfg: filepath.Join(dir, "haproxy.cfg"), wsock: filepath.Join(dir, "worker.sock")}
	writeConfig(t, h.cfg, testenv.FreePort(t), "")
	b, err := os.ReadFile(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The defaults file's global section, as seamless loads it.
	h.config = append(b, Defaults{WorkerSocket: h.wsock}.File(Directives{})+
		"backend web\n    server s1 127.0.0.1:1 disabled\n    server s2 127.0.0.1:2\n"+
		"backend api\n    server s1 127.0.0.1:3\n"...)
	if err := os.WriteFile(h.cfg, h.config, 0o644); err != nil {
		t.Fatal(err)
	}
	h.direct = startMaster(t, h.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := h.direct.WaitWorkerReady(ctx); err != nil {
		t.Fatal(err)
	}
	h.master, h.seen = recordingMaster(t, h.direct.Addr)
	return h
}

// With a reload generation, the worker socket asks the master which
// worker is current once per generation, not before every change: a
// `show proc` on a connection of its own was one of the two connections
// each change cost. A reload (the generation moving, odd while in flight)
// makes it ask again, and it follows the new worker.
func TestTheWorkerSocketAsksTheMasterOncePerGenerationRealHAProxy(t *testing.T) {
	h := startWithWorkerSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var gen atomic.Uint64
	rt := Runtime{CLI: h.master, Worker: NewWorkerSocket(h.wsock), Generation: gen.Load}
	asked := func() (n int) {
		for _, l := range h.seen() {
			if l == "show proc" {
				n++
			}
		}
		return n
	}
	for w := 1; w <= 3; w++ {
		applyAndRead(t, ctx, rt, w)
	}
	if n := asked(); n != 1 {
		t.Errorf("three changes in one generation asked show proc %d times, want 1: %q", n, h.seen())
	}
	if n := len(h.seen()); n != 1 {
		t.Errorf("three changes went %d times to the master, want once (show proc): %q", n, h.seen())
	}
	gen.Add(1) // a reload begins
	applyAndRead(t, ctx, rt, 4)
	applyAndRead(t, ctx, rt, 5)
	if n := asked(); n != 3 {
		t.Errorf("during a reload each change must ask show proc: %d asks in all, want 3", n)
	}
	res, err := h.direct.Reload(ctx)
	if err != nil || !res.OK {
		t.Fatalf("reload: %+v %v", res, err)
	}
	if _, err := h.direct.WaitWorkerReady(ctx); err != nil {
		t.Fatal(err)
	}
	gen.Add(1)                  // it ended
	applyAndRead(t, ctx, rt, 6) // the new worker, over its socket
	applyAndRead(t, ctx, rt, 7)
	if n := asked(); n != 4 {
		t.Errorf("after the reload show proc was asked %d times in all, want 4", n)
	}
	out, err := h.direct.Do(ctx, "@1 show servers state web")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := ParseServersState(out); err != nil || len(st) != 2 || st[1].Weight != 7 {
		t.Errorf("the worker the master keeps has web %+v (%v), want s2 at weight 7", st, err)
	}
}

// applyAndRead sets web/s2's weight and web/s1 ready with their read-back
// in one connection.
func applyAndRead(t *testing.T, ctx context.Context, rt Runtime, weight int) {
	t.Helper()
	got, err := rt.ApplyAndRead(ctx, []string{fmt.Sprintf("set server web/s2 weight %d", weight), "set server web/s1 state ready"},
		[]string{"api", "web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Backend != "api" || got[1].Mode() != "ready" || got[2].Server != "s2" || got[2].Weight != weight {
		t.Errorf("read back %+v; want api/s1, web/s1 ready, web/s2 weight %d", got, weight)
	}
}

// refusedAndRead checks that a refused command fails ApplyAndRead.
func refusedAndRead(t *testing.T, ctx context.Context, rt Runtime) {
	t.Helper()
	if _, err := rt.ApplyAndRead(ctx, []string{"set server web/s9 weight 1"}, []string{"web"}); err == nil || !strings.Contains(err.Error(), "No such server") {
		t.Errorf("a command on a server that does not exist: %v", err)
	}
}

// startMaster runs HAProxy in master-worker mode on cfg, killed with the
// test, and returns its master CLI.
func startMaster(t *testing.T, cfg string) *MasterCLI {
	t.Helper()
	bin := testenv.HAProxy(t)
	rp := startReaper(t)
	sock := filepath.Join(filepath.Dir(cfg), "master.sock")
	path, _ := exec.LookPath(bin)
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	master, err := rp.Start(path, []string{bin, "-W", "-db", "-S", sock, "-f", cfg}, &syscall.ProcAttr{
		Env: CleanEnv(os.Environ()), Files: []uintptr{devnull.Fd(), devnull.Fd(), devnull.Fd()},
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-master.Pid, syscall.SIGKILL)
		<-master.Done()
	})
	return NewMasterCLI(sock)
}

// A reload's outcome is not polled for seven eighths of the time the last
// one took to show, at most a second; nothing before the first. The polls
// after it start a sixteenth of that apart, from 1 ms to maxPollDelay.
func TestQuietAfterReload(t *testing.T) {
	for _, c := range []struct{ last, quiet, first time.Duration }{
		{0, 0, time.Millisecond},
		{40 * time.Millisecond, 35 * time.Millisecond, 2500 * time.Microsecond},
		{120 * time.Millisecond, 105 * time.Millisecond, 7500 * time.Microsecond},
		{4 * time.Second, time.Second, maxPollDelay},
	} {
		if got := quietAfterReload(c.last); got != c.quiet {
			t.Errorf("quietAfterReload(%v) = %v, want %v", c.last, got, c.quiet)
		}
		if got := firstPollDelay(c.last); got != c.first {
			t.Errorf("firstPollDelay(%v) = %v, want %v", c.last, got, c.first)
		}
	}
}

// readyMaster starts a master on a configuration of one frontend and the
// sections after it, and returns it once its worker serves, with a
// context for the test, the configuration's path and the frontend's port.
func readyMaster(t *testing.T, sections string) (*MasterCLI, context.Context, string, int) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	port := testenv.FreePort(t)
	if err := os.WriteFile(cfg, []byte(configText(port, "")+sections), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := startMaster(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := cli.WaitWorkerReady(ctx); err != nil {
		t.Fatal(err)
	}
	return cli, ctx, cfg, port
}

func (m *MasterCLI) setReexec(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reexec = d
}

func (m *MasterCLI) learned() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reexec
}

// The second and third reloads are polled after the first one's quiet
// time, and their outcomes, a success and a refused bind, are the same as
// without it: TestMasterCLIReload. Here: a reload that needs longer than
// its quiet time, or less, is confirmed.
func TestAReloadSlowerThanTheLastIsConfirmed(t *testing.T) {
	cli, ctx, _, _ := readyMaster(t, "")
	if res, err := cli.Reload(ctx); err != nil || !res.OK {
		t.Fatalf("first reload: ok=%v err=%v", res.OK, err)
	}
	cli.setReexec(time.Nanosecond) // a quiet time far shorter than the reload
	if res, err := cli.Reload(ctx); err != nil || !res.OK {
		t.Fatalf("reload after a short quiet time: ok=%v err=%v", res.OK, err)
	}
	cli.setReexec(10 * time.Second) // a quiet time of a second, longer than the reload
	before, err := cli.ShowProc(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cli.Reload(ctx)
	if err != nil || !res.OK || res.Procs.Master.Reloads != before.Master.Reloads+1 {
		t.Fatalf("reload after a long quiet time: ok=%v err=%v procs=%+v", res.OK, err, res.Procs)
	}
}

// Only a good reload's time is learned: a refused bind took 2 s on 2.6,
// and waiting that out before the next, good, reload's outcome delayed it
// by as much. On 2.7+, which answer once the reload is done, nothing is.
func TestOnlyAGoodReloadsTimeIsLearned(t *testing.T) {
	cli, ctx, cfg, port := readyMaster(t, "")
	res, err := cli.Reload(ctx)
	if err != nil || !res.OK {
		t.Fatalf("good reload: ok=%v err=%v", res.OK, err)
	}
	answered := res.Messages != "" // 2.7+
	if got := cli.learned(); answered && got != 0 || !answered && got <= 0 {
		t.Errorf("after a good reload (answered by the master: %v) the learned time is %v", answered, got)
	}
	const marker = 7 * time.Millisecond
	cli.setReexec(marker)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	writeConfig(t, cfg, port, fmt.Sprintf("    bind %s\n", busy.Addr()))
	if res, err := cli.Reload(ctx); err != nil || res.OK {
		t.Fatalf("reload with a busy bind: ok=%v err=%v", res.OK, err)
	}
	if got := cli.learned(); got != marker {
		t.Errorf("a failed reload changed the learned time from %v to %v", marker, got)
	}
}

// A quiet time longer than what is left before the deadline still asks
// for the outcome in time: a reload done in about 100 ms was reported
// unconfirmed after a learned 2 s and a deadline of 700 ms.
func TestTheQuietTimeLeavesRoomBeforeTheDeadline(t *testing.T) {
	cli, ctx, _, _ := readyMaster(t, "")
	cli.setReexec(2 * time.Second)
	rctx, rcancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer rcancel()
	if res, err := cli.Reload(rctx); err != nil || !res.OK {
		t.Errorf("reload within 700 ms after a learned 2 s: ok=%v err=%v", res.OK, err)
	}
}

// A quiet time longer than the reload is learned at half of what was
// waited, not all of it: learning all of it shrank a long quiet time by
// only a quarter per reload (8 reloads and 3.5 s late after one slow one).
func TestAnOverlongQuietTimeShrinksByHalf(t *testing.T) {
	cli, ctx, _, _ := readyMaster(t, "")
	cli.setReexec(4 * time.Second) // a quiet time of a second: ten times a reload here
	res, err := cli.Reload(ctx)
	if err != nil || !res.OK {
		t.Fatalf("reload: ok=%v err=%v", res.OK, err)
	}
	if res.Messages != "" {
		t.Skip("2.7+ answers once the reload is done: no quiet time")
	}
	got := cli.learned()
	if got <= 0 || got > 750*time.Millisecond {
		t.Errorf("after a second's quiet time and a reload of about 100 ms, learned %v, want about half a second", got)
	}
}

// HAProxy 2.6 re-executes without a word on the CLI, and its outcome was
// polled every 2 ms for as long (some 290 ms for 2000 backends here: 88
// polls). The polls now grow apart, up to maxPollDelay.
func TestAReloadIsPolledLessOftenAsItLasts(t *testing.T) {
	var backends strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&backends, "backend b%d\n    server s 127.0.0.1:%d\n", i, 1024+i)
	}
	cli, ctx, _, _ := readyMaster(t, backends.String())
	for range 3 {
		cli.setReexec(0) // no quiet time: the polls alone find the outcome
		start := time.Now()
		res, err := cli.Reload(ctx)
		took := time.Since(start)
		if err != nil || !res.OK {
			t.Fatalf("reload: ok=%v err=%v", res.OK, err)
		}
		if res.Messages != "" {
			t.Skip("2.7+ answers the reload itself: nothing is polled")
		}
		t.Logf("%d polls in %v", res.Polls, took.Round(time.Millisecond))
		// 1, 2 and 4 ms apart, then maxPollDelay.
		if most := int(took/maxPollDelay) + 4; res.Polls > most {
			t.Errorf("%d polls in %v, want at most %d", res.Polls, took, most)
		}
	}
}

// A master is not asked `show proc` before a reload when the last one was
// confirmed: 2.7+ answers a reload with its outcome, and the current
// workers after it are the new ones; on 2.6 the `show proc` that confirmed
// the last reload holds the counters from before this one. That was one
// of three connections to the master per reload on 2.7+, of some six on
// 2.6.
func TestAMasterIsNotAskedBeforeAReloadAfterAConfirmedOne(t *testing.T) {
	direct, ctx, _, _ := readyMaster(t, "")
	cli, sent := recordingMaster(t, direct.Addr)
	first, err := cli.Reload(ctx)
	if err != nil || !first.OK {
		t.Fatalf("first reload: ok=%v err=%v", first.OK, err)
	}
	answered := first.Messages != ""
	n := len(sent())
	second, err := cli.Reload(ctx)
	if err != nil || !second.OK {
		t.Fatalf("second reload: ok=%v err=%v", second.OK, err)
	}
	if len(second.NewWorkers) != 1 || slices.Contains(second.NewWorkers, first.Procs.Workers[0].Pid) ||
		second.Procs.Master.Reloads != first.Procs.Master.Reloads+1 {
		t.Errorf("second reload: new workers %v (the first's: %v), reloads %d after %d",
			second.NewWorkers, first.NewWorkers, second.Procs.Master.Reloads, first.Procs.Master.Reloads)
	}
	if cmds := sent()[n:]; len(cmds) == 0 || cmds[0] != "reload" {
		t.Errorf("the second reload began with %q (answered the first: %v), want reload", cmds, answered)
	}
}

// A master that answered a reload but does not answer `show proc` at once
// after it is polled from 1 ms apart on, growing: with the learned quiet
// time's first delay, which is none on 2.7+, it was asked again at once,
// hundreds of times in 20 ms.
func TestAnAnsweredReloadsOutcomeIsPolledApart(t *testing.T) {
	const procs = "#<PID>          <type>          <reloads>       <uptime>        <version>\n" +
		"1               master          %d [failed: 0]  0d00h00m01s     3.2.0\n# workers\n%d               worker          0               0d00h00m01s     3.2.0\n"
	var reloads, failUntil atomic.Int64 // failUntil: unix nanoseconds
	cli, _ := commandSocket(t, false, func(cmd string, c net.Conn) {
		switch {
		case cmd == "reload":
			reloads.Add(1)
			failUntil.Store(time.Now().Add(20 * time.Millisecond).UnixNano())
			_, _ = io.WriteString(c, "Success=1\n--\n")
		case cmd == "show proc" && time.Now().UnixNano() >= failUntil.Load():
			n := reloads.Load()
			fmt.Fprintf(c, procs, n, 100+n)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	res, err := cli.Reload(ctx)
	took := time.Since(start)
	if err != nil || !res.OK {
		t.Fatalf("reload: ok=%v err=%v", res.OK, err)
	}
	// 1, 2 and 4 ms apart, then maxPollDelay.
	if most := int(took/maxPollDelay) + 4; res.Polls > most {
		t.Errorf("%d polls in %v, want at most %d", res.Polls, took, most)
	}
}

// A 2.6 master re-executing for a reload sent by hand drops the
// connections it has not read. A reload sent without a `show proc` before
// it (the last one's counters kept) and dropped so is not sent: the
// counter the hand's reload moved would otherwise pass for its outcome.
// The next reload asks `show proc` first.
func TestAReloadDroppedUnreadIsNotSent(t *testing.T) {
	const procs = "#<PID>          <type>          <reloads>       <uptime>        <version>\n" +
		"1               master          %d [failed: 0]  0d00h00m01s     2.6.12\n# workers\n%d               worker          0               0d00h00m01s     2.6.12\n"
	path := filepath.Join(t.TempDir(), "master.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var (
		reloads atomic.Int32
		mu      sync.Mutex
		sent    []string
	)
	go func() {
		for c, err := l.Accept(); err == nil; c, err = l.Accept() {
			// Wait for the whole command, then look at it unread.
			buf := make([]byte, 64)
			var n int
			raw, _ := c.(*net.UnixConn).SyscallConn()
			_ = raw.Read(func(fd uintptr) bool {
				n, _, err = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK)
				return err != syscall.EAGAIN && (n == 0 || buf[n-1] == '\n')
			})
			cmd := strings.TrimSpace(string(buf[:max(n, 0)]))
			mu.Lock()
			sent = append(sent, cmd)
			mu.Unlock()
			switch {
			case cmd == "reload" && reloads.Load() == 1:
				reloads.Add(1) // by hand; this one is dropped unread
			case cmd == "reload":
				_, _ = io.ReadAll(c)
				reloads.Add(1)
			case cmd == "show proc":
				_, _ = io.ReadAll(c)
				n := reloads.Load()
				fmt.Fprintf(c, procs, n, 100+n)
			}
			c.Close()
		}
	}()
	cli := NewMasterCLI(path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := cli.Reload(ctx); err != nil || !res.OK {
		t.Fatalf("first reload: ok=%v err=%v", res.OK, err)
	}
	if res, err := cli.Reload(ctx); !errors.Is(err, ErrNotSent) {
		t.Fatalf("a reload dropped unread: ok=%v err=%v, want ErrNotSent", res.OK, err)
	}
	mu.Lock()
	n := len(sent)
	mu.Unlock()
	if res, err := cli.Reload(ctx); err != nil || !res.OK || res.Procs.Master.Reloads != 3 {
		t.Fatalf("the reload after: ok=%v err=%v reloads %d, want 3", res.OK, err, res.Procs.Master.Reloads)
	}
	mu.Lock()
	defer mu.Unlock()
	if cmds := sent[n:]; len(cmds) == 0 || cmds[0] != "show proc" {
		t.Errorf("the reload after a dropped one began with %q, want a show proc", cmds)
	}
}

// A reload sent to the master by hand between two of seamless's leaves
// the counters kept from the last one behind. seamless's reload is
// confirmed when the master counts no failure after it (2.6 counts those
// since the last success), and otherwise never taken for a success:
// after two failures of seamless's and a success by hand, a third
// failure showed fewer failures than kept, and a new worker (the one
// by hand).
func TestAReloadByHandBetweenTwoIsNotMistakenRealHAProxy(t *testing.T) {
	cli, ctx, cfg, port := readyMaster(t, "")
	// Each by hand, knowing nothing of the reloads before.
	byHand := func() (ReloadResult, error) { return NewMasterCLI(cli.Addr).Reload(ctx) }
	reload := func(what string, extra string, ok bool) ReloadResult {
		t.Helper()
		writeConfig(t, cfg, port, extra)
		res, err := cli.Reload(ctx)
		if err != nil || res.OK != ok {
			t.Fatalf("%s: ok=%v err=%v, want ok=%v; procs %+v", what, res.OK, err, ok, res.Procs)
		}
		return res
	}
	const broken = "    no-such-keyword\n"
	reload("first reload", "", true)
	good, err := byHand()
	if err != nil || !good.OK {
		t.Fatalf("good reload by hand: ok=%v err=%v", good.OK, err)
	}
	res := reload("reload after a good one by hand", "", true)
	if len(res.NewWorkers) != 1 || slices.Contains(good.NewWorkers, res.NewWorkers[0]) ||
		res.Procs.Master.Reloads != good.Procs.Master.Reloads+1 {
		t.Errorf("new workers %v (by hand's %v), reloads %d after %d",
			res.NewWorkers, good.NewWorkers, res.Procs.Master.Reloads, good.Procs.Master.Reloads)
	}
	reload("a broken configuration", broken, false)
	reload("a broken configuration again", broken, false)
	writeConfig(t, cfg, port, "")
	if good, err := byHand(); err != nil || !good.OK {
		t.Fatalf("good reload by hand: ok=%v err=%v", good.OK, err)
	}
	writeConfig(t, cfg, port, broken)
	if res, err := cli.Reload(ctx); res.OK {
		t.Fatalf("a broken configuration after a good reload by hand: ok=%v err=%v; procs %+v", res.OK, err, res.Procs)
	}
	reload("the reload after", "", true)
}

// With real HAProxy: a reload cut short while the master still loads a
// large configuration is reported sent, and the next reload waits for the
// master rather than being refused at once (3.0 and 3.2 refused it at
// every gap up to 200 ms when it skipped its show proc).
func TestAReloadAfterOneCutShortWaitsForTheMasterRealHAProxy(t *testing.T) {
	var backends strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&backends, "backend b%d\n    server s 127.0.0.1:%d\n", i, 1024+i%60000)
	}
	cli, ctx, _, _ := readyMaster(t, backends.String())
	first, err := cli.Reload(ctx)
	if err != nil || !first.OK {
		t.Fatalf("first reload: ok=%v err=%v", first.OK, err)
	}
	if first.Messages == "" {
		t.Skip("2.6 answers no reload: it is always asked show proc first")
	}
	cut, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = cli.Reload(cut)
	cancel()
	if !errors.Is(err, ErrUnconfirmed) {
		t.Fatalf("a reload cut short after 20 ms: %v, want ErrUnconfirmed (sent)", err)
	}
	if res, err := cli.Reload(ctx); err != nil || !res.OK {
		t.Errorf("the reload after a cut one: ok=%v err=%v", res.OK, err)
	}
}

// fakeMaster answers `show proc` with a master that reloaded as many
// times as it was asked, and the nth `reload` as answer says: hang holds
// the answer back until the test ends. It records each command.
func fakeMaster(t *testing.T, answer func(n int32) (out string, hang bool)) (*MasterCLI, func() []string) {
	t.Helper()
	const procs = "#<PID>          <type>          <reloads>       <uptime>        <version>\n" +
		"1               master          %d [failed: 0]  0d00h00m01s     3.2.0\n# workers\n%d               worker          0               0d00h00m01s     3.2.0\n"
	var reloads atomic.Int32
	gone := make(chan struct{})
	t.Cleanup(func() { close(gone) })
	return commandSocket(t, false, func(cmd string, c net.Conn) {
		switch cmd {
		case "show proc":
			n := reloads.Load()
			fmt.Fprintf(c, procs, n, 100+n)
		case "reload":
			out, hang := answer(reloads.Add(1))
			if hang {
				<-gone
			}
			_, _ = io.WriteString(c, out)
		}
	})
}

// A reload cut short by its deadline was sent: it is unconfirmed, never
// "not sent" (which would reload again), also when the connection's
// deadline, which is the context's, passes before the context's own timer
// says so. And the master may still be executing it: the next reload asks
// `show proc` first, even of a master that answered reloads before, where
// it was refused at once while the master re-executed.
func TestAReloadCutShortIsSentAndTheNextWaitsForTheMaster(t *testing.T) {
	cli, sent := fakeMaster(t, func(n int32) (string, bool) {
		if n == 1 || n == 12 {
			return "Success=1\n--\n", false
		}
		return "", true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if res, err := cli.Reload(ctx); err != nil || !res.OK {
		t.Fatalf("answered reload: ok=%v err=%v", res.OK, err)
	}
	for i := range 10 {
		cut, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err := cli.Reload(cut)
		cancel()
		if !errors.Is(err, ErrUnconfirmed) || errors.Is(err, ErrNotSent) {
			t.Fatalf("reload %d cut short by its deadline: %v, want ErrUnconfirmed", i+2, err)
		}
	}
	n := len(sent())
	if res, err := cli.Reload(ctx); err != nil || !res.OK {
		t.Fatalf("reload after the cut ones: ok=%v err=%v", res.OK, err)
	}
	if cmds := sent()[n:]; len(cmds) == 0 || cmds[0] != "show proc" {
		t.Errorf("the reload after a cut one began with %q, want a show proc", cmds)
	}
}

// A master that answered the last reload and then closes the next one's
// connection without a word leaves that reload unconfirmed: without the
// counters from before it, `show proc` cannot tell its outcome from the
// last one's. A fake master, since a real one does not change its ways.
func TestAReloadNotAnsweredAsTheLastIsUnconfirmed(t *testing.T) {
	cli, _ := fakeMaster(t, func(n int32) (string, bool) {
		if n == 1 {
			return "Success=1\n--\n", false
		}
		return "", false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := cli.Reload(ctx); err != nil || !res.OK || !slices.Equal(res.NewWorkers, []int{101}) {
		t.Fatalf("answered reload: ok=%v new workers %v err=%v", res.OK, res.NewWorkers, err)
	}
	if res, err := cli.Reload(ctx); !errors.Is(err, ErrUnconfirmed) || res.OK {
		t.Errorf("a reload answered with nothing after an answered one: ok=%v err=%v, want ErrUnconfirmed", res.OK, err)
	}
}

// A runtime change whose connection was never made changed nothing
// (ErrNotApplied), and the applier may go on reckoning from what ran; a
// command HAProxy refused may follow others it took, and is not that.
func TestRuntimeCommandsThatNeverReachedHAProxyAreNotApplied(t *testing.T) {
	cli, ctx, _, _ := readyMaster(t, "backend b\n    server s 127.0.0.1:1\n")
	gone := Runtime{CLI: NewMasterCLI(filepath.Join(t.TempDir(), "gone.sock"))}
	if err := gone.Apply(ctx, []string{"set server b/s addr 127.0.0.2 port 2"}); !errors.Is(err, ErrNotApplied) {
		t.Errorf("no master to connect to: %v, want ErrNotApplied", err)
	}
	if _, err := gone.ApplyAndRead(ctx, []string{"set server b/s addr 127.0.0.2 port 2"}, []string{"b"}); !errors.Is(err, ErrNotApplied) {
		t.Errorf("no master to connect to, with a read: %v, want ErrNotApplied", err)
	}
	rt := Runtime{CLI: cli}
	if err := rt.Apply(ctx, []string{"set server b/s addr 127.0.0.2 port 2", "set server b/s weight 7; shutdown sessions server b/s"}); !errors.Is(err, ErrNotApplied) {
		t.Errorf("a command that would run as two: %v, want ErrNotApplied", err)
	}
	err := rt.Apply(ctx, []string{"set server b/s addr 127.0.0.2 port 2", "set server nosuch/s addr 127.0.0.3 port 3"})
	if err == nil || errors.Is(err, ErrNotApplied) {
		t.Errorf("a command refused after one taken: %v, want an error that is not ErrNotApplied", err)
	}
}

// Commands the worker socket carried to another process (one still
// loading may become the current worker) were sent, even when the master
// they then go through cannot be reached: not ErrNotApplied.
func TestRuntimeCommandsThatReachedAnotherProcessAreNotNotApplied(t *testing.T) {
	dir := t.TempDir()
	masterPath, workerPath := filepath.Join(dir, "master.sock"), filepath.Join(dir, "worker.sock")
	// The master answers one show proc, naming worker 101, then is gone.
	ml, err := net.Listen("unix", masterPath)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := ml.Accept()
		ml.Close()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = bufio.NewReader(c).ReadString('\n')
		_, _ = io.WriteString(c, "#<PID>          <type>          <reloads>       <uptime>        <version>\n"+
			"1               master          0 [failed: 0]  0d00h00m01s     3.2.0\n# workers\n101               worker          0               0d00h00m01s     3.2.0\n")
	}()
	// The socket reaches process 202.
	wl, err := net.Listen("unix", workerPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wl.Close() })
	go func() {
		for c, err := wl.Accept(); err == nil; c, err = wl.Accept() {
			_, _ = bufio.NewReader(c).ReadString('\n')
			_, _ = io.WriteString(c, "Name: HAProxy\nPid: 202\n\n\n")
			c.Close()
		}
	}()
	rt := Runtime{CLI: NewMasterCLI(masterPath), Worker: NewWorkerSocket(workerPath)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = rt.Apply(ctx, []string{"set server b/s addr 127.0.0.2 port 2"})
	if err == nil || errors.Is(err, ErrNotApplied) {
		t.Errorf("commands that reached process 202, then no master: %v, want an error that is not ErrNotApplied", err)
	}
}
