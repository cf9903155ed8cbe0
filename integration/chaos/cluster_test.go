//go:build docker

package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// Images, as the Makefile builds them (make image image-consul
// image-demo-backend).
func image(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

var (
	seamlessImage = image("SEAMLESS_IMAGE", "seamless:haproxy-3.2")
	consulImage   = image("CONSUL_IMAGE", "seamless-consul:1.14.11")
	backendImage  = image("DEMO_BACKEND_IMAGE", "seamless-demo-backend")
)

// node is one container of the cluster with its fixed addresses: a
// container disconnected from a network and connected again keeps its
// address, so the Consul agents' bind addresses stay true.
type node struct {
	id, name string
	wan, lan netip.Addr // invalid when not on that network
	agent    *node      // a backend's Consul agent
	spec     spec       // what it was started with
}

// cluster is the topology: Consul servers on the "wan" network only;
// client agents on "wan" and "lan"; seamless replicas and backends on
// "lan" only. Cutting an agent from "wan" cuts it from the servers while
// its replica and backends still reach it.
type cluster struct {
	t        testing.TB // the whole test's, its failures recorded
	c        *client.Client
	run      string // unique name prefix
	wan, lan *subnet
	servers  []*node
	agents   []*node
	replicas []*replica
	backends map[string][]*node // by service, running
	started  map[string]int     // backends ever started, by service (their names)
	nextIP   byte
}

type subnet struct {
	id     string
	prefix netip.Prefix
}

type replica struct {
	node
	front, status string // 127.0.0.1:port
}

func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.FromEnv, client.WithAPIVersionNegotiation())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = c.Ping(ctx, client.PingOptions{})
		cancel()
	}
	if err != nil {
		if testenv.CI() {
			t.Fatalf("no Docker engine under CI: %v", err)
		}
		t.Skipf("no Docker engine: %v", err)
	}
	for _, img := range []string{seamlessImage, consulImage, backendImage} {
		if _, err := c.ImageInspect(context.Background(), img); err != nil {
			if testenv.CI() {
				t.Fatalf("image %s missing under CI: %v", img, err)
			}
			t.Skipf("image %s missing: %v (make image image-consul image-demo-backend)", img, err)
		}
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newCluster(t testing.TB, c *client.Client) *cluster {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	k := &cluster{t: t, c: c, run: "seamlesschaos" + hex.EncodeToString(b), backends: map[string][]*node{}, started: map[string]int{}, nextIP: 10}
	k.wan = k.network("wan")
	k.lan = k.network("lan")
	return k
}

// network creates a bridge network on a free private /24 of its own (fixed
// addresses need a subnet named at creation), removed when the test ends,
// after every container.
func (k *cluster) network(name string) *subnet {
	k.t.Helper()
	var lastErr error
	for range 20 {
		n, _ := rand.Int(rand.Reader, big.NewInt(250*250))
		v := int(n.Int64())
		prefix := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(3 + v/250), byte(v % 250), 0}), 24)
		res, err := k.c.NetworkCreate(context.Background(), k.run+"-"+name, client.NetworkCreateOptions{
			Driver: "bridge",
			IPAM:   &network.IPAM{Config: []network.IPAMConfig{{Subnet: prefix}}},
			Labels: map[string]string{"seamless.test": k.t.Name()},
		})
		if err != nil {
			lastErr = err
			continue
		}
		k.t.Cleanup(func() {
			if _, err := k.c.NetworkRemove(context.Background(), res.ID, client.NetworkRemoveOptions{}); err != nil {
				k.t.Errorf("remove network %s: %v", name, err)
			}
		})
		return &subnet{id: res.ID, prefix: prefix}
	}
	k.t.Fatalf("no free subnet for network %s: %v", name, lastErr)
	return nil
}

func (k *cluster) addr(s *subnet) netip.Addr {
	k.nextIP++
	a := s.prefix.Addr().As4()
	a[3] = k.nextIP
	return netip.AddrFrom4(a)
}

// spec is what a container needs beyond its image.
type spec struct {
	image, name string
	cmd, env    []string
	wan, lan    bool
	wanIP       netip.Addr // preassigned wan address, when the command names it
	publish     []string   // container ports published on 127.0.0.1
	// fixed host ports for some of them (kept across a restart)
	hostPorts map[string]int
}

// start creates and starts a container, removed with its volumes when the
// test ends (its logs shown first if the test failed).
func (k *cluster) start(s spec) *node {
	k.t.Helper()
	n := &node{name: k.run + "-" + s.name, spec: s}
	if s.wan {
		n.wan = s.wanIP
		if !n.wan.IsValid() {
			n.wan = k.addr(k.wan)
		}
	}
	if s.lan {
		n.lan = k.addr(k.lan)
	}
	exposed, bindings := network.PortSet{}, network.PortMap{}
	for _, p := range s.publish {
		port := network.MustParsePort(p)
		exposed[port] = struct{}{}
		b := network.PortBinding{HostIP: netip.MustParseAddr("127.0.0.1")}
		if hp := s.hostPorts[p]; hp != 0 {
			b.HostPort = strconv.Itoa(hp)
		}
		bindings[port] = []network.PortBinding{b}
	}
	first, firstAddr := k.wan, n.wan
	if !s.wan {
		first, firstAddr = k.lan, n.lan
	}
	ctx := context.Background()
	res, err := k.c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: n.name,
		Config: &container.Config{
			Image: s.image, Cmd: s.cmd, Env: s.env, Hostname: s.name,
			ExposedPorts: exposed,
			Labels:       map[string]string{"seamless.test": k.t.Name()},
		},
		HostConfig: &container.HostConfig{PortBindings: bindings},
		NetworkingConfig: &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			first.id: {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: firstAddr}},
		}},
	})
	if err != nil {
		k.t.Fatalf("create %s: %v", s.name, err)
	}
	n.id = res.ID
	// By its id: recreate overwrites *n with the new container's node.
	this := node{id: n.id, name: n.name}
	k.t.Cleanup(func() {
		_, err := k.c.ContainerInspect(context.Background(), this.id, client.ContainerInspectOptions{})
		if cerrdefs.IsNotFound(err) { // recreate removed it already
			return
		}
		if k.t.Failed() {
			k.t.Logf("logs of %s:\n%s", s.name, k.logs(&this, "60"))
		}
		_, err = k.c.ContainerRemove(context.Background(), this.id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			k.t.Errorf("remove %s: %v", s.name, err)
		}
	})
	if s.wan && s.lan {
		k.connect(n, k.lan, n.lan)
	}
	if _, err := k.c.ContainerStart(ctx, n.id, client.ContainerStartOptions{}); err != nil {
		k.t.Fatalf("start %s: %v", s.name, err)
	}
	return n
}

// recreate removes n with its volumes (its data dir) and starts it again,
// as it was, with cmd; the new container replaces n's.
func (k *cluster) recreate(n *node, cmd []string) {
	k.t.Helper()
	if _, err := k.c.ContainerRemove(context.Background(), n.id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
		k.t.Fatalf("remove %s: %v", n.name, err)
	}
	s := n.spec
	s.wanIP, s.cmd = n.wan, cmd
	*n = *k.start(s)
}

func (k *cluster) connect(n *node, s *subnet, a netip.Addr) {
	k.t.Helper()
	_, err := k.c.NetworkConnect(context.Background(), s.id, client.NetworkConnectOptions{
		Container: n.id, EndpointConfig: &network.EndpointSettings{IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: a}},
	})
	if err != nil {
		k.t.Fatalf("connect %s: %v", n.name, err)
	}
}

func (k *cluster) disconnect(n *node, s *subnet) {
	k.t.Helper()
	if _, err := k.c.NetworkDisconnect(context.Background(), s.id, client.NetworkDisconnectOptions{Container: n.id, Force: true}); err != nil {
		k.t.Fatalf("disconnect %s: %v", n.name, err)
	}
}

func (k *cluster) logs(n *node, tail string) string {
	return k.readLogs(n, client.ContainerLogsOptions{Tail: tail})
}

// logsAround is n's log from 10 s before at to 2 s after it: what a
// replica did when a request through it failed.
func (k *cluster) logsAround(n *node, at time.Time) string {
	return k.readLogs(n, client.ContainerLogsOptions{
		Since: strconv.FormatInt(at.Add(-10*time.Second).Unix(), 10), Until: strconv.FormatInt(at.Add(2*time.Second).Unix(), 10)})
}

// readLogs is n's stdout and stderr as opts selects them.
func (k *cluster) readLogs(n *node, opts client.ContainerLogsOptions) string {
	opts.ShowStdout, opts.ShowStderr = true, true
	r, err := k.c.ContainerLogs(context.Background(), n.id, opts)
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	out, _ := io.ReadAll(r)
	return string(out)
}

func (k *cluster) kill(n *node, sig string) {
	k.t.Helper()
	if _, err := k.c.ContainerKill(context.Background(), n.id, client.ContainerKillOptions{Signal: sig}); err != nil {
		k.t.Fatalf("kill -s %s %s: %v", sig, n.name, err)
	}
}

func (k *cluster) restart(n *node) {
	k.t.Helper()
	if _, err := k.c.ContainerStart(context.Background(), n.id, client.ContainerStartOptions{}); err != nil {
		k.t.Fatalf("start %s again: %v", n.name, err)
	}
}

// stop stops a container gracefully (SIGTERM; a backend deregisters and
// drains) and waits for it to exit.
func (k *cluster) stop(n *node) {
	k.t.Helper()
	timeout := 20
	if _, err := k.c.ContainerStop(context.Background(), n.id, client.ContainerStopOptions{Timeout: &timeout}); err != nil {
		k.t.Fatalf("stop %s: %v", n.name, err)
	}
}

func (k *cluster) published(n *node, port string) string {
	k.t.Helper()
	r, err := k.c.ContainerInspect(context.Background(), n.id, client.ContainerInspectOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	bs := r.Container.NetworkSettings.Ports[network.MustParsePort(port)]
	if len(bs) == 0 {
		k.t.Fatalf("%s: port %s not published", n.name, port)
	}
	return net.JoinHostPort("127.0.0.1", bs[0].HostPort)
}

// consulCmd is the command line of a Consul agent of the cluster: raft's
// timing at its fastest (raft_multiplier 1, as Consul advises for
// production), the servers joined by address.
func (k *cluster) consulCmd(name string, bind netip.Addr, server bool, joins []netip.Addr) []string {
	cmd := []string{"agent", "-node=" + name, "-data-dir=/consul/data", "-bind=" + bind.String(),
		"-client=0.0.0.0", "-log-level=warn", "-hcl=performance { raft_multiplier = 1 }"}
	if server {
		cmd = append(cmd, "-server", "-bootstrap-expect=3")
	}
	for _, j := range joins {
		cmd = append(cmd, "-retry-join="+j.String())
	}
	return cmd
}

// up starts 3 servers, 3 agents and a replica beside each agent.
func (k *cluster) up() {
	k.t.Helper()
	// Addresses first: each server joins the others by address.
	var joins []netip.Addr
	for range 3 {
		joins = append(joins, k.addr(k.wan))
	}
	for i, ip := range joins {
		name := fmt.Sprintf("server%d", i+1)
		k.servers = append(k.servers, k.start(spec{image: consulImage, name: name, wan: true, wanIP: ip,
			cmd: k.consulCmd(name, ip, true, joins)}))
	}
	for i := range 3 {
		name := fmt.Sprintf("agent%d", i+1)
		ip := k.addr(k.wan)
		k.agents = append(k.agents, k.start(spec{image: consulImage, name: name, wan: true, lan: true, wanIP: ip,
			cmd: k.consulCmd(name, ip, false, joins), publish: []string{"8500/tcp"}}))
	}
	testenv.Eventually(k.t, 90*time.Second, "a Consul leader is elected and the agents are members", func() bool {
		return k.leader() != "" && k.aliveMembers() == 6
	})
	for i, a := range k.agents {
		name := fmt.Sprintf("replica%d", i+1)
		// Fixed host ports: a replica killed and started again is found,
		// and loaded, where it was.
		ports := map[string]int{"5001/tcp": testenv.FreePort(k.t), "8405/tcp": testenv.FreePort(k.t)}
		n := k.start(spec{image: seamlessImage, name: name, lan: true, publish: []string{"5001/tcp", "8405/tcp"}, hostPorts: ports,
			cmd: []string{"haproxy"},
			env: []string{"SEAMLESS_SOURCES=consul", "CONSUL_HTTP_ADDR=" + a.lan.String() + ":8500",
				"SEAMLESS_HTTP_BIND=:5001", "SEAMLESS_STATS_BIND=:8404", "SEAMLESS_HTTPS_BIND=",
				// Removed instances drain for 2 s (the backends' own
				// drain) so that replicas agree soon after a change.
				"SEAMLESS_DRAIN_TIMEOUT=2s",
				// Each runtime command in the logs a failed step shows.
				"SEAMLESS_LOG_LEVEL=debug"}})
		r := &replica{node: *n}
		r.front, r.status = k.published(n, "5001/tcp"), k.published(n, "8405/tcp")
		k.replicas = append(k.replicas, r)
	}
}

// addBackend starts a demo backend of service registered through agent.
func (k *cluster) addBackend(service string, agent *node) *node {
	k.t.Helper()
	tags := "seamless.http.host=127.0.0.1"
	if service != "web" {
		tags += ",seamless.http.path=/" + service
	}
	k.started[service]++
	name := fmt.Sprintf("%s%d", service, k.started[service])
	n := k.start(spec{image: backendImage, name: name, lan: true,
		cmd: []string{"-listen=:8080", "-consul=" + agent.lan.String() + ":8500", "-service=" + service,
			"-id=" + name, "-tags=" + tags, "-drain=2s", "-check-interval=1s",
			// Deregistered by retire, it must stay so.
			"-resync=1h"}})
	n.agent = agent
	k.backends[service] = append(k.backends[service], n)
	return n
}

// removeBackend stops the newest backend of service gracefully: it
// deregisters, keeps serving for its drain, then exits.
func (k *cluster) removeBackend(service string) {
	k.t.Helper()
	bs := k.backends[service]
	k.stop(bs[len(bs)-1])
	k.backends[service] = bs[:len(bs)-1]
}

// retire deregisters the newest backend of service from Consul and
// leaves it running: a replica that cannot hear of the removal (its agent
// cut off) may keep sending it requests until it does. The caller stops it
// once every replica has converged.
func (k *cluster) retire(service string) *node {
	k.t.Helper()
	bs := k.backends[service]
	n := bs[len(bs)-1]
	id := strings.TrimPrefix(n.name, k.run+"-")
	req, _ := http.NewRequest(http.MethodPut, "http://"+k.published(n.agent, "8500/tcp")+"/v1/agent/service/deregister/"+id, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatalf("deregister %s: %v", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		k.t.Fatalf("deregister %s: %s", id, resp.Status)
	}
	k.backends[service] = bs[:len(bs)-1]
	return n
}

// want is the set of addresses each service's running backends have.
func (k *cluster) want() map[string][]string {
	out := map[string][]string{}
	for svc, bs := range k.backends {
		for _, b := range bs {
			out[svc] = append(out[svc], b.lan.String()+":8080")
		}
		slices.Sort(out[svc])
	}
	return out
}

func getJSON(url string, v any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// agentAPI is the HTTP API of the first agent that is not cut off.
func (k *cluster) agentAPI() string { return "http://" + k.published(k.agents[0], "8500/tcp") }

// leader is the raft leader's address as the first agent knows it.
func (k *cluster) leader() string {
	var l string
	if getJSON(k.agentAPI()+"/v1/status/leader", &l) != nil {
		return ""
	}
	return l
}

func (k *cluster) aliveMembers() int {
	var ms []struct{ Status int }
	if getJSON(k.agentAPI()+"/v1/agent/members", &ms) != nil {
		return 0
	}
	n := 0
	for _, m := range ms {
		if m.Status == 1 {
			n++
		}
	}
	return n
}

// catalog is what agent says passes, per service (read from the servers).
func (k *cluster) catalog(agent *node) map[string][]string {
	out := map[string][]string{}
	for svc := range k.backends {
		var es []struct {
			Service struct {
				Address string
				Port    int
			}
		}
		if getJSON("http://"+k.published(agent, "8500/tcp")+"/v1/health/service/"+svc+"?passing", &es) != nil {
			return nil
		}
		for _, e := range es {
			out[svc] = append(out[svc], fmt.Sprintf("%s:%d", e.Service.Address, e.Service.Port))
		}
		slices.Sort(out[svc])
	}
	return out
}

// streamingView is what agent says passes, per service, from its own
// streaming view, as a replica's blocking query reads it: a query with an
// index is served from that view (Consul 1.10+), one without is forwarded
// to the servers. Index 1 answers at once (the view is past it).
func (k *cluster) streamingView(agent *node) map[string][]string {
	out := map[string][]string{}
	for svc := range k.backends {
		var es []struct {
			Service struct {
				Address string
				Port    int
			}
		}
		if getJSON("http://"+k.published(agent, "8500/tcp")+"/v1/health/service/"+svc+"?passing&index=1&wait=2s", &es) != nil {
			return nil
		}
		for _, e := range es {
			out[svc] = append(out[svc], fmt.Sprintf("%s:%d", e.Service.Address, e.Service.Port))
		}
		slices.Sort(out[svc])
	}
	return out
}

var configInfoRe = regexp.MustCompile(`(?m)^seamless_config_info\{members_sha256="([0-9a-f]*)",sha256="([0-9a-f]+)"\} 1$`)

// fingerprint is a replica's seamless_config_info.
func (r *replica) fingerprint() (sha, members string) {
	_, body := testenv.Get("http://" + r.status + "/metrics")
	m := configInfoRe.FindStringSubmatch(body)
	if m == nil {
		return "", ""
	}
	return m[2], m[1]
}

// consulIndex is the Consul index the replica's configuration was
// rendered from (/status consul_index), for the log; 0 when unknown.
func (r *replica) consulIndex() uint64 {
	var st status.Report
	if getJSON("http://"+r.status+"/status", &st) != nil {
		return 0
	}
	var top uint64
	for _, i := range st.ConsulIndex { // one datacenter here
		top = max(top, i)
	}
	return top
}

// serving is what the replica's HAProxy has UP, per service, from /status.
func (r *replica) serving() map[string][]string {
	var st status.Report
	if getJSON("http://"+r.status+"/status", &st) != nil || st.BackendsError != "" {
		return nil // unknown, not empty: the worker did not answer (a reload)
	}
	out := map[string][]string{}
	for _, b := range st.Backends {
		svc, ok := strings.CutPrefix(b.Name, "http-")
		if !ok {
			continue
		}
		for _, s := range b.Servers {
			if s.Instance != "" && strings.HasPrefix(s.State, "UP") {
				out[svc] = append(out[svc], s.Address)
			}
		}
		slices.Sort(out[svc])
	}
	return out
}

// procs lists the replica's processes as `ps -o pid,stat,comm` on the
// host sees them.
func (k *cluster) procs(n *node) (haproxy int, zombies []string) {
	k.t.Helper()
	res, err := k.c.ContainerTop(context.Background(), n.id, client.ContainerTopOptions{Arguments: []string{"-o", "pid,stat,comm"}})
	if err != nil {
		k.t.Fatalf("top %s: %v", n.name, err)
	}
	for _, p := range res.Processes {
		if len(p) < 3 {
			continue
		}
		if strings.HasPrefix(p[1], "Z") {
			zombies = append(zombies, strings.Join(p, " "))
		}
		if p[2] == "haproxy" {
			haproxy++
		}
	}
	return haproxy, zombies
}

func equalSets(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// failures keeps the test's failure messages to say them again when it
// ends, after the containers' logs: the tail of a long CI log then shows
// what failed, not only which subtests.
type failures struct {
	mu   sync.Mutex
	msgs []string
}

// record is t with its failures kept in f as well.
func (f *failures) record(t testing.TB) testing.TB { return recording{t, f} }

func (f *failures) say(t *testing.T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !t.Failed() {
		return
	}
	t.Logf("%d failures, again:", len(f.msgs))
	for _, m := range f.msgs {
		t.Log(m)
	}
}

type recording struct {
	testing.TB
	f *failures
}

func (r recording) keep(msg string) {
	r.f.mu.Lock()
	r.f.msgs = append(r.f.msgs, r.Name()+": "+msg)
	r.f.mu.Unlock()
}

func (r recording) Error(args ...any) {
	r.Helper()
	r.Errorf("%s", fmt.Sprint(args...))
}

func (r recording) Errorf(format string, args ...any) {
	r.Helper()
	r.keep(fmt.Sprintf(format, args...))
	r.TB.Errorf(format, args...)
}

func (r recording) Fatal(args ...any) {
	r.Helper()
	r.Fatalf("%s", fmt.Sprint(args...))
}

func (r recording) Fatalf(format string, args ...any) {
	r.Helper()
	r.keep(fmt.Sprintf(format, args...))
	r.TB.Fatalf(format, args...)
}
