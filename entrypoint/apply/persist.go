package apply

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// WriteFile replaces path with data atomically: a temporary file in the
// same directory, fsync, rename, fsync of the directory. A reader (HAProxy,
// a crash) sees the old bytes or the new ones, never a mix.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return writeFileWith(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// writeFileWith is WriteFile with the content written by write, so that
// a large content need not be held whole in memory first.
func writeFileWith(path string, perm os.FileMode, write func(io.Writer) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after a successful rename this fails harmlessly
	return rename(tmp, path)
}

// writeTemp writes and syncs a file beside path, under a name of its own
// that it returns.
func writeTemp(path string, perm os.FileMode, write func(io.Writer) error) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	err = write(f)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// rename gives tmp the name path, for good: the directory is synced.
func rename(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// fsync is (*os.File).Sync; tests count the calls.
var fsync = (*os.File).Sync

// stagedFile is a file being written and synced under a temporary name
// while something else happens, which takes its name only at commit. The
// directory is not synced at the rename: a crash may bring the previous
// file back, whole, until syncDir runs (Applier.saveNow).
type stagedFile struct {
	path string
	done chan struct{}
	tmp  string // once done
	err  error  // once done
}

// stageFile starts writing data for path; call commit or discard. data
// must not change meanwhile.
func stageFile(path string, data []byte, perm os.FileMode) *stagedFile {
	s := &stagedFile{path: path, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.tmp, s.err = writeTemp(path, perm, func(w io.Writer) error {
			_, err := w.Write(data)
			return err
		})
	}()
	return s
}

// commit waits for the write and renames the file to its path.
func (s *stagedFile) commit() error {
	<-s.done
	if s.err != nil {
		return s.err
	}
	if err := os.Rename(s.tmp, s.path); err != nil {
		os.Remove(s.tmp)
		return err
	}
	return nil
}

// discard waits for the write and removes what it wrote.
func (s *stagedFile) discard() {
	<-s.done
	if s.err == nil {
		os.Remove(s.tmp)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsync(d)
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
	p := SnapshotPath(dir, s.Source)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	return writeFileWith(p, 0o640, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 64<<10)
		if err := encodeSaved(bw, v); err != nil {
			return err
		}
		return bw.Flush()
	})
}

// encodeSaved writes v as json.Marshal would, but a catalog's nodes and
// instances one at a time: a catalog of 10,000 instances is megabytes of
// JSON, which Marshal would hold whole (twice, as it grows and copies its
// buffer) at every change.
func encodeSaved(w *bufio.Writer, v saved) error {
	enc := json.NewEncoder(w) // Encode ends each value with a newline, which JSON allows
	enc.SetEscapeHTML(true)   // as Marshal
	head := v
	head.Results = nil
	b, err := json.Marshal(head)
	if err != nil {
		return err
	}
	// {"source":…,"saved_at":…,"results":null}: open the list instead.
	b = bytes.TrimSuffix(b, []byte("null}"))
	w.Write(b)
	w.WriteByte('[')
	for i, r := range v.Results {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteString(`{"query":`)
		if err := enc.Encode(r.Query); err != nil {
			return err
		}
		w.WriteString(`,"result":`)
		if r.Result.Catalog == nil {
			if err := enc.Encode(r.Result); err != nil {
				return err
			}
		} else if err := encodeCatalogResult(w, enc, r.Result); err != nil {
			return err
		}
		w.WriteByte('}')
	}
	_, err = w.WriteString("]}")
	return err
}

// encodeCatalogResult writes a Result with a catalog as model.Result's
// JSON tags say, element by element.
func encodeCatalogResult(w *bufio.Writer, enc *json.Encoder, r model.Result) error {
	c := r.Catalog
	w.WriteString(`{"catalog":{`)
	sep := ""
	if c.Datacenter != "" {
		w.WriteString(`"datacenter":`)
		if err := enc.Encode(c.Datacenter); err != nil {
			return err
		}
		sep = ","
	}
	nodes := func(yield func(any) bool) {
		for i := range c.Nodes {
			if !yield(&c.Nodes[i]) {
				return
			}
		}
	}
	instances := func(yield func(any) bool) {
		for s := range c.Services() {
			for i := range s {
				if !yield(&s[i]) {
					return
				}
			}
		}
	}
	for _, list := range []struct {
		name string
		n    int
		each iter.Seq[any]
	}{
		{"nodes", len(c.Nodes), nodes},
		{"instances", c.Len(), instances},
	} {
		if list.n == 0 {
			continue // omitempty
		}
		w.WriteString(sep + `"` + list.name + `":[`)
		sep = ","
		first := true
		for v := range list.each {
			if !first {
				w.WriteByte(',')
			}
			first = false
			if err := enc.Encode(v); err != nil {
				return err
			}
		}
		w.WriteByte(']')
	}
	if c.Index != 0 {
		w.WriteString(sep + `"index":` + strconv.FormatUint(c.Index, 10))
	}
	w.WriteByte('}')
	rest := r
	rest.Catalog = nil
	b, err := json.Marshal(rest) // pairs and datacenters, when any
	if err != nil {
		return err
	}
	if len(b) > 2 {
		w.WriteByte(',')
		w.Write(b[1 : len(b)-1])
	}
	_, err = w.WriteString("}")
	return err
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
