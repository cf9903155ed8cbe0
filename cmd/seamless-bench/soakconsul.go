package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/testenv/freeport"
)

// devAgent is a `consul agent -dev` that the soak stops and starts again
// on the same ports, so that seamless keeps one CONSUL_HTTP_ADDR. A dev
// agent keeps its data in memory: each start is an empty catalog with its
// index back at the beginning, which is what seamless's guard is for.
type devAgent struct {
	bin, dir string
	ports    []int // http, server, serf lan, serf wan
	p        *proc
	logf     *os.File
	starts   int
}

const devNode = "soak"

func newDevAgent(bin, dir string) (*devAgent, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("consul agent: %w (make consul builds it; or set SEAMLESS_CONSUL_BIN)", err)
	}
	ports, err := freeport.Get(4)
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "consul.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &devAgent{bin: bin, dir: dir, ports: ports, logf: logf}, nil
}

func (a *devAgent) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.ports[0])) }

// client ignores Consul's environment variables (a token meant for
// another cluster).
func (a *devAgent) client() (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token, cfg.TokenFile = a.addr(), "http", "", ""
	cfg.TLSConfig = api.TLSConfig{}
	return api.NewClient(cfg)
}

// start starts the agent and waits until it has elected itself and
// registered its own node, so that registrations through it succeed.
func (a *devAgent) start(ctx context.Context) error {
	a.starts++
	fmt.Fprintf(a.logf, "=== soak: start %d\n", a.starts)
	// The pid file names the run's directory in the command line, which
	// tells our agent from any other on the machine.
	p, err := startProc("consul", a.logf, nil, a.bin, "agent", "-dev",
		"-node="+devNode, "-bind=127.0.0.1", "-advertise=127.0.0.1", "-client=127.0.0.1",
		"-pid-file="+filepath.Join(a.dir, "consul.pid"), "-log-level=warn",
		"-http-port="+strconv.Itoa(a.ports[0]),
		"-server-port="+strconv.Itoa(a.ports[1]),
		"-serf-lan-port="+strconv.Itoa(a.ports[2]),
		"-serf-wan-port="+strconv.Itoa(a.ports[3]),
		"-dns-port=-1", "-grpc-port=-1",
		"-hcl=ports { https = -1, grpc_tls = -1 }",
		"-hcl=disable_update_check = true")
	if err != nil {
		return err
	}
	a.p = p
	c, err := a.client()
	if err != nil {
		return err
	}
	return poll(ctx, 50*time.Millisecond, time.Minute, "consul dev agent settles", func() (bool, error) {
		if err := p.alive(); err != nil {
			return false, err
		}
		q := (&api.QueryOptions{}).WithContext(ctx)
		if leader, err := c.Status().LeaderWithQueryOptions(q); err != nil || leader == "" {
			return false, err
		}
		checks, _, err := c.Health().Node(devNode, q)
		return err == nil && slices.ContainsFunc(checks, func(h *api.HealthCheck) bool {
			return h.CheckID == "serfHealth" && h.Status == api.HealthPassing
		}), err
	})
}

// stop stops the agent as an operator would (SIGTERM), killing it after
// a grace period.
func (a *devAgent) stop() error {
	if a.p == nil {
		return nil
	}
	return a.p.stop(syscall.SIGTERM, 15*time.Second)
}

func (a *devAgent) close() error {
	err := a.stop()
	a.logf.Close()
	return err
}

// restart is a Consul that comes back empty: stopped, then started again
// on the same ports.
func (a *devAgent) restart(ctx context.Context) (down time.Duration, err error) {
	t0 := time.Now()
	if err := a.stop(); err != nil {
		return 0, err
	}
	// Its HTTP port must be free again before the new agent binds it.
	if err := poll(ctx, 20*time.Millisecond, 30*time.Second, "consul's port free", func() (bool, error) {
		return !acceptsTCP(a.addr()), nil
	}); err != nil {
		return 0, err
	}
	err = a.start(ctx)
	return time.Since(t0), err
}
