//go:build docker

package integration

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/integration/compose"
	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// composeImages are the images the compose examples run, from the same
// variables the compose files read; the defaults are what `make image`,
// `make image-consul` and `make image-demo-backend` build. Compose would
// try to pull a missing one from a registry, so each must exist first:
// the test is skipped without them, and fails under CI.
func composeImages(t *testing.T, c *client.Client, names ...string) map[string]string {
	t.Helper()
	defaults := map[string]string{
		"SEAMLESS_IMAGE":     "seamless:haproxy-3.2",
		"CONSUL_IMAGE":       "seamless-consul:1.14.11",
		"DEMO_BACKEND_IMAGE": "seamless-demo-backend",
	}
	env := map[string]string{}
	for _, name := range names {
		image := os.Getenv(name)
		if image == "" {
			image = defaults[name]
		}
		if _, err := c.ImageInspect(context.Background(), image); err != nil {
			if testenv.CI() {
				t.Fatalf("image %s (%s) missing under CI: %v", image, name, err)
			}
			t.Skipf("image %s (%s) missing: %v (make image image-consul image-demo-backend)", image, name, err)
		}
		env[name] = image
	}
	return env
}

// composeServers lists the running containers of a compose service by the
// name demo-backend answers with: the container's host name, which Docker
// sets to the first 12 characters of its ID.
func composeServers(t *testing.T, c *client.Client, project, service string) []string {
	t.Helper()
	res, err := c.ContainerList(context.Background(), client.ContainerListOptions{
		Filters: make(client.Filters).
			Add("label", "com.docker.compose.project="+project).
			Add("label", "com.docker.compose.service="+service).
			Add("status", "running"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range res.Items {
		names = append(names, s.ID[:12])
	}
	slices.Sort(names)
	return names
}

// answering sends n requests, each on a new connection, and returns who
// answered, sorted, and whether every request got a 200.
func answering(front string, n int) ([]string, bool) {
	seen := map[string]bool{}
	for range n {
		code, body := testenv.Get("http://" + front + "/")
		if code != 200 {
			return nil, false
		}
		seen[strings.TrimPrefix(body, "hello from ")] = true
	}
	return slices.Sorted(maps.Keys(seen)), true
}

// statsUp counts the servers of an HAProxy backend that are UP on the stats
// page (CSV export); -1 if the page does not answer. Empty server slots
// (MAINT) and removed instances finishing their requests (DRAIN) are not
// UP.
func statsUp(stats, backend string) int {
	code, body := testenv.Get("http://" + stats + "/haproxy?stats;csv")
	if code != 200 {
		return -1
	}
	up := 0
	for line := range strings.Lines(body) {
		f := strings.Split(line, ",")
		if len(f) > 17 && f[0] == backend && f[1] != "FRONTEND" && f[1] != "BACKEND" && f[17] == "UP" {
			up++
		}
	}
	return up
}

// freePorts returns the environment variables of a compose example's
// published ports, each a free loopback port, so that a test never
// collides with an example somebody runs on the default ports.
func freePorts(t *testing.T, names ...string) (map[string]string, map[string]string) {
	env, addr := map[string]string{}, map[string]string{}
	for _, name := range names {
		p := testenv.FreePort(t)
		env[name], addr[name] = strconv.Itoa(p), testenv.Addr(p)
	}
	return env, addr
}

// TestComposeConsulScale is compose/consul under load: the service on its
// published port while web is scaled 3 → 5 → 2 → 3 with
// `up --scale web=N --no-recreate`. After each step the traffic reaches
// exactly the running replicas, and across the whole run no request of a
// new-connection or a keep-alive client fails: a new replica takes traffic
// once its Consul check passes, a removed one deregisters and drains
// before it stops. Both ways seamless applies a membership change are
// run: over HAProxy's runtime API (server slots, the default) and by
// reloads (SEAMLESS_SERVER_SLOTS=0).
func TestComposeConsulScale(t *testing.T) {
	c := dockerClient(t)
	images := composeImages(t, c, "SEAMLESS_IMAGE", "CONSUL_IMAGE", "DEMO_BACKEND_IMAGE")
	for _, tt := range []struct {
		name, slots string
		applied     string // the metric that counts how changes were applied
	}{
		{"runtime API", "8", `seamless_runtime_updates_total{result="success"}`},
		{"reloads", "0", `seamless_reloads_total{result="success"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := maps.Clone(images)
			env["SEAMLESS_SERVER_SLOTS"] = tt.slots
			scaleUnderLoad(t, c, "../compose/consul/docker-compose.yml", env, tt.applied, "CONSUL_HTTP_PORT")
		})
	}
}

// TestComposeDockerScale is compose/docker under the same load and steps:
// seamless follows the containers' labels through the Docker socket; a
// removed replica keeps serving for its -drain after SIGTERM while seamless
// drains it (the kill event).
func TestComposeDockerScale(t *testing.T) {
	c := dockerClient(t)
	env := composeImages(t, c, "SEAMLESS_IMAGE", "DEMO_BACKEND_IMAGE")
	sock, err := os.Stat("/var/run/docker.sock")
	if err != nil {
		if testenv.CI() {
			t.Fatalf("no Docker socket to mount under CI: %v", err)
		}
		t.Skipf("no Docker socket to mount: %v", err)
	}
	env["DOCKER_GID"] = strconv.FormatUint(uint64(sock.Sys().(*syscall.Stat_t).Gid), 10)
	// The backends' network, named so that SEAMLESS_DOCKER_NETWORK can
	// name it, and unique so that labelled containers of anything else on
	// this engine stay out.
	env["BACKEND_NETWORK"] = fmt.Sprintf("seamlesstest-backends-%d-%d", os.Getpid(), time.Now().UnixNano())
	scaleUnderLoad(t, c, "../compose/docker/docker-compose.yml", env, `seamless_runtime_updates_total{result="success"}`)
}

// scaleUnderLoad brings up a compose example whose service web answers on
// SEAMLESS_HTTP_PORT and scales it 3 → 5 → 2 → 3 under a new-connection
// and a keep-alive load. applied is the metric that must count the
// changes; extraPorts are further published ports to move to free ones.
func scaleUnderLoad(t *testing.T, c *client.Client, file string, env map[string]string, applied string, extraPorts ...string) {
	ports, addr := freePorts(t, append([]string{"SEAMLESS_HTTP_PORT", "SEAMLESS_STATS_PORT", "SEAMLESS_STATUS_PORT"}, extraPorts...)...)
	maps.Copy(env, ports)
	front, stats, status := addr["SEAMLESS_HTTP_PORT"], addr["SEAMLESS_STATS_PORT"], addr["SEAMLESS_STATUS_PORT"]

	p := compose.New(t, file, env)
	begin := time.Now()
	tl := newTimeline(t, c, p)
	p.Up()
	// converged waits until the service answers from exactly the running
	// replicas, and as many servers are UP on the stats page.
	converged := func(step string, want int) {
		t.Helper()
		var live, got []string
		testenv.Eventually(t, 60*time.Second, step+": traffic reaches exactly the running replicas", func() bool {
			live = composeServers(t, c, p.Name, "web")
			if len(live) != want {
				return false
			}
			var ok bool
			got, ok = answering(front, 4*want+4)
			if !ok || !slices.Equal(got, live) {
				return false
			}
			return statsUp(stats, "http-web") == want
		})
		t.Logf("%s after %s: %d replicas answer %v", step, time.Since(begin).Round(time.Millisecond), len(got), got)
		tl.mark(time.Now(), "%s: converged", step)
		tl.follow("web")
	}
	converged("up", 3)
	testenv.Eventually(t, 30*time.Second, "seamless ready", func() bool {
		code, _ := testenv.Get("http://" + status + "/readyz")
		return code == 200
	})

	var loads []*loadgen.Load
	for _, m := range []loadgen.Mode{loadgen.NewConn, loadgen.KeepAlive} {
		l, err := loadgen.Start(context.Background(), loadgen.Config{
			Target: front, Mode: m, Workers: 4, MaxRequests: 2_000_000, MaxDuration: 2 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Stop()
		loads = append(loads, l)
	}
	for _, n := range []int{5, 2, 3} {
		step := fmt.Sprintf("scale web=%d", n)
		tl.mark(time.Now(), "%s", step)
		p.Scale("web", n)
		tl.mark(time.Now(), "%s: compose returned", step)
		converged(step, n)
		for _, l := range loads {
			if r := l.Snapshot(); r.Failed != 0 {
				t.Errorf("%s: %d of %d requests failed so far, between %s and %s: %v", step, r.Failed, r.Requests,
					clock(r.FirstFailure), clock(r.LastFailure), r.Errors)
			}
		}
	}
	for i, l := range loads {
		if r := l.Snapshot(); r.Failed != 0 {
			mode := []string{"new connection", "keep-alive"}[i]
			tl.mark(r.FirstFailure, "%s: first failed request", mode)
			tl.mark(r.LastFailure, "%s: last failed request (%d failed)", mode, r.Failed)
		}
	}
	tl.log()
	for i, l := range loads {
		r := l.Stop()
		t.Logf("%s: %d requests in %s, %d failed %v", []string{"new connection", "keep-alive"}[i],
			r.Requests, r.Elapsed.Round(time.Millisecond), r.Failed, r.Errors)
		if r.Failed != 0 || r.Requests < 500 {
			t.Errorf("%d of %d requests failed: %v", r.Failed, r.Requests, r.Errors)
		}
		if r.Elapsed >= 2*time.Minute {
			t.Error("the load ran into its time bound: the scale steps took too long")
		}
	}
	if n := testenv.Metric(t, status, `seamless_reloads_total{result="failure"}`); n != 0 {
		t.Errorf("%v failed reloads", n)
	}
	if n := testenv.Metric(t, status, applied); n < 3 {
		t.Errorf("%s = %v: fewer changes than scale steps were applied this way", applied, n)
	}
	// How the changes were applied: over the runtime API or by reloads.
	_, metrics := testenv.Get("http://" + status + "/metrics")
	for line := range strings.Lines(metrics) {
		for _, name := range []string{"seamless_config_applies_total", "seamless_runtime_updates_total", "seamless_reloads_total"} {
			if strings.HasPrefix(line, name) {
				t.Log(strings.TrimSpace(line))
			}
		}
	}
}

// clock is t as the containers' logs print it, to read a failure beside
// them.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// TestComposeFile is compose/file: seamless with a mounted services
// directory routes to the three named backends it lists.
func TestComposeFile(t *testing.T) {
	c := dockerClient(t)
	env := composeImages(t, c, "SEAMLESS_IMAGE", "DEMO_BACKEND_IMAGE")
	ports, addr := freePorts(t, "SEAMLESS_HTTP_PORT", "SEAMLESS_STATS_PORT", "SEAMLESS_STATUS_PORT")
	maps.Copy(env, ports)
	front, stats, status := addr["SEAMLESS_HTTP_PORT"], addr["SEAMLESS_STATS_PORT"], addr["SEAMLESS_STATUS_PORT"]

	p := compose.New(t, "../compose/file/docker-compose.yml", env)
	p.Up()
	want := []string{"web1", "web2", "web3"}
	testenv.Eventually(t, 60*time.Second, "the three backends of services/web.yaml answer, all UP on the stats page", func() bool {
		got, ok := answering(front, 12)
		return ok && slices.Equal(got, want) && statsUp(stats, "http-web") == 3
	})
	testenv.Eventually(t, 30*time.Second, "seamless ready", func() bool {
		code, _ := testenv.Get("http://" + status + "/readyz")
		return code == 200
	})
	// A Host no tag routes gets HAProxy's 503, not a reset.
	if code := getHost(front, "shop.example.com"); code != 503 {
		t.Errorf("unrouted host: %d, want 503", code)
	}
}

// getHost sends one request with the given Host header and returns the
// status code, 0 without a response.
func getHost(front, host string) int {
	req, err := http.NewRequest(http.MethodGet, "http://"+front+"/", nil)
	if err != nil {
		return 0
	}
	req.Host = host
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
