//go:build docker

package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// The tests of this file run against a real Docker engine: `go test -tags
// docker`. Everything they create is named seamless-test-<random>-... and
// removed by ID when they end; the source reaches the engine through a
// proxy that refuses anything but the reads a read-only socket proxy
// allows.

// image is the test containers' image, built once: FROM scratch with the
// static testdata/box.
var image struct {
	once sync.Once
	tag  string
	id   string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if image.id != "" {
		if c, err := client.New(client.FromEnv); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := c.ImageRemove(ctx, image.id, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
				fmt.Fprintf(os.Stderr, "removing the test image %s: %v\n", image.tag, err)
			}
			cancel()
			c.Close()
		}
	}
	os.Exit(code)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// lab is one test's containers and networks.
type lab struct {
	t      *testing.T
	c      *client.Client
	image  string
	prefix string // of every name: seamless-test-<random>-
}

func newLab(t *testing.T) *lab {
	t.Helper()
	c, err := client.New(client.FromEnv)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = c.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
	}
	if err != nil {
		if testenv.CI() {
			t.Fatalf("no Docker engine under CI: %v", err)
		}
		t.Skipf("no Docker engine: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	image.once.Do(func() { image.tag, image.id, image.err = buildImage(c) })
	if image.err != nil {
		t.Fatalf("building the test image: %v", image.err)
	}
	return &lab{t: t, c: c, image: image.id, prefix: "seamless-test-" + randomHex(4) + "-"}
}

// buildImage builds testdata/box statically and an image FROM scratch
// holding it; no registry is needed.
func buildImage(c *client.Client) (tag, id string, err error) {
	dir, err := os.MkdirTemp("", "seamless-test-box-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "box")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/box")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build ./testdata/box: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", "", err
	}
	var ctxTar bytes.Buffer
	tw := tar.NewWriter(&ctxTar)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{
		{"Dockerfile", 0o644, []byte("FROM scratch\nCOPY box /box\nENTRYPOINT [\"/box\"]\n")},
		{"box", 0o755, data},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return "", "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", "", err
	}
	tag = "seamless-test-box:" + randomHex(4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.ImageBuild(ctx, &ctxTar, client.ImageBuildOptions{
		Tags: []string{tag}, Remove: true, ForceRemove: true, Version: build.BuilderV1,
	})
	if err != nil {
		return "", "", err
	}
	defer res.Body.Close()
	dec := json.NewDecoder(res.Body)
	for {
		var msg struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			break
		} else if err != nil {
			return "", "", err
		}
		if msg.Error != "" {
			return "", "", fmt.Errorf("docker build: %s", msg.Error)
		}
	}
	insp, err := c.ImageInspect(ctx, tag)
	if err != nil {
		return "", "", err
	}
	return tag, insp.ID, nil
}

// network creates a bridge network and returns its name.
func (l *lab) network(name string) string {
	l.t.Helper()
	name = l.prefix + name
	res, err := l.c.NetworkCreate(context.Background(), name, client.NetworkCreateOptions{
		Driver: "bridge", Labels: map[string]string{"seamless.test": l.t.Name()},
	})
	if err != nil {
		l.t.Fatalf("creating network %s: %v", name, err)
	}
	l.t.Cleanup(func() {
		if _, err := l.c.NetworkRemove(context.Background(), res.ID, client.NetworkRemoveOptions{}); err != nil {
			l.t.Errorf("removing network %s: %v", name, err)
		}
	})
	return name
}

// box is a test container: it answers on ports (TCP), which it exposes.
type box struct {
	network string
	labels  map[string]string
	ports   []string
	exit    string // the healthcheck's exit status; "": no healthcheck
	drain   string // how long it goes on serving after SIGTERM
}

// enabled is the opt-in label with more label=value pairs.
func enabled(kv ...string) map[string]string {
	l := map[string]string{LabelEnable: "true"}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return l
}

// run creates and starts a container named prefix+name; it returns its ID.
func (l *lab) run(name string, b box) string {
	l.t.Helper()
	if len(b.ports) == 0 {
		b.ports = []string{"8080"}
	}
	cfg := &container.Config{Image: l.image, Cmd: b.ports, Labels: b.labels, ExposedPorts: network.PortSet{}}
	if b.drain != "" {
		cfg.Cmd = append([]string{"drain=" + b.drain}, b.ports...)
	}
	for _, p := range b.ports {
		cfg.ExposedPorts[network.MustParsePort(p+"/tcp")] = struct{}{}
	}
	if b.exit != "" {
		cfg.Healthcheck = &container.HealthConfig{
			Test: []string{"CMD", "/box", "exit", b.exit}, Interval: time.Second, Timeout: 5 * time.Second, Retries: 1,
		}
	}
	ctx := context.Background()
	res, err := l.c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: l.prefix + name, Config: cfg, HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(b.network)},
	})
	if err != nil {
		l.t.Fatalf("creating container %s: %v", name, err)
	}
	l.t.Cleanup(func() {
		_, err := l.c.ContainerRemove(context.Background(), res.ID, client.ContainerRemoveOptions{Force: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			l.t.Errorf("removing container %s: %v", name, err)
		}
	})
	if _, err := l.c.ContainerStart(ctx, res.ID, client.ContainerStartOptions{}); err != nil {
		l.t.Fatalf("starting container %s: %v", name, err)
	}
	testenv.Eventually(l.t, 30*time.Second, "container "+name+" ready", func() bool {
		r, err := l.c.ContainerLogs(ctx, res.ID, client.ContainerLogsOptions{ShowStdout: true})
		if err != nil {
			return false
		}
		defer r.Close()
		out, _ := io.ReadAll(r)
		return strings.Contains(string(out), "ready")
	})
	return res.ID
}

// ip is the container's IPv4 address on network.
func (l *lab) ip(id, network string) string {
	l.t.Helper()
	res, err := l.c.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	ep := res.Container.NetworkSettings.Networks[network]
	if ep == nil {
		l.t.Fatalf("container %s is not on %s", id, network)
	}
	return ep.IPAddress.String()
}

// created is the container's creation time in nanoseconds, as Docker
// reports it: the source's registration order.
func (l *lab) created(id string) uint64 {
	l.t.Helper()
	res, err := l.c.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	t, err := time.Parse(time.RFC3339Nano, res.Container.Created)
	if err != nil {
		l.t.Fatalf("container %s: created %q: %v", id, res.Container.Created, err)
	}
	return uint64(t.UnixNano())
}

func (l *lab) stop(id string) {
	l.t.Helper()
	if _, err := l.c.ContainerStop(context.Background(), id, client.ContainerStopOptions{}); err != nil {
		l.t.Fatal(err)
	}
}

// engineProxy stands between the source and the engine, on a unix socket
// of its own. It lets through only what a read-only socket proxy allows
// (and fails the test on anything else), and can go down, come back, or
// swallow events.
type engineProxy struct {
	t       *testing.T
	path    string
	handler http.Handler
	blind   atomic.Bool // /events answers and then says nothing

	mu         sync.Mutex
	srv        *http.Server
	violations []string
}

// readOnlyAPI is what the docs promise the source needs.
var readOnlyAPI = regexp.MustCompile(`^(/v1\.[0-9]+)?/(_ping|version|events|containers/json|containers/[0-9a-f]{12,64}/json)$`)

func newProxy(t *testing.T, c *client.Client) *engineProxy {
	t.Helper()
	p := &engineProxy{t: t, path: socketPath(t)}
	dial := c.Dialer()
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = "http", "docker", "docker"
		},
		Transport:     &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0), // a stream cut by down is expected
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusBadGateway)
		},
	}
	p.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method != http.MethodGet && r.Method != http.MethodHead) || !readOnlyAPI.MatchString(r.URL.Path) {
			p.mu.Lock()
			p.violations = append(p.violations, r.Method+" "+r.URL.Path)
			p.mu.Unlock()
			http.Error(w, "refused by the test's read-only proxy", http.StatusForbidden)
			return
		}
		if p.blind.Load() && readOnlyAPI.FindStringSubmatch(r.URL.Path)[2] == "events" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		rp.ServeHTTP(w, r)
	})
	p.up()
	t.Cleanup(func() {
		p.down()
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.violations) > 0 {
			t.Errorf("the source made calls a read-only socket proxy refuses: %q", p.violations)
		}
	})
	return p
}

func (p *engineProxy) up() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	os.Remove(p.path)
	l, err := net.Listen("unix", p.path)
	if err != nil {
		p.t.Fatal(err)
	}
	p.srv = &http.Server{Handler: p.handler}
	go p.srv.Serve(l)
}

// down closes the socket and every connection, the event stream too.
func (p *engineProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.Close()
		p.srv = nil
	}
}

// config is a source configuration that reaches the engine through p.
func (p *engineProxy) config(network string, rescan time.Duration) Config {
	return Config{Network: network, Rescan: rescan, ClientOptions: []client.Opt{client.WithHost("unix://" + p.path)}}
}
