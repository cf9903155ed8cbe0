// Package testenv holds what tests across seamless share: finding the real
// HAProxy, free loopback ports, and polling a condition with a deadline
// (never sleeping as synchronisation).
package testenv

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv/freeport"
)

// HAProxy returns the HAProxy the tests run: $SEAMLESS_HAPROXY_BIN when set
// (the version matrix points it at 3.x), else haproxy from PATH. Without
// one a test is skipped on a developer machine and fails under CI, where
// `make test` has installed it.
func HAProxy(t testing.TB) string {
	t.Helper()
	name := "haproxy"
	if v := os.Getenv("SEAMLESS_HAPROXY_BIN"); v != "" {
		name = v
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if CI() {
			t.Fatalf("%s not found under CI (make test installs it): %v", name, err)
		}
		t.Skipf("%s not installed: %v (run make test)", name, err)
	}
	return p
}

// FreePort returns a loopback TCP port that was free a moment ago and that
// this test process has not handed out before (see freeport.Get).
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct loopback TCP ports, each held bound until
// all are chosen, and none handed out before by this test process.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := freeport.Get(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// CI reports whether the tests run under CI (the CI variable set to
// anything but "", "0" or "false", as CI services set it): there a missing
// tool (HAProxy, Consul, Docker, Chromium) fails the test that needs it
// instead of skipping it. The one rule for every test.
func CI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "", "0", "false":
		return false
	}
	return true
}

// Addr is 127.0.0.1:port.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Eventually polls cond every few milliseconds until it returns true, and
// fails the test with msg when timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	EventuallyExplained(t, timeout, msg, cond, nil)
}

// EventuallyExplained is Eventually that, when the wait fails, first has
// explain (if not nil) log what it was waiting for: a failure in CI must
// say what lagged, not only that something did.
func EventuallyExplained(t testing.TB, timeout time.Duration, msg string, cond func() bool, explain func()) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if explain != nil {
				explain()
			}
			t.Fatalf("timed out after %s: %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BuildSeamless builds the seamless command found at pkg (a directory
// relative to the caller's package) into a temporary directory, for a
// TestMain; remove the returned directory when done.
func BuildSeamless(pkg string) (bin, dir string, err error) {
	dir, err = os.MkdirTemp("", "seamless-bin-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "seamless")
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("building seamless: %w", err)
	}
	return bin, dir, nil
}

// RunWithSeamless is a TestMain body: it builds the seamless command at pkg
// into *bin, runs the tests and exits with their status.
func RunWithSeamless(m *testing.M, pkg string, bin *string) {
	path, dir, err := BuildSeamless(pkg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = path
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Get fetches url without keep-alive; the status is 0 when the request
// failed, and the body then holds the error.
func Get(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// Metric reads one sample, e.g. `seamless_reloads_total{result="success"}`,
// from the Prometheus endpoint of a seamless status address.
func Metric(t testing.TB, statusAddr, name string) float64 {
	t.Helper()
	code, body := Get("http://" + statusAddr + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics answered %d: %s", code, body)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
