package apply

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/discovery/guard"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/entrypoint/template"
)

// benchCatalog is services × instances, every instance passing and routed
// by host; changed flips the status of instance 0 of service services/2.
func benchCatalog(services, instances int, changed bool) *model.Catalog {
	c := &model.Catalog{Datacenter: "dc1"}
	for n := range instances {
		c.Nodes = append(c.Nodes, model.Node{Name: fmt.Sprintf("node%d", n), Address: fmt.Sprintf("10.1.0.%d", n+1)})
	}
	for s := range services {
		name := fmt.Sprintf("svc%04d", s)
		for n := range instances {
			st := model.StatusPassing
			if changed && s == services/2 && n == 0 {
				st = model.StatusCritical
			}
			c.Instances = append(c.Instances, model.Instance{Source: "consul", Name: name,
				ID: fmt.Sprintf("%s-%d", name, n), Node: fmt.Sprintf("node%d", n),
				Address: fmt.Sprintf("10.%d.%d.%d", 2+s/250, s%250, n+1), Port: 8080, Status: st,
				Tags: []string{"http", "seamless.http.host=" + name + ".example"}})
		}
	}
	model.SortCatalog(c)
	return c
}

func benchSnapshot(c *model.Catalog) model.Snapshot {
	kv := func(k, v string) model.KVPair { return model.KVPair{Key: k, Value: v} }
	q := func(kind model.QueryKind, k string) model.Query { return model.Query{Kind: kind, Key: k} }
	return model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{
		model.LocalCatalog:                               {Catalog: c},
		q(model.QueryKey, "service/haproxy/maxconn"):     {Pairs: []model.KVPair{kv("service/haproxy/maxconn", "4096")}},
		q(model.QueryKey, "service/haproxy/mode"):        {Pairs: []model.KVPair{kv("service/haproxy/mode", "http")}},
		q(model.QueryPrefix, "service/haproxy/timeouts"): {Pairs: []model.KVPair{kv("service/haproxy/timeouts/client", "30s"), kv("service/haproxy/timeouts/connect", "5s"), kv("service/haproxy/timeouts/server", "30s")}},
	}}
}

// chanSource passes on what the test sends it.
type chanSource chan model.Snapshot

func (chanSource) Name() string { return "consul" }
func (c chanSource) Run(ctx context.Context, out chan<- model.Snapshot) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-c:
			select {
			case out <- s:
			case <-ctx.Done():
				return
			}
		}
	}
}

// stages times the steps of one apply: wall time, and the CPU time of
// the whole process (every thread: the garbage collector's work counts)
// and of its children (haproxy -c), which a machine shared with other
// work inflates less.
type stages struct {
	names []string
	took  map[string][]time.Duration
	cpu   map[string][]time.Duration
}

func cpuNow() time.Duration {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children) // haproxy -c
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + children.Utime.Nano() + children.Stime.Nano())
}

func (s *stages) time(name string, f func()) {
	start, cpu := time.Now(), cpuNow()
	f()
	if s.took == nil {
		s.took, s.cpu = map[string][]time.Duration{}, map[string][]time.Duration{}
	}
	if _, ok := s.took[name]; !ok {
		s.names = append(s.names, name)
	}
	s.took[name] = append(s.took[name], time.Since(start))
	s.cpu[name] = append(s.cpu[name], cpuNow()-cpu)
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func (s *stages) report(t *testing.T, title string) {
	t.Logf("%s (median of %d changes)", title, len(s.took[s.names[0]]))
	t.Logf("| %-44s | %9s | %9s |", "stage", "wall ms", "CPU ms")
	var wall, cpu time.Duration
	for _, n := range s.names {
		w, c := median(s.took[n]), median(s.cpu[n])
		wall, cpu = wall+w, cpu+c
		t.Logf("| %-44s | %9.2f | %9.2f |", n, float64(w.Microseconds())/1000, float64(c.Microseconds())/1000)
	}
	t.Logf("| %-44s | %9.2f | %9.2f |", "sum of medians", float64(wall.Microseconds())/1000, float64(cpu.Microseconds())/1000)
}

// TestBenchPipeline measures what seamless does with one single-instance
// change in a catalog of SEAMLESS_BENCH_SERVICES (default 1000) services ×
// 10 instances, stage by stage, from the source's snapshot to HAProxy:
// the guard, the applier's take, Merge, the rendering (the built-in
// configuration with slots, and the README's classic template), the plan,
// the runtime commands against a fake runtime API, the file write, and
// for the template `haproxy -c`. A measurement, not a test:
//
//	SEAMLESS_BENCH=1 go test -run TestBenchPipeline -v ./entrypoint/apply/
//
// (SEAMLESS_HEALTH_CHECKS=false renders without checks.) Profile with -cpuprofile cpu.out (SEAMLESS_BENCH_ONLY=builtin|template
// keeps one path).
func TestBenchPipeline(t *testing.T) {
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
	const changes = 21
	only := os.Getenv("SEAMLESS_BENCH_ONLY")
	cats := [2]model.Snapshot{benchSnapshot(benchCatalog(n, 10, false)), benchSnapshot(benchCatalog(n, 10, true))}

	for _, path := range []string{"builtin", "template", "builtin-whole"} {
		if only != "" && only != path {
			continue
		}
		t.Run(path, func(t *testing.T) {
			dir := t.TempDir()
			var renderer model.Renderer
			if path != "template" {
				// SEAMLESS_HEALTH_CHECKS=false: 10,000 checked backends
				// would not fit this host's file-descriptor limit.
				r, err := routes.New(routes.Options{HTTPBind: "127.0.0.1:18080", Slots: 16, DrainTimeout: 0,
					NoHealthChecks: os.Getenv("SEAMLESS_HEALTH_CHECKS") == "false"}, nil)
				if err != nil {
					t.Fatal(err)
				}
				renderer = r
			} else {
				r, err := template.Parse("../template/testdata/classic.tmpl", template.Options{Dir: dir})
				if err != nil {
					t.Fatal(err)
				}
				renderer = r
			}
			a, err := New(Options{Sources: []model.Source{chanSource(nil)}, StateDir: dir, Path: filepath.Join(dir, "haproxy.cfg"),
				NewRenderer: func() (model.Renderer, error) { return renderer, nil },
				Validate:    func(context.Context, string) error { return nil },
				Reload:      func(context.Context, string) (reload.Outcome, error) { return reload.Outcome{OK: true}, nil },
				ReadOnly:    path != "builtin-whole"}) // the whole apply saves the snapshot, as seamless does
			if err != nil {
				t.Fatal(err)
			}
			a.renderer = renderer

			src := make(chanSource)
			g := guard.Wrap(src, guard.Options{Percent: 50, Hold: time.Hour})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := make(chan model.Snapshot)
			go g.Run(ctx, out)

			var st stages
			var fake *haproxyServers
			for i := range changes + 1 {
				snap := cats[i%2]
				var got model.Snapshot
				st.time("guard (source snapshot → out)", func() { src <- snap; got = <-out })
				if path == "builtin-whole" {
					// The applier's own apply, runtime commands and file
					// write included, after the first.
					if fake == nil {
						a.take(got)
						rend, err := renderer.Render(a.state())
						if err != nil {
							t.Fatal(err)
						}
						fake = newHAProxyServers(rend.Servers.Flat())
						a.opts.Runtime = fake
						a.reasons = []string{"start"}
						a.apply(ctx, true)
						st = stages{}
						continue
					}
					st.time("take + apply (snapshot saved, runtime API, file written)", func() {
						a.take(got)
						a.reasons = []string{"consul"}
						a.apply(ctx, false)
					})
					if h := a.History(); h[len(h)-1].How != "runtime" {
						t.Fatalf("change %d applied %+v, want over the runtime API", i, h[len(h)-1])
					}
					continue
				}
				st.time("apply: take (compare with the last)", func() { a.take(got) })
				st.time("apply: save the source's snapshot", func() {
					if err := SaveSnapshot(dir, a.latest["consul"], time.Now()); err != nil {
						t.Fatal(err)
					}
				})
				var state model.State
				st.time("model.Merge", func() { state = a.state() })
				var rend model.Rendering
				st.time("render ("+path+")", func() {
					var err error
					if rend, err = renderer.Render(state); err != nil {
						t.Fatal(err)
					}
				})
				at := attempt{start: time.Now(), rend: rend, catalog: state.Local()}
				st.time("apply: change summary (Change, describe)", func() {
					at.change = a.brief("bench", describe(Change(a.applied, at.catalog), a.runRend, rend))
				})
				var how step
				st.time("apply: plan (compare, hash, structure)", func() { how = a.plan(&at) })
				if path == "builtin" {
					if fake == nil {
						fake = newHAProxyServers(rend.Servers.Flat())
						a.opts.Runtime = fake
					}
					if a.runRend != nil && how != runtimeUpdate {
						t.Fatalf("change %d: planned %d, want a runtime update", i, how)
					}
					if a.runRend != nil {
						var cmds []string
						st.time("runtime: commands", func() { cmds, _ = slotCommands(a.runRend.Servers, rend.Servers, !rend.NoHealthChecks) })
						st.time("runtime: apply + show servers state + verify", func() {
							touched := touchedSlots(cmds)
							want, states, err := applyAndRead(ctx, fake, cmds, rend.Servers, touched)
							if err != nil {
								t.Fatal(err)
							}
							if err := verify(want, states, touched); err != nil {
								t.Fatal(err)
							}
						})
					}
					st.time("write file", func() {
						if err := WriteFile(a.opts.Path, rend.Config, 0o640); err != nil {
							t.Fatal(err)
						}
					})
				} else {
					st.time("write file", func() {
						if err := WriteFile(a.opts.Path+".new", rend.Config, 0o640); err != nil {
							t.Fatal(err)
						}
					})
					st.time("haproxy -c", func() {
						if out, err := exec.Command("/usr/sbin/haproxy", "-c", "-q", "-f", a.opts.Path+".new").CombinedOutput(); err != nil {
							t.Fatalf("haproxy -c: %v: %s", err, out)
						}
					})
				}
				st.time("apply: commit and record", func() {
					commit(at.rend)
					a.applied, a.runRend, a.running = at.catalog, &at.rend, at.rend.Config
					a.countDiscovered()
					a.publish()
				})
				if i == 0 {
					st = stages{} // the first is the start, not a change
				}
				if len(rend.Config) == 0 {
					t.Fatal("no configuration rendered")
				}
			}
			st.report(t, fmt.Sprintf("%s, %d services × 10 instances, one instance's status flips", path, n))
		})
	}
}

// BenchmarkChangedRuns finds one moved server in a configuration of 1000
// backends of 10 servers (go test -run - -bench ChangedRuns).
func BenchmarkChangedRuns(b *testing.B) {
	var buf []byte
	for i := range 1000 {
		buf = fmt.Appendf(buf, "backend svc-%04d\n    balance roundrobin\n", i)
		for j := range 10 {
			buf = fmt.Appendf(buf, "    server i%d 10.0.%d.%d:%d check\n", j, i%250, j, 30000+i)
		}
	}
	next := slices.Clone(buf)
	next[len(next)/2] ^= 1
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		changedRuns(buf, next)
	}
}
