package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// The image runs seamless as the user HAProxy's external checks and
// `program` children run as: they must not read seamless's environment
// (CONSUL_HTTP_TOKEN) from /proc/<pid>/environ. A process that is not
// dumpable has its /proc files owned by root (issue 10, item 4).
func TestTheEnvironmentIsNotReadableByTheSameUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start seamless as another user")
	}
	if os.Getenv("SEAMLESS_HAPROXY_BIN") != "" {
		// What is tested is seamless's own process, not HAProxy's; and
		// the matrix's HAProxy runs in a mount namespace only root can make.
		t.Skip("not version-dependent: runs with the host's HAProxy only")
	}
	const nobody = 65534
	testenv.HAProxy(t)
	dir, err := os.MkdirTemp("", "seamless-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "seamless")
	copyFile(t, seamlessBin, bin)
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(run, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("defaults\n    mode http\n    timeout client 5s\n    timeout server 5s\n    timeout connect 5s\nfrontend fe\n    bind 127.0.0.1:%d\n    http-request return status 200\n", testenv.FreePort(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	status := testenv.Addr(testenv.FreePort(t))
	cmd := exec.Command(bin, "haproxy", "-f", cfg)
	cmd.Env = append(os.Environ(), "SEAMLESS_RUN_DIR="+run, "SEAMLESS_STATUS_ADDR="+status, "CONSUL_HTTP_TOKEN=secret-token")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("seamless output:\n%s", out.String())
		}
	})
	testenv.Eventually(t, 20*time.Second, "seamless serving as nobody", func() bool {
		code, _ := testenv.Get("http://" + status + "/healthz")
		return code == 200
	})
	environ := fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid)
	fi, err := os.Stat(environ)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 0 {
		t.Errorf("%s is owned by uid %d: the same user's children can read CONSUL_HTTP_TOKEN there", environ, uid)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
