package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
)

// layout is the synthetic catalog of the scale benchmark: services ×
// instances, spread over nodes, every instance at 127.0.0.1 on the port of
// one of the named backends (instance j of every service on backend "i<j>"),
// so that HAProxy's health checks pass and nothing leaves the machine.
type layout struct {
	services, instances, nodes int
	ports                      []int // of the backends i0, i1, ...
}

// benchDomain ends every service's host name.
const benchDomain = ".bench.test"

func (l layout) width() int           { return len(fmt.Sprint(max(l.services-1, 1))) }
func (l layout) service(i int) string { return fmt.Sprintf("svc-%0*d", l.width(), i) }
func (l layout) id(i, j int) string   { return fmt.Sprintf("%s-%d", l.service(i), j) }
func (l layout) host(i int) string    { return l.service(i) + benchDomain }
func (l layout) hostTag(i int) string { return "seamless.http.host=" + l.host(i) }
func (l layout) port(j int) int       { return l.ports[j%len(l.ports)] }

// node hosts instance j of service i: ten consecutive nodes per service,
// so every node holds instances of many services.
func (l layout) node(i, j int) string {
	return fmt.Sprintf("node-%03d", (i*l.instances+j)%l.nodes)
}

func (l layout) check(i, j int, status string) api.HealthCheck {
	return api.HealthCheck{Node: l.node(i, j), CheckID: "service:" + l.id(i, j), Name: "http",
		Status: status, ServiceID: l.id(i, j), ServiceName: l.service(i)}
}

// ops are the catalog writes that register the layout: the nodes, then a
// service and its check per instance.
func (l layout) ops() api.TxnOps {
	var ops api.TxnOps
	for n := range l.nodes {
		ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet,
			Node: api.Node{Node: fmt.Sprintf("node-%03d", n), Address: "127.0.0.1"}}})
	}
	for i := range l.services {
		for j := range l.instances {
			ops = append(ops,
				&api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: l.node(i, j),
					Service: api.AgentService{ID: l.id(i, j), Service: l.service(i), Address: "127.0.0.1",
						Port: l.port(j), Tags: []string{l.hostTag(i)}}}},
				&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: l.check(i, j, api.HealthPassing)}})
		}
	}
	return ops
}

// catalog is the layout as the Consul source reports it (less the agent's
// own untagged consul service, which is not routed).
func (l layout) catalog() model.Catalog {
	c := model.Catalog{Datacenter: "dc1"}
	for n := range l.nodes {
		c.Nodes = append(c.Nodes, model.Node{Name: fmt.Sprintf("node-%03d", n), Address: "127.0.0.1", Datacenter: "dc1"})
	}
	for i := range l.services {
		for j := range l.instances {
			chk := l.check(i, j, model.StatusPassing)
			c.Instances = append(c.Instances, model.Instance{
				Source: "consul", Datacenter: "dc1", Node: l.node(i, j), NodeAddress: "127.0.0.1",
				ID: l.id(i, j), Name: l.service(i), Address: "127.0.0.1", Port: l.port(j),
				Tags: []string{l.hostTag(i)}, Status: model.StatusPassing,
				Checks: []model.Check{{Node: chk.Node, CheckID: chk.CheckID, Name: chk.Name, Status: chk.Status,
					ServiceID: chk.ServiceID, ServiceName: chk.ServiceName}},
			})
		}
	}
	return c
}

// txnMax is Consul's limit of operations per transaction.
const txnMax = 64

// rolledBack is the error of a transaction Consul rolled back, with what
// each failed operation says (TxnErrors print as pointers).
func rolledBack(resp *api.TxnResponse) error {
	var whats []string
	for _, e := range resp.Errors {
		whats = append(whats, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
	}
	return fmt.Errorf("transaction rolled back: %s", strings.Join(whats, "; "))
}

// registerAll writes ops in transactions of txnMax, the nodes first, then
// the rest by a few concurrent writers.
func registerAll(ctx context.Context, c *api.Client, ops api.TxnOps, nodes int) error {
	txn := func(chunk api.TxnOps) error {
		ok, resp, _, err := c.Txn().Txn(chunk, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return err
		}
		if !ok {
			return rolledBack(resp)
		}
		return nil
	}
	for len(ops) > 0 && nodes > 0 {
		n := min(nodes, txnMax)
		if err := txn(ops[:n]); err != nil {
			return fmt.Errorf("registering nodes: %w", err)
		}
		ops, nodes = ops[n:], nodes-n
	}
	chunks := make(chan api.TxnOps)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for chunk := range chunks {
				if err := txn(chunk); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	// Every send also watches for a failure, so that a writer that gave up
	// does not leave the sender waiting.
	var err error
send:
	for len(ops) > 0 {
		n := min(len(ops), txnMax)
		select {
		case chunks <- ops[:n]:
			ops = ops[n:]
		case err = <-errs:
			break send
		case <-ctx.Done():
			err = ctx.Err()
			break send
		}
	}
	close(chunks)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	if err != nil {
		return fmt.Errorf("registering services: %w", err)
	}
	return nil
}

// routesOptions are the options cmd/seamless builds the built-in template
// with, from the SEAMLESS_* values a row runs seamless with: the binary's
// defaults, overridden by env. A seamless whose haproxy.cfg then differs
// from the in-process render has changed how it does this.
func routesOptions(defaults, env map[string]string, httpBind, statsBind, stateDir string) (routes.Options, error) {
	val := func(name string) string {
		if v, ok := env[name]; ok {
			return v
		}
		return defaults[name]
	}
	o := routes.Options{HTTPBind: httpBind, StatsBind: statsBind, Health: model.ParseHealth(val("SEAMLESS_CONSUL_HEALTH"))}
	if v := val("SEAMLESS_SERVER_SLOTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return o, fmt.Errorf("SEAMLESS_SERVER_SLOTS=%q: %w", v, err)
		}
		o.Slots = n
	}
	if v := val("SEAMLESS_DRAIN_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return o, fmt.Errorf("SEAMLESS_DRAIN_TIMEOUT=%q: %w", v, err)
		}
		o.DrainTimeout = d
	}
	if v := val("SEAMLESS_HEALTH_CHECKS"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return o, fmt.Errorf("SEAMLESS_HEALTH_CHECKS=%q: %w", v, err)
		}
		o.NoHealthChecks = !on
	}
	if o.Slots > 0 {
		// HAProxy's server-state-file, where cmd/seamless keeps it.
		o.StateFile = filepath.Join(stateDir, "server-state")
	}
	return o, nil
}

// renderTiming renders cat with the built-in template as seamless does
// (opts from routesOptions), once to warm up and then runs times. It returns the configuration, each run's
// duration and the bytes allocated per run.
func renderTiming(cat model.Catalog, opts routes.Options, runs int) ([]byte, []time.Duration, uint64, error) {
	r, err := routes.New(opts, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	st := model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: &cat}})
	rend, err := r.Render(st)
	if err != nil {
		return nil, nil, 0, err
	}
	if len(rend.Missing) > 0 || len(rend.Skipped) > 0 {
		return nil, nil, 0, fmt.Errorf("render: missing %v, skipped %v", rend.Missing, rend.Skipped)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var ds []time.Duration
	for range runs {
		t0 := time.Now()
		again, err := r.Render(st)
		ds = append(ds, time.Since(t0))
		if err != nil {
			return nil, nil, 0, err
		}
		if !bytes.Equal(again.Config, rend.Config) {
			return nil, nil, 0, fmt.Errorf("render is not deterministic")
		}
	}
	runtime.ReadMemStats(&after)
	return rend.Config, ds, (after.TotalAlloc - before.TotalAlloc) / uint64(max(runs, 1)), nil
}

// checkTiming runs `haproxy -c` on cfg as seamless validates a candidate:
// the check-only speed-up file first, HAProxy's control variables removed
// from the environment.
func checkTiming(ctx context.Context, bin, dir string, cfg []byte, runs int) ([]time.Duration, error) {
	cfgPath := filepath.Join(dir, "inprocess.cfg")
	speedup := filepath.Join(dir, "check-speedup.cfg")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(speedup, []byte(haproxy.CheckSpeedup), 0o644); err != nil {
		return nil, err
	}
	var ds []time.Duration
	for range runs {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		cmd := exec.CommandContext(cctx, bin, "-c", "-q", "-f", speedup, "-f", cfgPath)
		cmd.Env = haproxy.CleanEnv(os.Environ())
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("haproxy -c %s: %w: %s", cfgPath, err, bytes.TrimSpace(out))
		}
		ds = append(ds, d)
	}
	return ds, nil
}
