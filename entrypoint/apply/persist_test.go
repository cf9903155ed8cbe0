package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestSnapshotSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	snap := model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: &model.Catalog{Datacenter: "dc1", Instances: []model.Instance{
			{Source: "consul", ID: "web-1", Name: "web", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing,
				Tags: []string{"seamless.http.host=a.example"}, Meta: map[string]string{"v": "1"}},
		}}},
		{Kind: model.QueryKey, Key: "cfg/maxconn"}:  {Pairs: []model.KVPair{{Key: "cfg/maxconn", Value: "100"}}},
		{Kind: model.QueryPrefix, Key: "cfg/"}:      {},
		{Kind: model.QueryDatacenters}:              {Datacenters: []string{"dc1", "dc2"}},
		{Kind: model.QueryCatalog, Datacenter: "x"}: {Catalog: &model.Catalog{Datacenter: "x"}},
	}}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := SaveSnapshot(dir, snap, at); err != nil {
		t.Fatal(err)
	}
	got, when, err := LoadSnapshot(dir, "consul")
	if err != nil {
		t.Fatal(err)
	}
	if !when.Equal(at) || !reflect.DeepEqual(got, snap) {
		t.Errorf("loaded %+v at %v, want %+v at %v", got, when, snap, at)
	}
	if _, _, err := LoadSnapshot(dir, "file"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing snapshot: %v, want ErrNotExist", err)
	}
}

func TestWriteFileReplacesAndLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "haproxy.cfg")
	for _, content := range []string{"one\n", "two\n"} {
		if err := WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != content {
			t.Errorf("content %q, want %q", b, content)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only haproxy.cfg", len(entries))
	}
}

// Saving a large catalog writes it element by element: what it allocates
// is a small part of the file, where json.Marshal held the whole encoding
// twice (as its buffer grew, then the copy it returns). The file still
// reads back as the snapshot saved.
func TestSavingALargeSnapshotDoesNotHoldItWhole(t *testing.T) {
	dir := t.TempDir()
	snap := benchSnapshot(benchCatalog(1000, 10, false))
	snap.Results[model.LocalCatalog].Catalog.Instances[0].Checks = []model.Check{{CheckID: "c", Status: "passing", Output: "<ok & fine>"}}
	snap.Results[model.LocalCatalog].Catalog.Index = 4242
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := SaveSnapshot(dir, snap, at); err != nil { // warm the encoder's caches
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := SaveSnapshot(dir, snap, at); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	fi, err := os.Stat(SnapshotPath(dir, "consul"))
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(fi.Size())/4 {
		t.Errorf("saving a %d KiB snapshot allocated %d KiB; want under a quarter of it", fi.Size()>>10, alloc>>10)
	}
	got, when, err := LoadSnapshot(dir, "consul")
	if err != nil {
		t.Fatal(err)
	}
	if !when.Equal(at) || !model.EqualResults(got.Results, snap.Results) {
		t.Error("the snapshot read back differs from the one saved")
	}
	if gi, si := got.Local().Index, snap.Local().Index; gi != si {
		t.Errorf("the catalog's index read back is %d, want %d", gi, si)
	}
	data, _ := os.ReadFile(SnapshotPath(dir, "consul"))
	var v saved
	if err := json.Unmarshal(data, &v); err != nil || !json.Valid(data) {
		t.Errorf("not valid JSON: %v", err)
	}
}

// Changes that come faster than saveEvery are saved together: the
// snapshot is encoded whole at each save, megabytes at 1000 services × 10.
// The last one is saved within saveEvery all the same.
func TestFastChangesAreSavedTogether(t *testing.T) {
	dir := t.TempDir()
	src := newSource("consul")
	r := newRig(t, dir, lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	start, saves := time.Now(), r.a.saves // Start saved once
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.a.Run(ctx) }()
	const changes = 10
	for i := range changes {
		addr := fmt.Sprintf("10.0.1.%d", i+1)
		src.send("web=" + addr)
		testenv.Eventually(t, 5*time.Second, "change applied", func() bool {
			b, _ := os.ReadFile(r.path)
			return strings.Contains(string(b), addr+"\n")
		})
	}
	elapsed := time.Since(start)
	testenv.Eventually(t, saveEvery+5*time.Second, "the last change saved", func() bool {
		s, _, err := LoadSnapshot(dir, "consul")
		return err == nil && len(s.Local().Instances) == 1 && s.Local().Instances[0].Address == "10.0.1.10"
	})
	cancel()
	<-done
	// Run is done: its counter may be read. At most one save per
	// saveEvery, and one at the end.
	if n, most := r.a.saves-saves, 2+int(elapsed/saveEvery); n > most {
		t.Errorf("%d changes in %s saved %d times; want at most %d", changes, elapsed.Round(time.Millisecond), n, most)
	}
}

// A change every 1.5 s (the peer bench's pace) is not a save every 1.5 s:
// each save encodes the whole catalog (at 1,000 services × 10 a third of
// seamless's CPU per change when it ran at every change).
func TestSteadyChangesSaveAtMostOncePerSaveEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		src := newSource("consul")
		r := newRig(t, dir, lines{}, src)
		src.send("web=10.0.0.1")
		ctx, cancel := context.WithCancel(context.Background())
		if err := r.a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		saves := r.a.saves // Start saved once
		done := make(chan struct{})
		go func() { defer close(done); r.a.Run(ctx) }()
		const changes = 20
		for i := range changes {
			src.send(fmt.Sprintf("web=10.0.1.%d", i+1))
			time.Sleep(1500 * time.Millisecond)
			synctest.Wait()
		}
		cancel()
		<-done
		// 30 s of changes: a save every saveEvery (10 s), and one at the end.
		if n := r.a.saves - saves; n > 4 {
			t.Errorf("%d changes 1.5 s apart saved %d times; want at most 4", changes, n)
		}
		s, _, err := LoadSnapshot(dir, "consul")
		if err != nil || s.Local().Instances[0].Address != "10.0.1.20" {
			t.Errorf("the last change is not saved at the end: %v %+v", err, s.Local())
		}
	})
}

// A save in progress (tens of milliseconds of CPU for a large catalog,
// and what the disk takes to sync) does not hold up the next change.
func TestAChangeDoesNotWaitForASave(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	blocked := make(chan struct{})
	saveSnapshot = func(dir string, s model.Snapshot, now time.Time, c *encodeCache) error {
		if s.Local() != nil && len(s.Local().Instances) == 1 && s.Local().Instances[0].Address == "10.0.1.1" {
			once.Do(func() { close(blocked) })
			<-release
		}
		return saveSnapshotWith(dir, s, now, c)
	}
	t.Cleanup(func() { saveSnapshot = saveSnapshotWith })
	dir := t.TempDir()
	src := newSource("consul")
	r := newRig(t, dir, lines{}, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.a.savedAt = time.Time{} // the next change saves at once
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.a.Run(ctx) }()
	src.send("web=10.0.1.1")
	<-blocked // saving that change, slowly
	src.send("web=10.0.1.2")
	testenv.Eventually(t, 5*time.Second, "the next change applied during the save", func() bool {
		b, _ := os.ReadFile(r.path)
		return strings.Contains(string(b), "10.0.1.2\n")
	})
	close(release)
	cancel()
	<-done
}

// A save encodes only the lists that are not the ones the last save
// wrote: a change to one service of a PerService catalog re-encodes that
// service, and the file is byte for byte what a save from nothing writes.
// With less room than the catalog takes, the rest is encoded at every
// save, and the file is still the same.
func TestASaveEncodesWhatChangedSinceTheLast(t *testing.T) {
	flat := benchCatalog(3, 4, false)
	var runs [][]model.Instance
	for run := range flat.Services() {
		runs = append(runs, run)
	}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	c := &encodeCache{}
	same := func(what string, snap model.Snapshot) {
		t.Helper()
		cached, fresh := t.TempDir(), t.TempDir()
		if err := saveSnapshotWith(cached, snap, at, c); err != nil {
			t.Fatal(err)
		}
		if err := SaveSnapshot(fresh, snap, at); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(SnapshotPath(cached, "consul"))
		want, _ := os.ReadFile(SnapshotPath(fresh, "consul"))
		if string(got) != string(want) {
			t.Errorf("%s: the file differs from a save from nothing:\n%s\nwant\n%s", what, got, want)
		}
	}
	first := benchSnapshot(model.PerService("dc1", flat.Nodes, runs, 7))
	same("first save", first)
	if c.encoded != 4 {
		t.Errorf("the first save encoded %d lists, want 4 (the nodes and 3 services)", c.encoded)
	}

	moved := slices.Clone(runs[1])
	moved[2].Port = 9090
	next := slices.Clone(runs)
	next[1] = moved
	c.encoded = 0
	same("one service changed", benchSnapshot(model.PerService("dc1", flat.Nodes, next, 8)))
	if c.encoded != 1 {
		t.Errorf("a save after one service changed encoded %d lists, want 1", c.encoded)
	}
	c.encoded = 0
	same("nothing changed", benchSnapshot(model.PerService("dc1", flat.Nodes, next, 9)))
	if c.encoded != 0 {
		t.Errorf("a save of the same lists encoded %d, want 0", c.encoded)
	}

	// A flat catalog's lists are new at every snapshot: none is kept.
	c.encoded = 0
	same("a flat catalog", benchSnapshot(flat))
	if c.encoded != 0 || len(c.kept) != 0 {
		t.Errorf("a flat catalog left %d lists kept (%d encoded through the cache), want none", len(c.kept), c.encoded)
	}
	same("one service changed, again", benchSnapshot(model.PerService("dc1", flat.Nodes, next, 10)))

	one := len(c.kept[listKey{instance: &next[0][0], n: len(next[0])}])
	defer func(m int) { maxCached = m }(maxCached)
	maxCached = one
	// The first save reuses what it has and keeps what fits; the next
	// encodes the services that did not (the nodes, smaller, fit).
	for i, want := range []int{0, 3} {
		c.encoded = 0
		same("room for one list", benchSnapshot(model.PerService("dc1", flat.Nodes, next, 9)))
		if c.size > maxCached || c.encoded != want {
			t.Errorf("save %d with room for one list: %d bytes kept, %d lists encoded; want at most %d bytes, %d encoded",
				i+1, c.size, c.encoded, maxCached, want)
		}
	}
}

// BenchmarkSaveAfterOneServiceChanged: the CPU of a save after one
// service of a PerService catalog changed, from nothing (whole) and with
// what the last save kept (kept). `go test ./entrypoint/apply -run XXX
// -bench SaveAfterOneServiceChanged -benchtime 40x`.
func BenchmarkSaveAfterOneServiceChanged(b *testing.B) {
	for _, size := range [][2]int{{100, 10}, {1000, 10}} {
		flat := benchCatalog(size[0], size[1], false)
		var runs [][]model.Instance
		for run := range flat.Services() {
			runs = append(runs, run)
		}
		dir := b.TempDir()
		for _, kept := range []bool{false, true} {
			name := fmt.Sprintf("%dx%d/whole", size[0], size[1])
			var c *encodeCache
			if kept {
				name, c = fmt.Sprintf("%dx%d/kept", size[0], size[1]), &encodeCache{}
			}
			b.Run(name, func(b *testing.B) {
				start, n := cpuNow(), 0
				for i := 0; b.Loop(); i++ {
					n++
					next := slices.Clone(runs)
					moved := slices.Clone(next[i%len(next)])
					moved[0].Port = 1000 + i%1000
					next[i%len(next)] = moved
					runs = next
					snap := benchSnapshot(model.PerService("dc1", flat.Nodes, next, uint64(i+1)))
					if err := saveSnapshotWith(dir, snap, time.Now(), c); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cpuNow()-start)/float64(n)/1e6, "cpu-ms/op")
			})
		}
	}
}
