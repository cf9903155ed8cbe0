package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
)

// errExited marks errors that end a run: a process the scenario depends on
// is gone, so further reloads would measure nothing.
var errExited = errors.New("process exited")

// proc is a child started by the benchmark, leader of its own process group
// so that a ctrl-C at the terminal reaches only us and we stop it in order.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the result of Wait, set before done is closed
}

// startProc starts argv with stdout and stderr appended to logf. env nil
// means the benchmark's own environment.
func startProc(name string, logf *os.File, env []string, argv ...string) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	// An *os.File is handed to the child directly: no copying goroutine
	// that a daemonised grandchild could keep blocked.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	// Killed with the benchmark, whatever stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive returns an error wrapping errExited once the process has exited.
func (p *proc) alive() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s (pid %d): %w: %v", p.name, p.pid(), errExited, p.err)
	default:
		return nil
	}
}

func (p *proc) signal(sig syscall.Signal) error {
	if err := p.alive(); err != nil {
		return err
	}
	return p.cmd.Process.Signal(sig)
}

// stop sends sig and waits up to grace for the process to exit; after that
// it kills the process group with SIGKILL. Stopping an exited process is a
// no-op.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	if p.alive() != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	// The leader is still unreaped, so its pid still names our group.
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) survived SIGKILL", p.name, p.pid())
	}
	return fmt.Errorf("%s (pid %d) did not exit within %v of %v; killed", p.name, p.pid(), grace, sig)
}

// poll calls check every interval until it reports done, returns an error
// wrapping errExited, or timeout passes. Other errors from check are
// transient and only reported if time runs out.
func poll(ctx context.Context, every, timeout time.Duration, what string, check func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(every)
	defer t.Stop()
	var last error
	for {
		done, err := check()
		if done {
			return nil
		}
		if errors.Is(err, errExited) {
			return err
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// probeClient checks readiness and reads metrics; it is never used for the
// measured load (its Transport retries, which is harmless here).
var probeClient = &http.Client{Timeout: time.Second}

// getHTTP fetches url and returns the status code and body.
func getHTTP(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

// frontendServes reports whether the frontend answers a request with 200.
func frontendServes(ctx context.Context, addr string) (bool, error) {
	code, body, err := getHTTP(ctx, "http://"+addr+"/")
	if err != nil {
		return false, err
	}
	if code != http.StatusOK {
		return false, fmt.Errorf("frontend answered %d: %.80q", code, body)
	}
	return true, nil
}

// acceptsTCP reports whether something accepts connections on addr.
func acceptsTCP(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// freeAddr returns a loopback address with a port that was free a moment
// ago (freeport.Get). Another process could take it before we bind; the
// run then fails visibly rather than measuring the wrong thing.
func freeAddr() (string, error) {
	addrs, err := freeAddrs(1)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}

// readPidfile returns the pids listed one a line in path.
func readPidfile(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			return nil, fmt.Errorf("pidfile %s: bad pid %q", path, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// stopDaemonsIn stops the HAProxy daemons of a private directory dir: the
// pidfile's, and every process that names dir, since old daemons may
// still be finishing and a launcher cut short may have left one it never
// wrote to the pidfile.
func stopDaemonsIn(pidfile, dir string, grace time.Duration) error {
	pids, _ := readPidfile(pidfile)
	for _, pid := range procfs.Mentioning(dir) {
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	return stopDaemons(pids, dir, grace)
}

// stopDaemons sends SIGTERM to those of pids that we own, waits up to grace
// for them to go, then sends SIGKILL to the rest.
func stopDaemons(pids []int, marker string, grace time.Duration) error {
	live := func() []int {
		var out []int
		for _, pid := range pids {
			if procfs.Mentions(pid, marker) {
				out = append(out, pid)
			}
		}
		return out
	}
	for _, pid := range live() {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	err := poll(context.Background(), 10*time.Millisecond, grace, "daemons exit", func() (bool, error) {
		return len(live()) == 0, nil
	})
	if err == nil {
		return nil
	}
	left := live()
	for _, pid := range left {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return fmt.Errorf("haproxy pids %v did not exit within %v of SIGTERM; killed", left, grace)
}

// tail returns the last n lines of the file at path, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
