package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestSlope(t *testing.T) {
	for _, tc := range []struct {
		name string
		x, y []float64
		want float64
	}{
		{"flat", []float64{0, 1, 2, 3}, []float64{5, 5, 5, 5}, 0},
		{"a line", []float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}, 2},
		{"noise around a line", []float64{0, 1, 2, 3}, []float64{0, 2, 2, 4}, 1.2},
		{"uneven minutes", []float64{0, 0.5, 2}, []float64{10, 9.5, 8}, -1},
		{"one sample", []float64{1}, []float64{3}, 0},
		{"no spread in x", []float64{1, 1}, []float64{3, 4}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := slope(tc.x, tc.y); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("slope = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSoakTableHasASlopePerColumn(t *testing.T) {
	samples := []soakSample{
		{at: 0, rss: 20 << 20, goroutines: 40, fds: 30, haproxy: 2, requests: 0},
		{at: time.Minute, rss: 22 << 20, goroutines: 40, fds: 31, haproxy: 2, requests: 100, failed: 1},
		{at: 2 * time.Minute, rss: 24 << 20, goroutines: 40, fds: 32, haproxy: 2, requests: 200, failed: 2},
	}
	var b strings.Builder
	printSoakTable(&b, samples)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("want a header, 3 rows and the slopes; got\n%s", b.String())
	}
	cells := func(line string) []string {
		var out []string
		for c := range strings.SplitSeq(line, "|") {
			out = append(out, strings.TrimSpace(c))
		}
		return out
	}
	head, slopes := cells(lines[0]), cells(lines[4])
	want := map[string]string{"rss MiB": "+2.00", "goroutines": "+0.00", "fds": "+1.00", "haproxy procs": "+0.00", "failed": "+1.00"}
	for i, h := range head {
		if w, ok := want[h]; ok && slopes[i] != w {
			t.Errorf("slope of %s = %s, want %s\n%s", h, slopes[i], w, b.String())
		}
	}
}

// recordingFx keeps the effects of the world's changes as the soak's
// Consul agent and directory would hold them.
type recordingFx struct {
	consul   map[string]soakInst // by ID
	services map[string]string   // instance ID → service
	files    map[string]string
	writes   map[string]int // by file
	touched  []string       // instance IDs and files changed after setup
	setupOK  bool
}

func newRecordingFx() *recordingFx {
	return &recordingFx{consul: map[string]soakInst{}, services: map[string]string{}, files: map[string]string{}, writes: map[string]int{}}
}

func (f *recordingFx) register(_ context.Context, service string, in soakInst) error {
	if old, ok := f.consul[in.id]; ok && f.setupOK && old == in {
		return fmt.Errorf("%s registered again unchanged outside a restart", in.id)
	}
	f.consul[in.id], f.services[in.id] = in, service
	f.touched = append(f.touched, in.id)
	return nil
}

func (f *recordingFx) deregister(_ context.Context, id string) error {
	if _, ok := f.consul[id]; !ok {
		return fmt.Errorf("deregistering unknown %s", id)
	}
	delete(f.consul, id)
	delete(f.services, id)
	f.touched = append(f.touched, id)
	return nil
}

func (f *recordingFx) setHealth(_ context.Context, id string, passing bool) error {
	in, ok := f.consul[id]
	if !ok {
		return fmt.Errorf("health of unknown %s", id)
	}
	in.passing = passing
	f.consul[id] = in
	f.touched = append(f.touched, id)
	return nil
}

func (f *recordingFx) writeFile(name string, data []byte) error {
	f.files[name] = string(data)
	f.writes[name]++
	f.touched = append(f.touched, name)
	return nil
}

func (f *recordingFx) removeFile(name string) error {
	if _, ok := f.files[name]; !ok {
		return fmt.Errorf("removing unknown file %s", name)
	}
	delete(f.files, name)
	f.touched = append(f.touched, name)
	return nil
}

// TestWorldChurn runs many steps against recorded effects: every kind of
// change happens, the stable services are never changed (the stable file
// is only rewritten with the same bytes), the bounds hold, a malformed file
// is fixed at the next step, and what was done is what the world says.
func TestWorldChurn(t *testing.T) {
	ports := []int{9001, 9002, 9003, 9004, 9005, 9006, 9007, 9008}
	run := func(seed uint64) (*world, *recordingFx, []string) {
		fx := newRecordingFx()
		w := newWorld(seed, ports, fx)
		if err := w.setup(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.setupOK = true
		stableFile := fx.files["stable-f"]
		var kinds []string
		for i := range 3000 {
			fx.touched = nil
			kind, err := w.step(t.Context())
			if err != nil {
				t.Fatalf("step %d (%s): %v", i, kind, err)
			}
			kinds = append(kinds, kind)
			for _, x := range fx.touched {
				if strings.HasPrefix(x, "stable-") && (x != "stable-f" || fx.files[x] != stableFile) {
					t.Fatalf("step %d (%s) changed stable %s", i, kind, x)
				}
			}
			if i > 0 && kinds[i-1] == "file malformed" && kind != "file fix" {
				t.Fatalf("step %d: %s after a malformed file, want its fix", i, kind)
			}
			if len(churned(w.consul)) > soakMaxConsulServices || len(churned(w.files)) > soakMaxFileServices {
				t.Fatalf("step %d: %d consul and %d file services churned, over the bounds", i, len(churned(w.consul)), len(churned(w.files)))
			}
		}
		if err := w.fixBad(); err != nil {
			t.Fatal(err)
		}
		return w, fx, kinds
	}
	w, fx, kinds := run(7)

	for _, k := range []string{"consul service +", "consul service -", "consul instance +", "consul instance -",
		"health flap", "file service +", "file replaced", "file removed", "file malformed", "file fix", "stable file rewritten"} {
		if w.done[k] == 0 {
			t.Errorf("no %q in 3000 steps: %v", k, w.done)
		}
	}
	// The recorded Consul and directory are the world.
	want := map[string]soakInst{}
	for name, s := range w.consul {
		if len(s.insts) == 0 || len(s.insts) > soakMaxInstances {
			t.Errorf("service %s has %d instances", name, len(s.insts))
		}
		for _, in := range s.insts {
			want[in.id] = in
			if fx.services[in.id] != name {
				t.Errorf("%s registered under %q, want %q", in.id, fx.services[in.id], name)
			}
		}
	}
	if !maps.Equal(fx.consul, want) {
		t.Errorf("consul holds %v\nworld says %v", fx.consul, want)
	}
	wantFiles := map[string]string{}
	for name, s := range w.files {
		wantFiles[name] = string(serviceFile(s))
	}
	if !maps.Equal(fx.files, wantFiles) {
		t.Errorf("directory holds %v\nworld says %v", slices.Sorted(maps.Keys(fx.files)), slices.Sorted(maps.Keys(wantFiles)))
	}
	// A restart's registration brings back exactly the world.
	fx2 := newRecordingFx()
	w.fx = fx2
	if err := w.reregister(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(fx2.consul, want) {
		t.Errorf("re-registered %v\nworld says %v", fx2.consul, want)
	}
	// The seed decides everything.
	if _, _, again := run(7); !slices.Equal(kinds, again) {
		t.Error("the same seed made other changes")
	}
	if _, _, other := run(8); slices.Equal(kinds, other) {
		t.Error("another seed made the same changes")
	}
}

// TestSoakTemplateAndFilesPassHAProxy renders every version parity of the
// soak's template from service files as the soak writes them, with the
// real seamless, and checks the result with the real HAProxy (`seamless
// check`): a template or file the soak writes must never be what fails.
func TestSoakTemplateAndFilesPassHAProxy(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	services := filepath.Join(dir, "services")
	if err := os.Mkdir(services, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*soakService{
		{name: "stable-f", insts: []soakInst{{id: "stable-f-0", port: 9001}, {id: "stable-f-1", port: 9002}}},
		{name: "file-0003", insts: []soakInst{{id: "file-0003-0", port: 9003}}},
	} {
		if err := os.WriteFile(filepath.Join(services, s.name+".yaml"), serviceFile(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []int{1, 2} {
		tmpl := filepath.Join(dir, "soak.tmpl")
		if err := os.WriteFile(tmpl, soakTemplate("127.0.0.1:5099", v), 0o644); err != nil {
			t.Fatal(err)
		}
		state := filepath.Join(dir, fmt.Sprintf("state%d", v))
		if err := os.Mkdir(state, 0o755); err != nil {
			t.Fatal(err)
		}
		env := append(os.Environ(), "SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR="+services,
			"SEAMLESS_TEMPLATE="+tmpl, "SEAMLESS_STATE_DIR="+state, "SEAMLESS_RUN_DIR="+state)
		for _, sub := range []string{"render", "check"} {
			cmd := exec.Command(seamlessBin, sub)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("version %d: seamless %s: %v\n%s", v, sub, err, out)
			}
			if sub != "render" {
				continue
			}
			for _, want := range []string{
				fmt.Sprintf("# seamless soak template, version %d\n", v),
				"use_backend stable-f if { path_beg /stable-f/ }",
				"server stable-f-1 127.0.0.1:9002 check",
				"server file-0003-0 127.0.0.1:9003 check",
			} {
				if !strings.Contains(string(out), want) {
					t.Errorf("version %d: rendered configuration lacks %q:\n%s", v, want, out)
				}
			}
		}
	}
}

func TestAlertsPicksHAProxysAlerts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seamless.log")
	log := `{"time":"2026-12-01T03:19:32.5Z","level":"WARN","msg":"[WARNING]  (1) : Proxy http stopped","component":"haproxy"}
{"time":"2026-12-01T03:19:33.25Z","level":"ERROR","msg":"[ALERT]    (1) : Current worker (2) exited with code 143","component":"haproxy"}
{"time":"2026-12-01T03:19:34Z","level":"ERROR","msg":"services file rejected [ALERT]","component":"discovery"}
not json
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := alerts(path, 10)
	want := []string{"03:19:33.250 [ALERT]    (1) : Current worker (2) exited with code 143"}
	if !slices.Equal(got, want) {
		t.Errorf("alerts = %q, want %q", got, want)
	}
}
