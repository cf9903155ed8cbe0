package apply

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
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
	data, _ := os.ReadFile(SnapshotPath(dir, "consul"))
	var v saved
	if err := json.Unmarshal(data, &v); err != nil || !json.Valid(data) {
		t.Errorf("not valid JSON: %v", err)
	}
}
