package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// 50 changes a second, each to a different service, through the whole
// pipeline (the file source, the built-in template with slots, the
// runtime API of a real HAProxy): no change is lost — every service ends
// served by the instance its last change named, and the file says so —
// and the changes are coalesced as SEAMLESS_WAIT says: at most one apply
// per Max of the burst, plus the one after it, not one per change.
func TestFiftyChangesASecondAreCoalescedAndNoneIsLost(t *testing.T) {
	const (
		services = 50
		rounds   = 4 // each service changes this many times
		perSec   = 50
		wait     = "200ms:1s"
		maxWait  = time.Second
	)
	// One backend per round: a service's round-r instance answers "v<r>".
	ports := make([]int, rounds+1)
	for r := range ports {
		ports[r] = namedBackend(t, fmt.Sprintf("v%d", r))
	}
	dir := t.TempDir()
	write := func(svc, round int) {
		writeAtomic(t, filepath.Join(dir, fmt.Sprintf("svc%02d.yaml", svc)),
			fmt.Sprintf("name: svc%02d\ntags: [\"seamless.http.host=svc%02d.test\"]\ninstances:\n  - id: main\n    address: 127.0.0.1\n    port: %d\n",
				svc, svc, ports[round]))
	}
	for s := range services {
		write(s, 0)
	}
	httpAddr := testenv.Addr(testenv.FreePort(t))
	state := filepath.Join(t.TempDir(), "state")
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
		"SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + httpAddr, "SEAMLESS_STATS_BIND=",
		"SEAMLESS_STATE_DIR=" + state, "SEAMLESS_WAIT=" + wait, "SEAMLESS_SERVER_SLOTS=4", "SEAMLESS_LOG_LEVEL=info"}})
	servedBy := func(round int) func() bool {
		return func() bool {
			for s := range services {
				if code, body := getHost(httpAddr, fmt.Sprintf("svc%02d.test", s), "/"); code != 200 || body != fmt.Sprintf("v%d", round) {
					return false
				}
			}
			return true
		}
	}
	testenv.Eventually(t, 30*time.Second, "every service served by its first instance", servedBy(0))
	applies := func() float64 {
		var n float64
		for _, how := range []string{"runtime", "reloaded", "unchanged", "refused", "failed"} {
			n += in.metric(`seamless_config_applies_total{result="` + how + `"}`)
		}
		return n
	}
	before, cpuBefore := applies(), cpuTime(t, in.pid)

	start := time.Now()
	tick := time.NewTicker(time.Second / perSec) // pacing the load, not synchronising
	defer tick.Stop()
	for r := 1; r <= rounds; r++ {
		for s := range services {
			<-tick.C
			write(s, r)
		}
	}
	burst := time.Since(start)
	testenv.Eventually(t, 60*time.Second, "every service served by the instance of its last change", servedBy(rounds))
	// HAProxy serves a runtime change before the file follows it.
	var inFile int
	testenv.Eventually(t, 10*time.Second, "the file follows what HAProxy serves", func() bool {
		cfg, err := os.ReadFile(filepath.Join(state, "haproxy.cfg"))
		inFile = strings.Count(string(cfg), "127.0.0.1:"+strconv.Itoa(ports[rounds])+" ")
		return err == nil && inFile == services
	})
	// The applies settle once the last change is served: read them after
	// a quiet Max, polled.
	var got float64
	testenv.Eventually(t, 30*time.Second, "the applies settled", func() bool {
		n := applies()
		settled := n == got && n > before
		got = n
		return settled && time.Since(start) > burst+2*maxWait
	})
	changes := services * rounds
	bound := math.Ceil(float64(burst)/float64(maxWait)) + 2
	cpu := cpuTime(t, in.pid) - cpuBefore
	t.Logf("%d changes in %v: %v applies (bound %v), seamless CPU %v (%v per change)",
		changes, burst.Round(time.Millisecond), got-before, bound, cpu, cpu/time.Duration(changes))
	if got-before > bound {
		t.Errorf("%v applies for %d changes in %v with SEAMLESS_WAIT=%s, want at most %v", got-before, changes, burst, wait, bound)
	}
}

// cpuTime is the user and system CPU time the process pid has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces): utime and
	// stime are the 14th and 15th of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}
