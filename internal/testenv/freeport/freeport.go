// Package freeport hands out loopback TCP ports for tests and benchmarks
// to give to servers they start (HAProxy, Consul, seamless). It is the one
// allocator: internal/testenv wraps it for tests, internal/consulproc uses
// it directly.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
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
