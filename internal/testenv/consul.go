package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// ConsulVersion is the Consul the tests run; `make consul` builds it.
const ConsulVersion = "1.14.11"

// ConsulAgent is a real Consul agent for a test: a single server, bound to
// 127.0.0.1 on free ports, with its data in a temporary directory. Unlike
// `consul agent -dev`, whose Raft store lives in memory, it keeps its
// catalog and KV across Stop and Start, so a test can take Consul away and
// bring back the same cluster. It is killed when the test ends.
type ConsulAgent struct {
	t    testing.TB
	bin  string
	dir  string // data directory
	node string
	log  string // the agent's output, shown when the test fails
	args []string
	http int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// ConsulBin returns the Consul agent binary: $SEAMLESS_CONSUL_BIN, else the
// one `make consul` builds. Without it the test is skipped, or fails under
// CI.
func ConsulBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("SEAMLESS_CONSUL_BIN")
	if bin == "" {
		bin = "/var/cache/seamless/consul/consul-" + ConsulVersion
	}
	if _, err := os.Stat(bin); err != nil {
		if CI() {
			t.Fatalf("Consul agent not found under CI (make consul builds it): %v", err)
		}
		t.Skipf("Consul agent not found: %v (run make consul)", err)
	}
	return bin
}

// Consul starts a Consul server for t and waits until it has elected
// itself leader and registered its own node.
func Consul(t testing.TB) *ConsulAgent {
	t.Helper()
	a := &ConsulAgent{t: t, bin: ConsulBin(t), node: "seamless-test"}
	root := t.TempDir()
	a.dir = filepath.Join(root, "data")
	a.log = filepath.Join(root, "consul.log")
	ports := FreePorts(t, 4)
	a.http = ports[0]
	a.args = []string{"agent",
		"-server", "-bootstrap-expect=1", "-node=" + a.node, "-datacenter=dc1",
		"-bind=127.0.0.1", "-advertise=127.0.0.1", "-client=127.0.0.1",
		"-data-dir=" + a.dir, "-log-level=debug",
		"-http-port=" + strconv.Itoa(a.http),
		"-server-port=" + strconv.Itoa(ports[1]),
		"-serf-lan-port=" + strconv.Itoa(ports[2]),
		"-serf-wan-port=" + strconv.Itoa(ports[3]),
		"-dns-port=-1", "-grpc-port=-1",
		"-hcl=ports { https = -1, grpc_tls = -1 }",
		"-hcl=performance { raft_multiplier = 1 }",
		"-hcl=disable_update_check = true",
	}
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			if b, err := os.ReadFile(a.log); err == nil {
				t.Logf("consul output (last 8 KiB):\n%s", tail(b, 8<<10))
			}
		}
	})
	a.Start()
	return a
}

// Addr is the HTTP API's host:port, as CONSUL_HTTP_ADDR takes it.
func (a *ConsulAgent) Addr() string { return Addr(a.http) }

// Node is the agent's node name.
func (a *ConsulAgent) Node() string { return a.node }

// Client returns a new API client for the agent.
func (a *ConsulAgent) Client() *api.Client {
	a.t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token, cfg.TokenFile = a.Addr(), "http", "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

// Start starts the agent (again, after Stop: same ports, same data) and
// waits until it serves.
func (a *ConsulAgent) Start() {
	a.t.Helper()
	a.mu.Lock()
	if a.cmd != nil {
		a.mu.Unlock()
		a.t.Fatal("consul is already running")
	}
	logf, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		a.mu.Unlock()
		a.t.Fatal(err)
	}
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with the test process, whose cleanup a timeout's panic skips.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	logf.Close() // the child has its own descriptor
	if err != nil {
		a.mu.Unlock()
		a.t.Fatalf("starting consul: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	a.cmd, a.exited = cmd, exited
	a.mu.Unlock()

	c := a.Client()
	Eventually(a.t, 30*time.Second, "consul elected a leader and registered its node", func() bool {
		select {
		case <-exited:
			a.t.Fatalf("consul exited while starting (see its output below)")
		default:
		}
		leader, err := c.Status().Leader()
		return err == nil && leader != "" && a.settled(c)
	})
}

// settled reports whether the catalog holds everything a starting agent
// writes about itself, so that it stays quiet until the test changes
// something: the node as the leader registers it (the consul service, a
// passing serfHealth), then the agent's own sync of its node (the tagged
// addresses), a moment later.
func (a *ConsulAgent) settled(c *api.Client) bool {
	n, _, err := c.Catalog().Node(a.node, nil)
	if err != nil || n == nil || n.Node == nil || n.Node.TaggedAddresses["lan"] == "" || n.Services["consul"] == nil {
		return false
	}
	checks, _, err := c.Health().Node(a.node, nil)
	return err == nil && slices.ContainsFunc(checks, func(h *api.HealthCheck) bool {
		return h.CheckID == "serfHealth" && h.Status == api.HealthPassing
	})
}

// Stop stops the agent gracefully (SIGTERM, SIGKILL after 10 s) and waits
// until it has exited; its ports are then closed.
func (a *ConsulAgent) Stop() {
	a.t.Helper()
	if err := a.stop(); err != nil {
		a.t.Fatal(err)
	}
}

func (a *ConsulAgent) stop() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return errors.New("consul is not running")
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		err = fmt.Errorf("consul did not stop within 10s of SIGTERM; killed")
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.exited
	}
	a.cmd = nil
	return err
}

// Wipe deletes the stopped agent's data: the next Start is a Consul that
// restarted empty, on the same ports.
func (a *ConsulAgent) Wipe() {
	a.t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		a.t.Fatal("consul is running; stop it before wiping its data")
	}
	if err := os.RemoveAll(a.dir); err != nil {
		a.t.Fatal(err)
	}
}

// Signal sends sig to the running agent (SIGSTOP freezes it, SIGCONT
// wakes it).
func (a *ConsulAgent) Signal(sig syscall.Signal) {
	a.t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		a.t.Fatal("consul is not running")
	}
	if err := a.cmd.Process.Signal(sig); err != nil {
		a.t.Fatal(err)
	}
}

// Freeze stops the agent with SIGSTOP (it accepts connections and
// answers nothing) and returns thaw, which wakes it; a test that ends
// frozen is thawed at its cleanup.
func (a *ConsulAgent) Freeze() (thaw func()) {
	a.t.Helper()
	a.Signal(syscall.SIGSTOP)
	var once sync.Once
	thaw = func() { once.Do(func() { a.Signal(syscall.SIGCONT) }) }
	a.t.Cleanup(thaw)
	return thaw
}

// kill ends the agent at once, if it runs.
func (a *ConsulAgent) kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return
	}
	_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
	<-a.exited
	a.cmd = nil
}

func tail(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return b
}
