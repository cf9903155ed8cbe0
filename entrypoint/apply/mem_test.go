package apply

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/discovery/consul"
	"github.com/seamless-lb/seamless/entrypoint/discovery/guard"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// TestBenchMemory measures what seamless holds with a real Consul catalog
// of SEAMLESS_BENCH_SERVICES (default 1000) services × 10 instances,
// watched per service, rendered with the built-in template: the live heap
// after a collection (HeapInuse), the process's RSS, and with
// SEAMLESS_BENCH_HEAP=file a heap profile to read with
// `go tool pprof -top -sample_index=inuse_space` (and file.steady, the
// one before the changes: `-sample_index=alloc_space -diff_base`). Then 20 single-instance
// changes, and the same again. SEAMLESS_HEALTH_CHECKS=false declares the
// servers unchecked, as a catalog of 10,000 services needs on a limit of
// 65,536 file descriptors. SEAMLESS_BENCH_CONSUL=host:port uses a running
// agent (one that allows as many connections per client as there are
// services) and registers the catalog only where it is missing, since
// registering 100,000 instances takes minutes. A measurement, not a test:
//
//	SEAMLESS_BENCH=1 go test -run TestBenchMemory -v ./entrypoint/apply/
func TestBenchMemory(t *testing.T) {
	if os.Getenv("SEAMLESS_BENCH") != "1" {
		t.Skip("a measurement: SEAMLESS_BENCH=1 runs it")
	}
	n := 1000
	if v := os.Getenv("SEAMLESS_BENCH_SERVICES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	const k = 10
	if os.Getenv("SEAMLESS_BENCH_HEAP") != "" {
		runtime.MemProfileRate = 4096 // a finer profile than the default's 512 KiB
	}
	addr := os.Getenv("SEAMLESS_BENCH_CONSUL")
	if addr == "" {
		addr = memConsul(t)
	}
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token, cfg.TokenFile = addr, "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if svcs, _, err := c.Catalog().Services(nil); err != nil || svcs[fmt.Sprintf("svc-%d", n-1)] == nil {
		memPopulate(t, c, n, k)
	}
	runtime.GC()
	base := heapInuse()

	t.Setenv("CONSUL_HTTP_ADDR", addr)
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	src, err := consul.New(consul.Config{Watches: n + 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, err := New(Options{
		Sources:  []model.Source{guard.Wrap(src, guard.Options{Percent: 50, Hold: time.Hour})},
		StateDir: dir, Path: filepath.Join(dir, "haproxy.cfg"), StartTimeout: time.Minute,
		NewRenderer: func() (model.Renderer, error) {
			return routes.New(routes.Options{HTTPBind: "127.0.0.1:18080", Slots: 16,
				NoHealthChecks: os.Getenv("SEAMLESS_HEALTH_CHECKS") == "false"}, nil)
		},
		Validate: func(context.Context, string) error { return nil },
		Reload:   func(context.Context, string) (reload.Outcome, error) { return reload.Outcome{OK: true}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); a.Wait() }()
	start := time.Now()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	go a.Run(ctx)
	testenv.Eventually(t, 2*time.Minute, "every instance applied", func() bool {
		return instancesApplied(a) == n*k
	})
	t.Logf("%d services × %d: first complete configuration after %s", n, k, time.Since(start).Round(time.Millisecond))
	report := func(when string) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		t.Logf("%s: heap in use %.1f MiB (%.1f MiB over the catalog's registration; allocated %.1f MiB), stacks %.1f MiB, "+
			"runtime total %.1f MiB, RSS %.1f MiB, peak %.1f MiB, goroutines %d, allocated in all %.1f MiB in %d collections",
			when, mib(ms.HeapInuse), mib(ms.HeapInuse-base), mib(ms.HeapAlloc), mib(ms.StackInuse), mib(ms.Sys),
			procKiB(t, "VmRSS")/1024, procKiB(t, "VmHWM")/1024, runtime.NumGoroutine(), mib(ms.TotalAlloc), ms.NumGC)
	}
	report("steady")
	// The profile before the changes: what they allocate is the
	// difference (go tool pprof -diff_base).
	if p := os.Getenv("SEAMLESS_BENCH_HEAP"); p != "" {
		writeHeap(t, p+".steady")
	}
	// Ports no earlier run on the same agent left there.
	firstPort := 20000 + 20*int(time.Now().Unix()%2000)
	for i := range 20 {
		svc := fmt.Sprintf("svc-%d", (i*37)%n)
		port := firstPort + i
		memMove(t, c, (i*37)%n, n, port)
		testenv.Eventually(t, time.Minute, svc+" moved", func() bool {
			return slotsServe(a, func(s model.ServerSlot) bool { return s.Port == port })
		})
	}
	report("after 20 changes")
	writeHeap(t, os.Getenv("SEAMLESS_BENCH_HEAP"))
}

// writeHeap writes a heap profile to path, if any.
func writeHeap(t *testing.T, path string) {
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}

// instancesApplied counts the running configuration's filled slots.
func instancesApplied(a *Applier) int {
	n := 0
	slotsServe(a, func(s model.ServerSlot) bool {
		if s.Instance != "" {
			n++
		}
		return false
	})
	return n
}

// slotsServe reports whether a slot of the running rendering is one
// found wants. It reads the rendering itself: Running's copy of 160,000
// slots per change is /status's cost, not the applier's, and would be
// measured as the applier's.
func slotsServe(a *Applier, found func(model.ServerSlot) bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.published.rend == nil {
		return false
	}
	for _, b := range a.published.rend.Servers.Backends() {
		if slices.ContainsFunc(b, found) {
			return true
		}
	}
	return false
}

func heapInuse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// procKiB reads a field of /proc/self/status, in KiB.
func procKiB(t *testing.T, field string) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kib, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kib
		}
	}
	return 0
}

// memConsul starts a dev agent that allows 4096 connections per client
// address, and returns its HTTP address.
func memConsul(t *testing.T) string {
	ports := testenv.FreePorts(t, 4)
	cmd := exec.Command(testenv.ConsulBin(t), "agent", "-dev", "-node=bench",
		"-bind=127.0.0.1", "-client=127.0.0.1", "-dns-port=-1", "-grpc-port=-1",
		"-http-port="+strconv.Itoa(ports[0]), "-server-port="+strconv.Itoa(ports[1]),
		"-serf-lan-port="+strconv.Itoa(ports[2]), "-serf-wan-port="+strconv.Itoa(ports[3]),
		"-hcl=limits { http_max_conns_per_client = 4096 }", "-hcl=disable_update_check = true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := testenv.Addr(ports[0])
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token, cfg.TokenFile = addr, "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the agent leads", func() bool {
		leader, err := c.Status().Leader()
		if err != nil || leader == "" {
			return false
		}
		_, _, err = c.Catalog().Services(nil)
		return err == nil
	})
	return addr
}

// memPopulate registers n services svc-i of k instances each, routed by
// host by the built-in template, instance j on node-(i+j)%10 with a
// passing check.
func memPopulate(t *testing.T, c *api.Client, n, k int) {
	var nodes, ops api.TxnOps
	for i := range memNodes(n) {
		nodes = append(nodes, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet,
			Node: api.Node{Node: fmt.Sprintf("node-%d", i), Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)}}})
	}
	memTxn(t, c, nodes)
	for i := range n {
		for j := range k {
			ops = append(ops, memOps(i, (i+j)%memNodes(n), 8000+i)...)
		}
	}
	memTxn(t, c, ops)
}

// memNodes: 10 nodes, and one per 10 services beyond 1,000: Consul
// registers services slowly on nodes that hold thousands.
func memNodes(n int) int {
	if n <= 1000 {
		return 10
	}
	return n / 10
}

func memOps(i, node, port int) api.TxnOps {
	name := fmt.Sprintf("svc-%d", i)
	nd := fmt.Sprintf("node-%d", node)
	return api.TxnOps{
		&api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: nd,
			Service: api.AgentService{ID: name, Service: name, Port: port,
				Tags: []string{"seamless.http.host=" + name + ".example"}}}},
		&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: api.HealthCheck{Node: nd,
			CheckID: name + "-http", Name: name + "-http", Status: api.HealthPassing, ServiceID: name,
			Output: "HTTP GET http://10.0.0.1:8000/health: 200 OK Output: ok"}}},
	}
}

// memMove moves the instance of svc-i on its first node to port.
func memMove(t *testing.T, c *api.Client, i, n, port int) {
	memTxn(t, c, memOps(i, i%memNodes(n), port)[:1])
}

func memTxn(t *testing.T, c *api.Client, ops api.TxnOps) {
	// Four writers: one at a time, 100,000 instances take a quarter of an
	// hour.
	chunks := make(chan api.TxnOps)
	var wg sync.WaitGroup
	var failed atomic.Pointer[string]
	for range 4 {
		wg.Go(func() {
			for chunk := range chunks {
				if ok, resp, _, err := c.Txn().Txn(chunk, nil); err != nil || !ok {
					msg := fmt.Sprintf("registering services: %v %+v", err, resp)
					failed.Store(&msg)
				}
			}
		})
	}
	for len(ops) > 0 && failed.Load() == nil {
		chunk := ops[:min(len(ops), 64)] // Consul's limit of operations per transaction
		ops = ops[len(chunk):]
		chunks <- chunk
	}
	close(chunks)
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		t.Fatal(*msg)
	}
}
