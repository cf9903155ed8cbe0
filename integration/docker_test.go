//go:build docker

// Package integration runs the seamless image on a real Docker engine
// (`make image` builds it; `make test` runs this with -tags docker). Ports
// are published on 127.0.0.1 only, and every load is bounded.
package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// images under test, one per HAProxy version of the matrix.
func images() []string {
	if v := os.Getenv("SEAMLESS_IMAGES"); v != "" {
		return strings.Fields(v)
	}
	return []string{"seamless:haproxy-3.0", "seamless:haproxy-3.2"}
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
	t.Cleanup(func() { c.Close() })
	return c
}

// box is one running seamless container.
type box struct {
	t      *testing.T
	c      *client.Client
	id     string
	dir    string // mounted at /usr/local/etc/haproxy
	front  string // 127.0.0.1:port of the frontend
	status string // 127.0.0.1:port of seamless's status endpoint
}

const frontendCfg = `global
    log stderr format raw local0 notice
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option idle-close-on-response
frontend fe
    bind :8080
    # A body that arrives slowly keeps a request in flight (the drain test).
    http-request wait-for-body time 20s at-least 5 if { method POST }
    http-request return status 200 content-type text/plain string "v%d"
`

func (b *box) write(version int) {
	b.t.Helper()
	p := filepath.Join(b.dir, "haproxy.cfg")
	if err := os.WriteFile(p+".tmp", []byte(fmt.Sprintf(frontendCfg, version)), 0o644); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		b.t.Fatal(err)
	}
}

func start(t *testing.T, c *client.Client, image string) *box {
	t.Helper()
	return startBox(t, c, image, false)
}

// startBox starts image; official runs HAProxy itself as PID 1, as the
// official image does (`haproxy -W -db`), with no seamless in front.
func startBox(t *testing.T, c *client.Client, image string, official bool) *box {
	t.Helper()
	dir, err := os.MkdirTemp("", "seamless-docker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The container runs as the image's haproxy user.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &box{t: t, c: c, dir: dir}
	b.write(0)

	loopback := netip.MustParseAddr("127.0.0.1")
	ctx := context.Background()
	fe, st := network.MustParsePort("8080/tcp"), network.MustParsePort("8405/tcp")
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:        image,
			ExposedPorts: network.PortSet{fe: {}, st: {}},
			Labels:       map[string]string{"seamless.test": t.Name()},
			Entrypoint:   entrypoint(official),
			Cmd:          command(official),
			Healthcheck:  healthcheck(official),
		},
		HostConfig: &container.HostConfig{
			Binds: []string{dir + ":/usr/local/etc/haproxy:ro"},
			PortBindings: network.PortMap{
				fe: {{HostIP: loopback}},
				st: {{HostIP: loopback}},
			},
		},
	})
	if err != nil {
		t.Fatalf("create %s: %v", image, err)
	}
	b.id = res.ID
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("container logs:\n%s", b.logs())
		}
		_, _ = c.ContainerRemove(context.Background(), b.id, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := c.ContainerStart(ctx, b.id, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("start: %v", err)
	}
	insp := b.inspect()
	b.front = hostAddr(t, insp.NetworkSettings.Ports[fe])
	b.status = hostAddr(t, insp.NetworkSettings.Ports[st])
	testenv.Eventually(t, 30*time.Second, "the container serves", func() bool {
		code := 200
		if !official {
			code, _ = testenv.Get("http://" + b.status + "/healthz")
		}
		body := ""
		if code == 200 {
			_, body = testenv.Get("http://" + b.front + "/")
		}
		return body == "v0"
	})
	return b
}

func entrypoint(official bool) []string {
	if official {
		return []string{"haproxy"}
	}
	return nil
}

func command(official bool) []string {
	if official {
		return []string{"-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"}
	}
	return nil
}

func healthcheck(official bool) *container.HealthConfig {
	if official {
		return &container.HealthConfig{Test: []string{"NONE"}}
	}
	return nil
}

func hostAddr(t *testing.T, bs []network.PortBinding) string {
	t.Helper()
	if len(bs) == 0 {
		t.Fatal("port not published")
	}
	return net.JoinHostPort("127.0.0.1", bs[0].HostPort)
}

func (b *box) inspect() container.InspectResponse {
	b.t.Helper()
	r, err := b.c.ContainerInspect(context.Background(), b.id, client.ContainerInspectOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	return r.Container
}

func (b *box) logs() string {
	r, err := b.c.ContainerLogs(context.Background(), b.id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	out, _ := io.ReadAll(r)
	return string(out)
}

func (b *box) kill(sig string) {
	b.t.Helper()
	if _, err := b.c.ContainerKill(context.Background(), b.id, client.ContainerKillOptions{Signal: sig}); err != nil {
		b.t.Fatalf("docker kill -s %s: %v", sig, err)
	}
}

func (b *box) metric(name string) float64 {
	b.t.Helper()
	return testenv.Metric(b.t, b.status, name)
}

// procs counts the container's HAProxy processes and zombies as seen from
// the host (the test runs as root on the engine's host).
func (b *box) procs() (haproxy, zombies int) {
	b.t.Helper()
	for _, p := range procfs.Descendants(b.inspect().State.Pid) {
		switch {
		case p.Zombie():
			zombies++
		case p.Name == "haproxy":
			haproxy++
		}
	}
	return haproxy, zombies
}

// startLoads starts new-connection and keep-alive clients on front, bounded
// in count and time; the caller stops them (and cleanup does too).
func startLoads(t *testing.T, front string) []*loadgen.Load {
	t.Helper()
	var loads []*loadgen.Load
	for _, m := range []loadgen.Mode{loadgen.NewConn, loadgen.KeepAlive} {
		l, err := loadgen.Start(context.Background(), loadgen.Config{
			Target: front, Mode: m, Workers: 8, MaxRequests: 5_000_000, MaxDuration: 5 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Stop() })
		loads = append(loads, l)
	}
	return loads
}

// TestDockerKillHUPUnderLoad is the headline: 100 `docker kill -s HUP`
// under load, the config changing before every other one, drop nothing;
// the last config runs; no zombie and no leftover worker remain.
func TestDockerKillHUPUnderLoad(t *testing.T) {
	c := dockerClient(t)
	for _, image := range images() {
		t.Run(image, func(t *testing.T) {
			b := start(t, c, image)
			loads := startLoads(t, b.front)
			last := 0
			for i := 1; i <= 100; i++ {
				if i%2 == 0 {
					last = i
					b.write(last)
				}
				before := b.metric(`seamless_reloads_total{result="success"}`)
				b.kill("HUP")
				testenv.Eventually(t, 30*time.Second, fmt.Sprintf("reload %d confirmed", i), func() bool {
					return b.metric(`seamless_reloads_total{result="success"}`) > before
				})
			}
			testenv.Eventually(t, 10*time.Second, "the last config serves", func() bool {
				_, body := testenv.Get("http://" + b.front + "/")
				return body == fmt.Sprintf("v%d", last)
			})
			for i, l := range loads {
				r := l.Stop()
				t.Logf("%s: %d requests, %d failed %v", []string{"new connection", "keep-alive"}[i], r.Requests, r.Failed, r.Errors)
				if r.Failed != 0 || r.Requests < 1000 {
					t.Errorf("%d of %d requests failed: %v", r.Failed, r.Requests, r.Errors)
				}
			}
			testenv.Eventually(t, 30*time.Second, "one master and one worker, no zombie", func() bool {
				h, z := b.procs()
				return h == 2 && z == 0
			})
		})
	}
}

// TestDockerStopDrains: `docker stop` while a request is in flight lets it
// finish, and the container exits 0 well within Docker's 10 s.
func TestDockerStopDrains(t *testing.T) {
	c := dockerClient(t)
	for _, image := range images() {
		t.Run(image, func(t *testing.T) {
			b := start(t, c, image)
			conn, err := net.DialTimeout("tcp", b.front, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
			br := bufio.NewReader(conn)
			// One full exchange proves HAProxy owns the connection, then a
			// request whose body is still on its way.
			fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
				t.Fatalf("first request: %v", err)
			} else {
				io.Copy(io.Discard, resp.Body)
			}
			fmt.Fprint(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")

			begin := time.Now()
			stopped := make(chan error, 1)
			go func() {
				_, err := c.ContainerStop(context.Background(), b.id, client.ContainerStopOptions{})
				stopped <- err
			}()
			// The worker, not only seamless, must be stopping before the
			// body completes: a response sent before the worker's soft-stop
			// leaves an idle keep-alive connection that
			// idle-close-on-response keeps open until the grace ends.
			testenv.Eventually(t, 10*time.Second, "the worker stopped its frontend", func() bool {
				logs := b.logs()
				return strings.Contains(logs, "stopping: haproxy stops accepting") && strings.Contains(logs, "Proxy fe stopped")
			})
			fmt.Fprint(conn, "cde")
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("in-flight request during docker stop: %v", err)
			}
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
			if d := time.Since(begin); d > 9*time.Second {
				t.Errorf("docker stop took %s", d)
			}
			if st := b.inspect().State; st.ExitCode != 0 {
				t.Errorf("exit code %d, want 0", st.ExitCode)
			}
		})
	}
}

// TestSideBySideWithTheOfficialImage runs the headline twice under the same
// load and pacing — 100 `docker kill -s HUP` 100 ms apart, the config
// changing before every other one — once through seamless and once with
// HAProxy itself as PID 1 (`haproxy -W -db`, what the official image
// runs), and prints the numbers side by side. Only seamless's are asserted:
// no failed request, and the last config runs.
func TestSideBySideWithTheOfficialImage(t *testing.T) {
	c := dockerClient(t)
	imgs := images()
	image := imgs[len(imgs)-1]
	type row struct {
		name             string
		requests, failed [2]int64
		lastRuns         bool
		served           string
	}
	var rows []row
	for _, official := range []bool{false, true} {
		name := "seamless"
		if official {
			name = "haproxy -W -db as PID 1"
		}
		b := startBox(t, c, image, official)
		loads := startLoads(t, b.front)
		last := 0
		tick := time.NewTicker(100 * time.Millisecond)
		for i := 1; i <= 100; i++ {
			if i%2 == 0 {
				last = i
				b.write(last)
			}
			b.kill("HUP")
			<-tick.C // the pacing of the scenario, not a synchronisation
		}
		tick.Stop()
		r := row{name: name}
		want := fmt.Sprintf("v%d", last)
		// Give both the same chance to settle.
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if _, r.served = testenv.Get("http://" + b.front + "/"); r.served == want {
				r.lastRuns = true
				break
			}
			time.Sleep(100 * time.Millisecond) // polling interval
		}
		for i, l := range loads {
			res := l.Stop()
			r.requests[i], r.failed[i] = res.Requests, res.Failed
		}
		rows = append(rows, r)
		if !official {
			if r.failed != [2]int64{} || !r.lastRuns {
				t.Errorf("seamless: %d and %d failed requests, serves %q, want %q", r.failed[0], r.failed[1], r.served, want)
			}
		}
		_, _ = c.ContainerRemove(context.Background(), b.id, client.ContainerRemoveOptions{Force: true})
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\n%s, 100 x docker kill -s HUP 100 ms apart, config changed before every other one:\n", image)
	fmt.Fprintf(&out, "%-24s | %-27s | %-27s | %s\n", "PID 1", "new connection: failed/all", "keep-alive: failed/all", "last config runs")
	for _, r := range rows {
		fmt.Fprintf(&out, "%-24s | %12d / %-12d | %12d / %-12d | %v (serves %s)\n", r.name,
			r.failed[0], r.requests[0], r.failed[1], r.requests[1], r.lastRuns, r.served)
	}
	t.Log(out.String())
}
