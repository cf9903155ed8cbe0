package apply

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// smallDisk mounts a 64 KiB tmpfs: a disk that really fills (chmod does
// not stop root, who runs these tests in CI).
func smallDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a small tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes to dir until it is full and returns the filler's path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return p
		}
	}
}

// counter reads a counter of reg by name, 0 when it does not exist.
func counter(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// Issue 10 item 8: a full disk is not a refused configuration. The change
// is counted as a write error, retried, and applied by itself once space
// is freed.
func TestAWriteErrorIsRetriedUntilTheChangeApplies(t *testing.T) {
	disk := smallDisk(t)
	src := newSource("consul")
	r := newRig(t, disk, lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	filler := fill(t, disk)
	src.send("web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the write error counted", func() bool {
		return counter(t, r.m, "seamless_config_write_errors_total") >= 1
	})
	if got := r.file(t); got != "server web 10.0.0.1\n" || r.reloadCount() != 0 {
		t.Errorf("with the disk full: file %q, %d reloads", got, r.reloadCount())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the change applies once space is freed", func() bool {
		return r.reloadCount() == 1
	})
	if got := r.file(t); got != "server web 10.0.0.1\nserver web 10.0.0.2\n" {
		t.Errorf("file %q", got)
	}
	if n := testutil.ToFloat64(r.m.ConfigErrors); n != 0 {
		t.Errorf("a full disk counted as %v configuration errors", n)
	}
	if n := testutil.ToFloat64(r.m.Applies.WithLabelValues(metrics.Refused)); n != 0 {
		t.Errorf("a full disk counted as %v refused applies", n)
	}
}

// The retry delay doubles from 1 s to at most 30 s, and a write that
// succeeds resets it.
func TestWriteRetriesBackOff(t *testing.T) {
	r := newRig(t, t.TempDir(), lines{})
	var got []time.Duration
	for range 7 {
		r.a.retryLater("test", "", time.Now(), &WriteError{Path: "x", Err: syscall.ENOSPC})
		got = append(got, r.a.backoff)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("delays %v, want %v seconds", got, want)
		}
	}
	if n := testutil.ToFloat64(r.m.ConfigWriteErrors); n != 7 {
		t.Errorf("%v write errors counted, want 7", n)
	}
	if err := r.a.write(context.Background(), []byte("server a 10.0.0.1\n"), nil, validated); err != nil {
		t.Fatal(err)
	}
	if r.a.backoff != 0 {
		t.Errorf("delay %s after a successful write, want reset", r.a.backoff)
	}
}

// The files a configuration names (the built-in template's hosts map) are
// on disk, with their content, before the candidate is checked; one that
// cannot be written is a fault of the disk, retried like the
// configuration's, and the configuration is not written.
func TestTheFilesAConfigurationNamesAreWrittenFirst(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, dir, lines{})
	m := model.File{Path: filepath.Join(dir, "hosts-1.map"), Data: []byte("a.example http-a\n")}
	if err := os.WriteFile(m.Path, []byte("stale\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	seen := ""
	r.a.opts.Validate = func(_ context.Context, path string) error {
		b, err := os.ReadFile(m.Path)
		seen = string(b)
		return err
	}
	if err := r.a.write(context.Background(), []byte("use the map\n"), []model.File{m}, validated); err != nil {
		t.Fatal(err)
	}
	if seen != string(m.Data) {
		t.Errorf("the check saw the map hold %q, want %q", seen, m.Data)
	}

	bad := model.File{Path: filepath.Join(dir, "missing", "hosts-2.map"), Data: []byte("b.example http-b\n")}
	err := r.a.write(context.Background(), []byte("use another map\n"), []model.File{bad}, validated)
	var we *WriteError
	if !errors.As(err, &we) || we.Path != bad.Path {
		t.Fatalf("a map that cannot be written: %v, want a WriteError naming it", err)
	}
	if r.file(t) != "use the map\n" {
		t.Errorf("the configuration was written without its map: %q", r.file(t))
	}
}

// The hosts map of the configuration HAProxy runs outlives a candidate
// that HAProxy refuses (the file is back to what runs, and names it);
// the refused candidate's map goes once HAProxy takes another.
func TestARefusedReloadKeepsTheHostsMapThatRuns(t *testing.T) {
	dir := t.TempDir()
	hosts := func(n int) model.Snapshot {
		c := &model.Catalog{}
		for i := range n {
			c.Instances = append(c.Instances, model.Instance{Source: "consul", Name: fmt.Sprintf("svc%03d", i),
				ID: "i1", Node: "n1", Address: "10.0.0.1", Port: 8000 + i, Status: model.StatusPassing,
				Tags: []string{fmt.Sprintf("seamless.http.host=h%03d.example", i)}})
		}
		return model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
	}
	renderer, err := routes.New(routes.Options{HTTPBind: "127.0.0.1:18080", HostMapDir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := newSource("consul")
	r := newRig(t, dir, renderer, src)
	maps := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "hosts-*.map"))
		return m
	}
	src.ch <- hosts(70)
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	running := maps()
	if len(running) != 1 || !strings.Contains(r.file(t), running[0]) {
		t.Fatalf("maps %v for the first configuration", running)
	}
	r.a.opts.Validate = func(context.Context, string) error {
		return &haproxy.ConfigError{Alerts: []string{"[ALERT] refused"}}
	}
	r.run(t)
	src.ch <- hosts(71)
	testenv.Eventually(t, 5*time.Second, "the candidate refused", func() bool { return r.logged("refused") })
	if _, err := os.Stat(running[0]); err != nil || !strings.Contains(r.file(t), running[0]) {
		t.Fatalf("after the refusal the file names %s: %v, and it is there: %v", running[0],
			strings.Contains(r.file(t), running[0]), err)
	}
	r.a.opts.Validate = func(context.Context, string) error { return nil }
	src.ch <- hosts(72)
	testenv.Eventually(t, 5*time.Second, "only the map of the configuration that runs is left", func() bool {
		m := maps()
		return r.reloadCount() == 1 && len(m) == 1 && m[0] != running[0] && strings.Contains(r.file(t), m[0])
	})
}
