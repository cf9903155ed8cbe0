package apply

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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
	return saveSnapshotWith(dir, s, now, nil)
}

// saveSnapshotWith is SaveSnapshot reusing what c kept of the last save of
// the same source (nil: nothing kept).
func saveSnapshotWith(dir string, s model.Snapshot, now time.Time, c *encodeCache) error {
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
		if err := c.encodeSaved(bw, v); err != nil {
			return err
		}
		return bw.Flush()
	})
}

// encodeSaved writes v as json.Marshal would, but a catalog's nodes and
// instances one at a time: a catalog of 10,000 instances is megabytes of
// JSON, which Marshal would hold whole (twice, as it grows and copies its
// buffer) at every change. c may be nil.
func (c *encodeCache) encodeSaved(w *bufio.Writer, v saved) error {
	c.begin()
	defer c.end()
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
		} else if err := c.encodeCatalogResult(w, enc, r.Result); err != nil {
			return err
		}
		w.WriteByte('}')
	}
	_, err = w.WriteString("]}")
	return err
}

// encodeCatalogResult writes a Result with a catalog as model.Result's
// JSON tags say, element by element; with a cache, a run of instances (or
// the node list) that is the same list as at the last save is written as
// it was encoded then.
func (c *encodeCache) encodeCatalogResult(w *bufio.Writer, enc *json.Encoder, r model.Result) error {
	cat := r.Catalog
	if cat.Instances != nil {
		c = nil // flat: its lists are new at every snapshot
	}
	w.WriteString(`{"catalog":{`)
	sep := ""
	if cat.Datacenter != "" {
		w.WriteString(`"datacenter":`)
		if err := enc.Encode(cat.Datacenter); err != nil {
			return err
		}
		sep = ","
	}
	if len(cat.Nodes) > 0 { // omitempty
		w.WriteString(sep + `"nodes":[`)
		sep = ","
		if err := c.write(w, enc, listKey{node: &cat.Nodes[0], n: len(cat.Nodes)}, func(out io.Writer, e *json.Encoder) error {
			return encodeEach(out, e, cat.Nodes)
		}); err != nil {
			return err
		}
		w.WriteByte(']')
	}
	if cat.Len() > 0 {
		w.WriteString(sep + `"instances":[`)
		sep = ","
		first := true
		for run := range cat.Services() {
			if !first {
				w.WriteByte(',')
			}
			first = false
			if err := c.write(w, enc, listKey{instance: &run[0], n: len(run)}, func(out io.Writer, e *json.Encoder) error {
				return encodeEach(out, e, run)
			}); err != nil {
				return err
			}
		}
		w.WriteByte(']')
	}
	if cat.Index != 0 {
		w.WriteString(sep + `"index":` + strconv.FormatUint(cat.Index, 10))
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

// encodeEach writes the elements of list, encoded by enc (which writes to
// out), separated by commas.
func encodeEach[E any](out io.Writer, enc *json.Encoder, list []E) error {
	for i := range list {
		if i > 0 {
			if _, err := out.Write([]byte{','}); err != nil {
				return err
			}
		}
		if err := enc.Encode(&list[i]); err != nil {
			return err
		}
	}
	return nil
}

// maxCached bounds what an encodeCache keeps: a few hundred bytes per
// instance (about 420 for Consul's), so tens of thousands of instances; a
// larger catalog has the rest encoded at every save.
var maxCached = 8 << 20

// maxScratch is the largest encoding buffer kept between lists: a list
// larger than that (one service of thousands of instances) is not held
// twice for longer than its own write.
const maxScratch = 1 << 20

// encodeCache keeps, from one save of a source's snapshot to the next,
// the encoding of its PerService catalogs' node lists and runs of
// instances, by the list itself: a catalog is never written once made,
// and the Consul source hands the next catalog every list that did not
// change, so a save encodes what changed since the last one, where it
// encoded the whole catalog. A flat catalog's lists are new at every
// snapshot and are not kept. Only the goroutine saving uses it.
type encodeCache struct {
	kept    map[listKey][]byte // from the last save
	next    map[listKey][]byte // from this one
	size    int                // of next
	scratch bytes.Buffer
	enc     *json.Encoder // into scratch
	encoded int           // lists encoded rather than reused, for the tests
}

// listKey is a list by its first element and length. A kept key holds
// the list, so no other list can be made at its address meanwhile.
type listKey struct {
	instance *model.Instance
	node     *model.Node
	n        int
}

// begin starts a save: what it does not write again is forgotten at end.
func (c *encodeCache) begin() {
	if c != nil {
		c.next, c.size = make(map[listKey][]byte, len(c.kept)), 0
	}
}

// end finishes a save, also one that failed: what it wrote is as right as
// what the last one kept, and keeping that would hold its lists longer.
func (c *encodeCache) end() {
	if c != nil {
		c.kept, c.next = c.next, nil
	}
}

// write writes the list k names to w: as kept, or encoded by encode
// (into out, with its encoder), and kept while there is room.
func (c *encodeCache) write(w *bufio.Writer, enc *json.Encoder, k listKey, encode func(out io.Writer, enc *json.Encoder) error) error {
	if c == nil {
		return encode(w, enc)
	}
	b, ok := c.kept[k]
	if !ok {
		c.encoded++
		if c.size >= maxCached { // no room: straight to the file
			return encode(w, enc)
		}
		if c.enc == nil {
			c.enc = json.NewEncoder(&c.scratch)
			c.enc.SetEscapeHTML(true) // as Marshal
		}
		c.scratch.Reset()
		defer func() {
			if c.scratch.Cap() > maxScratch {
				c.scratch, c.enc = bytes.Buffer{}, nil
			}
		}()
		if err := encode(&c.scratch, c.enc); err != nil {
			return err
		}
		b = c.scratch.Bytes()
	}
	if c.size+len(b) <= maxCached {
		if !ok {
			b = bytes.Clone(b)
		}
		c.next[k] = b
		c.size += len(b)
	}
	_, err := w.Write(b)
	return err
}
