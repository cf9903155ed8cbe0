// Package freeport hands out loopback TCP ports for tests and benchmarks
// to give to servers they start (HAProxy, Consul, seamless). It is the one
// allocator: internal/testenv wraps it for tests, internal/consulproc uses
// it directly.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// The range ports are chosen in: below Linux's ephemeral range (32768 and
// up), so that the source port of an outgoing connection cannot take one
// before its server binds it.
const (
	low  = 20000
	high = 32767
)

var (
	mu sync.Mutex
	// given are the ports this process handed out: never handed out again,
	// so that a port a test still holds in a stopped server's config (or
	// two ports asked for one after the other) cannot come back.
	given = map[int]bool{}
)

// Get returns n distinct loopback TCP ports that were free when chosen:
// each stays bound until all n are chosen, and none has been returned
// before by this process.
func Get(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	var ports []int
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt >= 100*n+1000 || len(given) >= high-low {
			return nil, fmt.Errorf("freeport: no free port found in %d-%d (%d handed out already)", low, high, len(given))
		}
		port := low + rand.IntN(high-low+1)
		if given[port] {
			continue
		}
		if !claim(port) {
			continue // another test process handed it out
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		defer ln.Close()
		given[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// claims are the lock files of the ports this process handed out, kept
// open (and so locked) until it exits.
var claims []*os.File

// claim takes an exclusive lock on the port's file in a directory every
// test process shares: go test runs packages in parallel processes, and a
// port one of them handed out but whose server has not bound it yet looks
// free to the others ("address already in use" in CI). The kernel drops
// the lock when the process ends, however it ends.
func claim(port int) bool {
	dir := filepath.Join(os.TempDir(), "seamless-freeport")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return true // no shared directory: the bind check alone
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return true
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	claims = append(claims, f)
	return true
}
