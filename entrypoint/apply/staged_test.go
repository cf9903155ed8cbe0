package apply

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// stagingWatcher is HAProxy's runtime API that, as it takes commands,
// looks whether the new file is being written beside the configuration
// and whether the configuration is still the one that runs.
type stagingWatcher struct {
	*haproxyServers
	path    string
	running []byte
	staged  chan bool // whether a staged file appeared while the commands ran
}

func (s *stagingWatcher) Apply(ctx context.Context, cmds []string) error {
	seen := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(filepath.Dir(s.path), ".haproxy.cfg.tmp-*")); len(m) > 0 {
			seen = true
			break
		}
	}
	if b, err := os.ReadFile(s.path); err != nil || !bytes.Equal(b, s.running) {
		seen = false // the file was renamed before HAProxy took the change
	}
	s.staged <- seen
	return s.haproxyServers.Apply(ctx, cmds)
}

// A runtime change writes and syncs the file while HAProxy takes the
// commands, not after: at 10,000 × 10 the write and sync took 28 ms of
// the 42 that applying a change took. The file takes its name only once HAProxy runs
// the change, and a change HAProxy did not take leaves nothing behind.
func TestARuntimeChangeWritesTheFileWhileHAProxyTakesIt(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "taken", true: "not taken"}[fail], func(t *testing.T) {
			r, src, dir := startedWithSlots(t)
			running, err := os.ReadFile(r.path)
			if err != nil {
				t.Fatal(err)
			}
			h := &stagingWatcher{haproxyServers: newHAProxyServers(r.a.runRend.Servers.Flat()), path: r.path,
				running: running, staged: make(chan bool, 1)}
			r.a.opts.Runtime = h
			r.run(t)
			if fail {
				// The commands fail after the look: the staged file is
				// discarded and a reload applies the change.
				h.haproxyServers.setFail(errors.New("Unknown command"))
			}
			src.ch <- webInstances("w1", "w2", "w3")
			select {
			case seen := <-h.staged:
				if !seen {
					t.Error("while HAProxy took the commands, no new file was being written beside the configuration, or it had its name already")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no runtime commands were sent")
			}
			want := metrics.Success
			if fail {
				want = metrics.Failure
			}
			testenv.Eventually(t, 5*time.Second, "the runtime update ends", func() bool {
				return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(want)) == 1
			})
			testenv.Eventually(t, 5*time.Second, "the file holds the change", func() bool {
				b, _ := os.ReadFile(r.path)
				return strings.Contains(string(b), "10.0.0.3:8080")
			})
			if m, _ := filepath.Glob(filepath.Join(dir, ".haproxy.cfg.tmp-*")); len(m) > 0 {
				t.Errorf("left behind: %v", m)
			}
			if fail {
				// The file takes its name before the reload is counted.
				testenv.Eventually(t, 5*time.Second, "the change HAProxy did not take is reloaded", func() bool {
					return r.reloadCount() > 0
				})
			}
		})
	}
}

// Once discovery is stopped (its context cancelled as HAProxy starts to
// drain), an apply that a timer still starts does nothing: no candidate
// written and checked, no server state saved, no retry logged.
func TestAnApplyAfterTheStopDoesNothing(t *testing.T) {
	r, _, _ := startedWithSlots(t)
	before := r.file(t)
	checks := r.checkCount()
	if !r.a.take(webInstances("w1", "w2", "w3", "w4", "w5")) { // outgrows its 4 slots: a reload
		t.Fatal("the change was not taken")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.a.apply(ctx, false)
	if r.file(t) != before || r.checkCount() != checks || r.reloadCount() != 0 {
		t.Errorf("after the stop: file changed %v, %d checks, %d reloads", r.file(t) != before,
			r.checkCount()-checks, r.reloadCount())
	}
	if _, err := os.Stat(r.path + ".new"); err == nil {
		t.Error("a candidate was written after the stop")
	}
}

// startedWithSlots is a rig on the built-in template with 4 slots per
// backend, started with web's instances w1 and w2.
func startedWithSlots(t *testing.T) (*rig, *fakeSource, string) {
	t.Helper()
	src := newSource("consul")
	renderer, err := routes.New(slotOptions(routes.NewSlotTable()), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := newRig(t, dir, renderer, src)
	src.ch <- webInstances("w1", "w2")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	return r, src, dir
}

// onFsync has every fsync call hook with the synced file's name first,
// and fail with its error if any.
func onFsync(t *testing.T, hook func(name string) error) {
	prev := fsync
	fsync = func(f *os.File) error {
		if err := hook(f.Name()); err != nil {
			return err
		}
		return prev(f)
	}
	t.Cleanup(func() { fsync = prev })
}

// syncsRecorder counts fsyncs of the configuration file (under any of its
// temporary names) and of its directory.
type syncsRecorder struct {
	mu        sync.Mutex
	file, dir int
}

func recordSyncs(t *testing.T, path string) *syncsRecorder {
	s := &syncsRecorder{}
	onFsync(t, func(name string) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case name == path || strings.HasPrefix(name, filepath.Join(filepath.Dir(path), ".haproxy.cfg.tmp-")):
			s.file++
		case name == filepath.Dir(path):
			s.dir++
		}
		return nil
	})
	return s
}

func (s *syncsRecorder) read() (file, dir int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file, s.dir
}

// A runtime change syncs the new file (on the staging goroutine, while
// HAProxy takes the commands) but not its directory after the rename: the
// syncs were a large part of seamless's CPU per change at 100 × 10, each a
// syscall that keeps the runtime's monitor spinning. A crash before the
// directory is synced brings the previous file back, whole. The directory
// is synced with the snapshots, at the latest when discovery stops.
func TestARuntimeChangeSyncsTheDirectoryWithTheSnapshots(t *testing.T) {
	r, src, _ := startedWithSlots(t)
	syncs := recordSyncs(t, r.path)
	r.a.opts.Runtime = newHAProxyServers(r.a.runRend.Servers.Flat())
	r.a.savedAt = time.Now() // no save due during the change
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	src.ch <- webInstances("w1", "w2", "w3")
	testenv.Eventually(t, 5*time.Second, "the runtime update", func() bool {
		return testutil.ToFloat64(r.m.RuntimeUpdates.WithLabelValues(metrics.Success)) == 1
	})
	if !strings.Contains(r.file(t), "10.0.0.3:8080") {
		t.Fatal("the runtime change is not in the file")
	}
	if file, dir := syncs.read(); file != 1 || dir != 0 {
		t.Errorf("the runtime change synced the configuration %d times and its directory %d times, want 1 and 0", file, dir)
	}
	cancel()
	<-done
	if file, dir := syncs.read(); file != 1 || dir != 1 {
		t.Errorf("after the stop: the configuration synced %d times, its directory %d times; want 1 and 1", file, dir)
	}
}

// A directory sync that fails is tried again at the next save.
func TestAFailedDirectorySyncIsTriedAgain(t *testing.T) {
	r, _, dir := startedWithSlots(t)
	r.a.saving.Wait()
	var failing atomic.Bool
	failing.Store(true)
	var tries atomic.Int32
	onFsync(t, func(name string) error {
		if name != dir {
			return nil
		}
		tries.Add(1)
		if failing.Load() {
			return errors.New("I/O error")
		}
		return nil
	})
	r.a.unsynced.Store(true) // as a runtime change leaves it
	r.a.saveNow()
	r.a.saving.Wait()
	if tries.Load() != 1 || !r.a.unsynced.Load() {
		t.Fatalf("after a failed sync: %d tries, unsynced %v; want 1, true", tries.Load(), r.a.unsynced.Load())
	}
	failing.Store(false)
	r.a.saveNow()
	r.a.saving.Wait()
	if tries.Load() != 2 || r.a.unsynced.Load() {
		t.Errorf("the next save: %d tries in all, unsynced %v; want 2, false", tries.Load(), r.a.unsynced.Load())
	}
}
