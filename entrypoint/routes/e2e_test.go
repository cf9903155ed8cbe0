package routes

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// backend is an HTTP server that answers its name and the path it got.
func backend(t *testing.T, name string) (addr string, port int) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	a := srv.Listener.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// echoServer copies back what it reads on each connection.
func echoServer(t *testing.T) (addr string, port int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	a := l.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// startHAProxy runs `haproxy -f cfg -db` until the test ends.
func startHAProxy(t *testing.T, cfg []byte) {
	t.Helper()
	bin := testenv.HAProxy(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "haproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-f", path, "-db")
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("haproxy output:\n%s", out)
		}
	})
}

// get sends one request for host and path to addr, without keep-alive.
func get(addr, host, path string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Host = host
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEndToEnd routes with a rule per host, and with the exact hosts in
// a map (hostmap.go), which must route alike.
func TestEndToEnd(t *testing.T) {
	testenv.HAProxy(t) // skip before starting anything when it is missing
	t.Run("rules", func(t *testing.T) { endToEnd(t, false) })
	t.Run("hosts map", func(t *testing.T) { endToEnd(t, true) })
}

func endToEnd(t *testing.T, mapped bool) {
	httpPort, statsPort, tcpPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	for httpPort == statsPort || tcpPort == httpPort || tcpPort == statsPort {
		statsPort, tcpPort = testenv.FreePort(t), testenv.FreePort(t)
	}

	var insts []model.Instance
	add := func(service, id string, status string, tags ...string) {
		addr, port := backend(t, id)
		insts = append(insts, with(inst(service, id, addr, port, tags...), func(in *model.Instance) { in.Status = status }))
	}
	for _, id := range []string{"web1", "web2", "web3"} {
		add("web", id, model.StatusPassing, "seamless.http.host=web.test")
		insts[len(insts)-1].Registered = 10
	}
	// Intruders (issue 10, items 1 and 2): one registered after web, whose
	// name sorts first; one whose path tag is invalid. Neither may take
	// any request of web.test from web.
	add("aaa", "aaa1", model.StatusPassing, "seamless.http.host=web.test")
	insts[len(insts)-1].Registered = 20
	add("admin", "admin1", model.StatusPassing, "seamless.http.host=web.test", "seamless.http.path=/admin area")
	add("api", "api1", model.StatusPassing, "seamless.http.host=web.test", "seamless.http.path=/api")
	add("apps", "apps1", model.StatusPassing, "seamless.http.host=*.apps.test")
	add("static", "static1", model.StatusPassing, "seamless.http.path=/static")
	add("down", "down1", model.StatusCritical, "seamless.http.host=down.test")
	echoAddr, echoPort := echoServer(t)
	insts = append(insts, inst("echo", "echo1", echoAddr, echoPort, "seamless.tcp.port="+strconv.Itoa(tcpPort)))

	o := Options{HTTPBind: testenv.Addr(httpPort), StatsBind: testenv.Addr(statsPort)}
	if mapped {
		o.HostMapDir, o.hostMapMin = t.TempDir(), 1
	}
	r := mustNew(t, o)
	out := render(t, r, catalog(insts...))
	if len(out.Skipped) != 3 { // aaa's conflict; admin's tag, and admin not routed
		t.Fatalf("skipped: %q", out.Skipped)
	}
	for _, f := range out.Files { // as the applier does
		if err := os.WriteFile(f.Path, f.Data, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Contains(string(out.Config), "map_str("); got != mapped ||
		mapped && strings.Contains(string(out.Config), "-m str web.test }\n") {
		t.Fatalf("hosts map: %v, want %v:\n%s", got, mapped, out.Config)
	}
	haproxyCheck(t, out.Config)
	startHAProxy(t, out.Config)

	front, stats := testenv.Addr(httpPort), testenv.Addr(statsPort)
	testenv.Eventually(t, 10*time.Second, "HAProxy serves the stats page", func() bool {
		code, _ := get(stats, "x", "/haproxy?stats")
		return code == http.StatusOK
	})
	// HAProxy's first health checks run in the background; wait until every
	// web replica has answered through it before asserting round robin.
	seen := map[string]bool{}
	testenv.Eventually(t, 10*time.Second, "all three web replicas answer", func() bool {
		if code, body := get(front, "web.test", "/"); code == http.StatusOK {
			seen[strings.Fields(body)[0]] = true
		}
		return len(seen) == 3
	})

	tests := []struct {
		name, host, path string
		code             int
		body             string // prefix of the body
	}{
		{"a host", "web.test", "/", 200, "web"},
		{"the host without case and port", "WEB.Test:" + strconv.Itoa(httpPort), "/hello", 200, "web"},
		{"a path prefix", "web.test", "/api", 200, "api1 /api"},
		{"below a path prefix", "web.test", "/api/users", 200, "api1 /api/users"},
		{"a longer segment is not the prefix", "web.test", "/apix", 200, "web"},
		{"an invalid path tag routes nothing", "web.test", "/admin", 200, "web"},
		{"a wildcard host", "a.b.apps.test", "/", 200, "apps1"},
		{"a wildcard does not match its own name", "apps.test", "/", 503, "No service is routed"},
		{"a path for any host", "anything.test", "/static/app.js", 200, "static1 /static/app.js"},
		{"a host's own rules come before a path for any host", "web.test", "/static/app.js", 200, "web"},
		{"an unknown host gets 503, not a reset", "unknown.test", "/", 503, "No service is routed for this host and path."},
		{"a routed service without healthy instances gets 503", "down.test", "/", 503, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := get(front, tt.host, tt.path)
			if code != tt.code || !strings.HasPrefix(body, tt.body) {
				t.Fatalf("GET http://%s%s = %d %q, want %d %q...", tt.host, tt.path, code, body, tt.code, tt.body)
			}
		})
	}

	t.Run("round robin over the replicas", func(t *testing.T) {
		got := map[string]int{}
		for range 6 {
			_, body := get(front, "web.test", "/")
			got[strings.Fields(body)[0]]++
		}
		if len(got) != 3 {
			t.Fatalf("6 requests reached %v", got)
		}
	})

	t.Run("TCP forwarding", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", testenv.Addr(tcpPort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "ping through haproxy\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "ping through haproxy\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
	})

	t.Run("Prometheus metrics on the stats address", func(t *testing.T) {
		code, body := get(stats, "x", "/metrics")
		if code != http.StatusOK || !strings.Contains(body, "haproxy_backend_") {
			t.Fatalf("/metrics = %d %.200q", code, body)
		}
	})
}
