package consul

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// TestBenchChangeCost measures what a change to one instance's check costs
// in catalogs of SEAMLESS_BENCH_SERVICES (default 20,100,1000) services of
// SEAMLESS_BENCH_INSTANCES (default 10, at most 10) instances each:
// requests and bytes received per change, and the time from the Consul
// write returning to the source's snapshot carrying it (p50 of 20). It
// runs only with SEAMLESS_BENCH=1, on an agent whose connection limit is
// raised so that every service can be watched:
//
//	SEAMLESS_BENCH=1 go test -run TestBenchChangeCost -v ./entrypoint/discovery/consul/
//
// SEAMLESS_BENCH_ROUTED=R gives the first R services a seamless.* tag
// (the changed one among them); SEAMLESS_BENCH_NARROW=1 then watches
// those alone, as the built-in template does. It also reports the
// connections held, and the test process's heap, stacks and RSS once the
// source is steady (run each variant in a process of its own to compare
// RSS).
func TestBenchChangeCost(t *testing.T) {
	if os.Getenv("SEAMLESS_BENCH") != "1" {
		t.Skip("a measurement: SEAMLESS_BENCH=1 runs it")
	}
	sizes := cmpOr(os.Getenv("SEAMLESS_BENCH_SERVICES"), "20,100,1000")
	k, err := strconv.Atoi(cmpOr(os.Getenv("SEAMLESS_BENCH_INSTANCES"), "10"))
	if err != nil || k < 1 || k > 10 {
		t.Fatalf("SEAMLESS_BENCH_INSTANCES: want 1 to 10")
	}
	routedN, err := strconv.Atoi(cmpOr(os.Getenv("SEAMLESS_BENCH_ROUTED"), "0"))
	if err != nil || routedN < 0 {
		t.Fatalf("SEAMLESS_BENCH_ROUTED: want a count of services")
	}
	narrow := os.Getenv("SEAMLESS_BENCH_NARROW") == "1"
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("SEAMLESS_BENCH_SERVICES: %v", err)
		}
		t.Run(fmt.Sprintf("%d services × %d", n, k), func(t *testing.T) {
			addr := benchConsul(t)
			c := benchClient(t, addr)
			routedK := min(routedN, n)
			populateTagged(t, c, n, k, routedK)
			cfg, watched, insts := Config{Watches: n + 16}, n+1, n*k+1 // and the consul service
			if narrow && routedK > 0 {
				cfg.Wanted, watched, insts = routed, routedK, routedK*k
			}
			r := startSource(t, addr, cfg, model.LocalCatalog)
			r.waitFor("every service", func(s model.Snapshot) bool {
				return s.Local() != nil && s.Local().Len() == insts
			})
			r.steady(watching(watched))
			i := n / 2
			if routedK > 0 {
				i = routedK / 2
			}
			setCheck(t, c, i, api.HealthWarning) // the first change moves the query onto the streaming view
			r.waitFor("the first change", statusOn(i, api.HealthWarning))
			r.steady(watching(watched))
			reportMemory(t, r, n, watched)
			reqs, bytes := r.src.Requests(), r.src.received.Load()
			const changes = 20
			var took []time.Duration
			for k := range changes {
				status := []string{api.HealthCritical, api.HealthPassing}[k%2]
				setCheck(t, c, i, status)
				start := time.Now()
				for seen := statusOn(i, status); ; time.Sleep(200 * time.Microsecond) { // measuring, not synchronising
					if s, m := r.last(); m > 0 && seen(s) {
						break
					}
					if time.Since(start) > wait {
						t.Fatal("the change did not arrive")
					}
				}
				took = append(took, time.Since(start))
				r.steady(watching(watched))
				// Isolated changes: one within minInterval of the last answer
				// waits for it in either design (coalescing).
				time.Sleep(minInterval)
			}
			slices.Sort(took)
			t.Logf("%d services × %d: %.1f requests, %.0f bytes per check change; write → snapshot p50 %s, max %s",
				n, k, float64(r.src.Requests()-reqs)/changes, float64(r.src.received.Load()-bytes)/changes,
				took[len(took)/2].Round(10*time.Microsecond), took[len(took)-1].Round(10*time.Microsecond))
		})
	}
}

// populateK registers n services of k instances each, instance j of
// svc-i on node-(i+j)%10, each with a passing check svc-i-http; setCheck
// changes the one on node-i%10.
func populateK(t testing.TB, c *api.Client, n, k int) { populateTagged(t, c, n, k, 0) }

// populateTagged is populateK with svc-0 to svc-(routed-1) tagged
// seamless.http.host=svc-i.example.
func populateTagged(t testing.TB, c *api.Client, n, k, routed int) {
	t.Helper()
	var ops api.TxnOps
	for i := range 10 {
		ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet,
			Node: api.Node{Node: fmt.Sprintf("node-%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1)}}})
	}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		var tags []string
		if i < routed {
			tags = []string{"seamless.http.host=" + name + ".example"}
		}
		for j := range k {
			node := fmt.Sprintf("node-%d", (i+j)%10)
			ops = append(ops,
				&api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: node,
					Service: api.AgentService{ID: name, Service: name, Port: 8000 + i, Tags: tags}}},
				&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: api.HealthCheck{Node: node,
					CheckID: name + "-http", Name: name + "-http", Status: api.HealthPassing, ServiceID: name}}})
		}
	}
	for len(ops) > 0 {
		chunk := ops[:min(len(ops), 64)] // Consul's limit of operations per transaction
		ops = ops[len(chunk):]
		ok, resp, _, err := c.Txn().Txn(chunk, nil)
		if err != nil || !ok {
			t.Fatalf("registering services: %v %+v", err, resp)
		}
	}
}

// statusOn: the instance of svc-i on node-i%10 has status.
func statusOn(i int, status string) func(model.Snapshot) bool {
	return func(s model.Snapshot) bool {
		for _, in := range instances(s, fmt.Sprintf("svc-%d", i)) {
			if in.Node == fmt.Sprintf("node-%d", i%10) {
				return in.Status == status
			}
		}
		return false
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// benchConsul starts a dev agent that allows 4096 connections per client
// address, and returns its HTTP address.
func benchConsul(t *testing.T) string {
	t.Helper()
	ports := testenv.FreePorts(t, 4)
	dir := t.TempDir()
	cmd := exec.Command(testenv.ConsulBin(t), "agent", "-dev", "-node=bench",
		"-bind=127.0.0.1", "-client=127.0.0.1", "-dns-port=-1", "-grpc-port=-1",
		"-http-port="+strconv.Itoa(ports[0]), "-server-port="+strconv.Itoa(ports[1]),
		"-serf-lan-port="+strconv.Itoa(ports[2]), "-serf-wan-port="+strconv.Itoa(ports[3]),
		"-hcl=limits { http_max_conns_per_client = 4096 }", "-hcl=disable_update_check = true")
	logf, err := os.Create(filepath.Join(dir, "consul.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	addr := testenv.Addr(ports[0])
	c := benchClient(t, addr)
	testenv.Eventually(t, 30*time.Second, "the bench agent leads", func() bool {
		leader, err := c.Status().Leader()
		if err != nil || leader == "" {
			return false
		}
		_, _, err = c.Catalog().Services(nil)
		return err == nil
	})
	return addr
}

func benchClient(t *testing.T, addr string) *api.Client {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token, cfg.TokenFile = addr, "http", "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reportMemory logs the connections the source holds and what the test
// process (the source, little else) keeps in memory once it is steady.
func reportMemory(t *testing.T, r *running, n, watched int) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	sockets := 0
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			sockets++
		}
	}
	listed, w := r.src.Services()
	t.Logf("%d services, %d watched (Services(): %d of %d listed): %d requests held, %d sockets open; heap %.1f MiB, stacks %.1f MiB, %d goroutines, RSS %s",
		n, watched, w, listed, r.src.InFlight(), sockets, float64(ms.HeapAlloc)/(1<<20), float64(ms.StackInuse)/(1<<20),
		runtime.NumGoroutine(), vmRSS())
}

// vmRSS is the test process's resident set, as /proc says it.
func vmRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
