package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestMetricSum(t *testing.T) {
	text := `# HELP seamless_consul_requests_total HTTP requests made to Consul.
# TYPE seamless_consul_requests_total counter
seamless_consul_requests_total 12
seamless_consul_requests_total_created 1.7e+09
seamless_reloads_total{reason="discovery",result="success"} 3
seamless_reloads_total{reason="hup",result="success"} 2 1700000000000
seamless_reloads_total{reason="hup",result="failure"} 1
`
	for _, tc := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"seamless_consul_requests_total", nil, 12},
		{"seamless_reloads_total", nil, 6},
		{"seamless_reloads_total", map[string]string{"result": "success"}, 5},
		{"seamless_reloads_total", map[string]string{"reason": "hup", "result": "failure"}, 1},
		{"seamless_absent_total", nil, 0},
	} {
		got, err := metricSum(text, tc.name, tc.match)
		if err != nil || got != tc.want {
			t.Errorf("metricSum(%s, %v) = %v, %v; want %v", tc.name, tc.match, got, err, tc.want)
		}
	}
}

func TestParseLogDuration(t *testing.T) {
	for raw, want := range map[string]time.Duration{
		`215000000`: 215 * time.Millisecond,
		`"215ms"`:   215 * time.Millisecond,
		`"soon"`:    -1,
		``:          -1,
	} {
		if got := parseLogDuration(json.RawMessage(raw)); got != want {
			t.Errorf("parseLogDuration(%q) = %v, want %v", raw, got, want)
		}
	}
}

// The flipper's cycle must leave at most one instance passing after every
// change, or a single probe could not tell the new configuration from the
// old.
func TestCycleIsUnambiguous(t *testing.T) {
	f := &flipper{passing: map[string]bool{"alpha": true, "beta": false}}
	prev := f.expect()
	for i := range 2 * len(cycle) {
		inst := cycle[i%len(cycle)]
		f.passing[inst] = !f.passing[inst]
		got := f.expect() // panics if both pass
		if got == prev {
			t.Fatalf("change %d (%s) leaves the answer at %q", i+1, inst, got)
		}
		prev = got
	}
	if prev != "alpha" {
		t.Errorf("the cycle ends at %q, want the start (alpha)", prev)
	}
}

func TestLayoutRendersEveryInstance(t *testing.T) {
	l := layout{services: 12, instances: 3, nodes: 5, ports: []int{9001, 9002, 9003}}
	cfg, _, _, err := renderTiming(l.catalog(), routes.Options{HTTPBind: "127.0.0.1:8080", StatsBind: "127.0.0.1:8404"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(cfg, []byte("\n    server ")); n != 36 {
		t.Errorf("%d server lines, want 36", n)
	}
	if !bytes.Contains(cfg, []byte("var(txn.host) -m str svc-11.bench.test")) {
		t.Errorf("no rule for svc-11's host:\n%s", cfg)
	}
	if ops := l.ops(); len(ops) != 5+2*36 {
		t.Errorf("%d registration operations, want %d", len(ops), 5+2*36)
	}
}

// BenchmarkRenderBuiltin renders the built-in template for the scale
// benchmark's catalog, with and without server slots; with -cpuprofile or
// -memprofile it shows where render time and garbage go.
func BenchmarkRenderBuiltin(b *testing.B) {
	for _, n := range []int{100, 1000} {
		for _, slots := range []int{0, 8} {
			b.Run(fmt.Sprintf("services=%d/slots=%d", n, slots), func(b *testing.B) {
				l := layout{services: n, instances: 10, nodes: 100, ports: []int{9000, 9001, 9002, 9003, 9004, 9005, 9006, 9007, 9008, 9009}}
				cat := l.catalog()
				r, err := routes.New(routes.Options{HTTPBind: "127.0.0.1:8080", StatsBind: "127.0.0.1:8404",
					Slots: slots, DrainTimeout: 10 * time.Second}, nil)
				if err != nil {
					b.Fatal(err)
				}
				st := model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: &cat}})
				b.ReportAllocs()
				for b.Loop() {
					if _, err := r.Render(st); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// The discovery benchmarks, briefly, against the real Consul, HAProxy and
// seamless: they must complete and print their tables.
func TestDiscoveryBenchmarks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Consul, HAProxy and seamless")
	}
	testenv.HAProxy(t)
	consul := testenv.ConsulBin(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, tc := range []struct {
		args []string
		rows []string
	}{
		{[]string{"propagation", "-changes", "4", "-gap", "10ms"},
			[]string{"health   |", "register |", "4/4"}},
		{[]string{"scale", "-services", "5,20", "-instances", "3", "-nodes", "4", "-changes", "2", "-gap", "10ms", "-renders", "2", "-checks", "1"},
			[]string{"       5 |        15 |", "      20 |        60 |", "identical", "target O(1) Consul requests per change: 1.0 at 5 services"}},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"seamless-bench"}, tc.args...)
			args = append(args, "-seamless", seamlessBin, "-consul", consul)
			code := run(ctx, args, &stdout, &stderr)
			t.Logf("table:\n%s", stdout.String())
			if code != 0 {
				t.Fatalf("exit code %d\nstderr:\n%s", code, stderr.String())
			}
			for _, row := range tc.rows {
				if !strings.Contains(stdout.String(), row) {
					t.Errorf("no %q in the output", row)
				}
			}
		})
	}
	if pids := procfs.Mentioning(tmp); len(pids) > 0 {
		t.Errorf("processes left running: %v", pids)
	}
}
