package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// renderedFile watches a file a tool renders (consul-template's
// destination, seamless's haproxy.cfg) for the changes of a peer run:
// change k has happened in the file once the address 127.0.0.1:<port k>
// appears in it. Both tools replace the file by a rename, which inotify
// reports at once (fsnotify on the directory); the file is read on every
// such event, so a change is seen within a file read of its rename. A
// stat every fallbackEvery catches anything an overflowing event queue
// would lose.
type renderedFile struct {
	path string

	mu      sync.Mutex
	loaded  func([]byte) bool // the complete catalog is in the file
	ready   time.Time         // when loaded first held
	tokens  [][]byte          // by change: the address it brings
	armed   []bool            // by change: written (or being written)
	seen    []time.Time       // by change: first read holding its address
	reads   int
	lastErr error
	stamp   fileStamp
	changed chan struct{} // closed and replaced when seen or ready move
}

const fallbackEvery = 100 * time.Millisecond

func newRenderedFile(path string, ports []int, loaded func([]byte) bool) *renderedFile {
	f := &renderedFile{path: path, loaded: loaded, changed: make(chan struct{}),
		armed: make([]bool, len(ports)), seen: make([]time.Time, len(ports))}
	for _, p := range ports {
		f.tokens = append(f.tokens, []byte("127.0.0.1:"+strconv.Itoa(p)))
	}
	return f
}

// arm starts looking for change k; it is called before the change is
// written, since a tool may render it before the write has returned.
func (f *renderedFile) arm(k int) {
	f.mu.Lock()
	f.armed[k] = true
	f.mu.Unlock()
	f.check()
}

// run watches until ctx ends.
func (f *renderedFile) run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(f.path)); err != nil {
		return err
	}
	base := filepath.Base(f.path)
	tick := time.NewTicker(fallbackEvery)
	defer tick.Stop()
	f.check()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if filepath.Base(ev.Name) == base && ev.Op&(fsnotify.Create|fsnotify.Write) != 0 {
				f.check()
			}
		case <-w.Errors:
			f.check()
		case <-tick.C:
			f.checkIfStatChanged()
		}
	}
}

// fileStamp tells one version of the file from another without reading it.
type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

func (f *renderedFile) checkIfStatChanged() {
	fi, err := os.Stat(f.path)
	if err != nil {
		return
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if ino, ok := statIno(fi); ok {
		st.ino = ino
	}
	f.mu.Lock()
	same := st == f.stamp
	f.mu.Unlock()
	if !same {
		f.check()
	}
}

// check reads the file and records what it holds now.
func (f *renderedFile) check() {
	fi, err := os.Stat(f.path)
	b, err2 := os.ReadFile(f.path)
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		f.stamp = fileStamp{size: fi.Size(), mtime: fi.ModTime()}
		if ino, ok := statIno(fi); ok {
			f.stamp.ino = ino
		}
	}
	if err2 != nil {
		f.lastErr = err2
		return
	}
	f.reads++
	moved := false
	if f.ready.IsZero() && f.loaded(b) {
		f.ready, moved = now, true
	}
	for k, tok := range f.tokens {
		if f.armed[k] && f.seen[k].IsZero() && containsAddr(b, tok) {
			f.seen[k], moved = now, true
		}
	}
	if moved {
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// state returns when the catalog was first complete, when each change was
// first seen (zero: not yet), how many reads that took, and a channel
// closed at the next news.
func (f *renderedFile) state() (ready time.Time, seen []time.Time, reads int, next <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready, append([]time.Time(nil), f.seen...), f.reads, f.changed
}

func statIno(fi os.FileInfo) (int64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int64(st.Ino), true
}

// containsAddr reports whether b holds addr not followed by a further
// digit (127.0.0.1:4012 is not in 127.0.0.1:40123).
func containsAddr(b, addr []byte) bool {
	for {
		i := bytes.Index(b, addr)
		if i < 0 {
			return false
		}
		end := i + len(addr)
		if end == len(b) || b[end] < '0' || b[end] > '9' {
			return true
		}
		b = b[end:]
	}
}

// countAddrs counts the occurrences of addr as containsAddr matches it.
func countAddrs(b, addr []byte) int {
	n := 0
	for {
		i := bytes.Index(b, addr)
		if i < 0 {
			return n
		}
		end := i + len(addr)
		if end == len(b) || b[end] < '0' || b[end] > '9' {
			n++
		}
		b = b[end:]
	}
}
