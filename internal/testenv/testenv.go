// Package testenv holds what tests across seamless share: finding the real
// HAProxy, free loopback ports, and polling a condition with a deadline
// (never sleeping as synchronisation).
package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
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
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found under CI (make test installs it): %v", name, err)
		}
		t.Skipf("%s not installed: %v (run make test)", name, err)
	}
	return p
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr is 127.0.0.1:port.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Eventually polls cond every few milliseconds until it returns true, and
// fails the test with msg when timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
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
