// Package consulproc runs a real Consul server outside of tests, for the
// discovery benchmarks of cmd/seamless-bench: a single server bound to
// 127.0.0.1 on free ports, with a persistent data directory (not
// `consul agent -dev`), as internal/testenv does for the tests.
package consulproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/testenv/freeport"
)

// Version is the Consul the benchmarks run; `make consul` builds it.
const Version = "1.14.11"

// DefaultBin is $SEAMLESS_CONSUL_BIN, else the agent `make consul` builds.
func DefaultBin() string {
	if bin := os.Getenv("SEAMLESS_CONSUL_BIN"); bin != "" {
		return bin
	}
	return "/var/cache/seamless/consul/consul-" + Version
}

// Options configure Start.
type Options struct {
	Bin string // the consul binary; DefaultBin() when empty
	// Dir holds the data directory and consul.log; it must exist. Its path
	// is in the agent's command line, which tells our process from others.
	Dir      string
	Node     string        // the agent's node name; "seamless-bench" when empty
	LogLevel string        // "info" when empty
	Timeout  time.Duration // for the agent to elect itself and settle; 60s when 0
	// HCL are further configuration fragments, one -hcl flag each, e.g.
	// "limits { http_max_conns_per_client = 1000 }".
	HCL []string
}

// Agent is a running Consul server.
type Agent struct {
	node    string
	http    int
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
}

// Start starts the agent and waits until it has elected itself leader and
// written everything it writes about itself at start, so that the catalog
// stays quiet until the caller changes it.
func Start(ctx context.Context, o Options) (*Agent, error) {
	if o.Bin == "" {
		o.Bin = DefaultBin()
	}
	if o.Node == "" {
		o.Node = "seamless-bench"
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	if _, err := os.Stat(o.Bin); err != nil {
		return nil, fmt.Errorf("consul agent: %w (make consul builds it; or set SEAMLESS_CONSUL_BIN)", err)
	}
	ports, err := freeport.Get(5)
	if err != nil {
		return nil, err
	}
	a := &Agent{node: o.Node, http: ports[0], LogPath: filepath.Join(o.Dir, "consul.log"), exited: make(chan struct{})}
	args := []string{"agent",
		"-server", "-bootstrap-expect=1", "-node=" + o.Node, "-datacenter=dc1",
		"-bind=127.0.0.1", "-advertise=127.0.0.1", "-client=127.0.0.1",
		"-data-dir=" + filepath.Join(o.Dir, "data"), "-log-level=" + o.LogLevel,
		"-http-port=" + strconv.Itoa(ports[0]),
		"-server-port=" + strconv.Itoa(ports[1]),
		"-serf-lan-port=" + strconv.Itoa(ports[2]),
		"-serf-wan-port=" + strconv.Itoa(ports[3]),
		"-dns-port=-1", "-grpc-port=-1",
		"-hcl=ports { https = -1, grpc_tls = -1 }",
		"-hcl=performance { raft_multiplier = 1 }",
		"-hcl=disable_update_check = true",
	}
	for _, h := range o.HCL {
		args = append(args, "-hcl="+h)
	}
	logf, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	a.cmd = exec.Command(o.Bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	// A group of its own: a ctrl-C at the terminal reaches only the
	// benchmark, which stops the agent in order. Killed with its starter,
	// whose cleanup may never run (a test's timeout); Go threads do not
	// exit under a running program, so only the process's death fires it.
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = a.cmd.Start()
	logf.Close() // the child has its own descriptor
	if err != nil {
		return nil, fmt.Errorf("starting consul: %w", err)
	}
	go func() {
		_ = a.cmd.Wait()
		close(a.exited)
	}()
	if err := a.waitSettled(ctx, o.Timeout); err != nil {
		a.Stop()
		return nil, err
	}
	return a, nil
}

// Addr is the HTTP API's host:port, as CONSUL_HTTP_ADDR takes it.
func (a *Agent) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.http)) }

// Node is the agent's node name.
func (a *Agent) Node() string { return a.node }

// Pid is the agent's process id.
func (a *Agent) Pid() int { return a.cmd.Process.Pid }

// Client returns an API client for the agent that ignores Consul's
// environment variables (a token meant for another cluster).
func (a *Agent) Client() (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token, cfg.TokenFile = a.Addr(), "http", "", ""
	cfg.TLSConfig = api.TLSConfig{}
	return api.NewClient(cfg)
}

func (a *Agent) waitSettled(ctx context.Context, timeout time.Duration) error {
	c, err := a.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-a.exited:
			return fmt.Errorf("consul exited while starting (see %s)", a.LogPath)
		default:
		}
		if a.settled(c, (&api.QueryOptions{}).WithContext(ctx)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consul not ready within %v (see %s): %w", timeout, a.LogPath, ctx.Err())
		case <-t.C:
		}
	}
}

// settled: a leader, and the node as the leader registers it (the consul
// service, a passing serfHealth) with the tagged addresses of the agent's
// own sync, which comes a moment later.
func (a *Agent) settled(c *api.Client, q *api.QueryOptions) bool {
	if leader, err := c.Status().LeaderWithQueryOptions(q); err != nil || leader == "" {
		return false
	}
	n, _, err := c.Catalog().Node(a.node, q)
	if err != nil || n == nil || n.Node == nil || n.Node.TaggedAddresses["lan"] == "" || n.Services["consul"] == nil {
		return false
	}
	checks, _, err := c.Health().Node(a.node, q)
	return err == nil && slices.ContainsFunc(checks, func(h *api.HealthCheck) bool {
		return h.CheckID == "serfHealth" && h.Status == api.HealthPassing
	})
}

// Stop stops the agent (SIGTERM, then SIGKILL to its group after 10 s) and
// waits until it has exited. Stopping an exited agent is a no-op.
func (a *Agent) Stop() error {
	select {
	case <-a.exited:
		return nil
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
		return nil
	case <-time.After(10 * time.Second):
	}
	// The leader is unreaped until exited is closed, so the pid still
	// names our group.
	_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("consul (pid %d) survived SIGKILL", a.cmd.Process.Pid)
	}
	return errors.New("consul did not stop within 10s of SIGTERM; killed")
}
