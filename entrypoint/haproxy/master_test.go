package haproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	cfg := fmt.Sprintf(`global
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
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
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
