package apply

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// WriteFile replaces path with data atomically: a temporary file in the
// same directory, fsync, rename, fsync of the directory. A reader (HAProxy,
// a crash) sees the old bytes or the new ones, never a mix.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename this fails harmlessly
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// saved is a snapshot as kept on disk: Snapshot.Results has struct keys,
// which JSON cannot express.
type saved struct {
	Source  string        `json:"source"`
	SavedAt time.Time     `json:"saved_at"`
	Results []savedResult `json:"results"`
}

type savedResult struct {
	Query  model.Query  `json:"query"`
	Result model.Result `json:"result"`
}

// SnapshotPath is where a source's last snapshot is kept under the state
// directory (SEAMLESS_STATE_DIR).
func SnapshotPath(dir, source string) string {
	return filepath.Join(dir, "sources", source+".json")
}

// SaveSnapshot keeps a source's last snapshot, so that a restart while the
// source is unreachable still renders what it last said.
func SaveSnapshot(dir string, s model.Snapshot, now time.Time) error {
	v := saved{Source: s.Source, SavedAt: now}
	for q, r := range s.Results {
		v.Results = append(v.Results, savedResult{q, r})
	}
	slices.SortFunc(v.Results, func(a, b savedResult) int { return strings.Compare(a.Query.String(), b.Query.String()) })
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p := SnapshotPath(dir, s.Source)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	return WriteFile(p, data, 0o640)
}

// LoadSnapshot returns the saved snapshot of source and when it was saved;
// os.ErrNotExist when there is none. Sources read their own past from it
// (the file source its order of first sight) instead of parsing the file.
func LoadSnapshot(dir, source string) (model.Snapshot, time.Time, error) {
	data, err := os.ReadFile(SnapshotPath(dir, source))
	if err != nil {
		return model.Snapshot{}, time.Time{}, err
	}
	var v saved
	if err := json.Unmarshal(data, &v); err != nil {
		return model.Snapshot{}, time.Time{}, fmt.Errorf("%s: %w", SnapshotPath(dir, source), err)
	}
	s := model.Snapshot{Source: source, Results: map[model.Query]model.Result{}}
	for _, r := range v.Results {
		s.Results[r.Query] = r.Result
	}
	return s, v.SavedAt, nil
}
