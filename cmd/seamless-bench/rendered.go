package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// renderedFile watches a file a tool renders (consul-template's
// destination, seamless's haproxy.cfg) for the changes of a peer run:
// change k has happened in the file once has[k] holds for it (the
// address 127.0.0.1:<port k> appears in it, or a removed instance's is
// gone: toolSetup.inFile). Both tools replace the file by a rename, which inotify
// reports at once (fsnotify on the directory); the file is read on every
// such event, so a change is seen within a file read of its rename. A
// stat every fallbackEvery catches anything an overflowing event queue
// would lose.
type renderedFile struct {
	path string

	mu      sync.Mutex
	loaded  func([]byte) bool   // the complete catalog is in the file
	ready   time.Time           // when loaded first held
	has     []func([]byte) bool // by change: the file shows it
	armed   []bool              // by change: written (or being written)
	seen    []time.Time         // by change: first read holding its address
	early   []int               // changes the file showed before they were written
	reads   int
	lastErr error
	stamp   fileStamp
	changed chan struct{} // closed and replaced when seen or ready move
}

const fallbackEvery = 100 * time.Millisecond

func newRenderedFile(path string, has []func([]byte) bool, loaded func([]byte) bool) *renderedFile {
	return &renderedFile{path: path, loaded: loaded, has: has, changed: make(chan struct{}),
		armed: make([]bool, len(has)), seen: make([]time.Time, len(has))}
}

// arm starts looking for change k; it is called before the change is
// written, since a tool may render it before the write has returned.
func (f *renderedFile) arm(k int) {
	b, err := os.ReadFile(f.path)
	f.mu.Lock()
	if err == nil && f.has[k](b) {
		f.early = append(f.early, k+1)
	}
	f.armed[k] = true
	f.mu.Unlock()
	f.check()
}

// shownEarly returns the changes (numbered from 1) the file showed before
// they were written: the check of the file is wrong for them.
func (f *renderedFile) shownEarly() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.early)
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
	for k, has := range f.has {
		if f.armed[k] && f.seen[k].IsZero() && has(b) {
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

// servesIn reports whether b's section "backend <backend>" has a server
// at addr that takes traffic: a server line without "disabled" (the
// built-in template keeps a drained instance's slot, disabled). The
// section ends at the next line that does not start with white space.
func servesIn(b []byte, backend, addr string) bool {
	head := []byte("\nbackend " + backend + "\n")
	i := bytes.Index(b, head)
	if i < 0 {
		return false
	}
	for rest := b[i+len(head):]; len(rest) > 0; {
		line := rest
		if nl := bytes.IndexByte(rest, '\n'); nl >= 0 {
			line, rest = rest[:nl], rest[nl+1:]
		} else {
			rest = nil
		}
		if len(line) > 0 && line[0] != ' ' && line[0] != '\t' {
			return false
		}
		f := strings.Fields(string(line))
		if len(f) >= 3 && f[0] == "server" && f[2] == addr && !slices.Contains(f[3:], "disabled") {
			return true
		}
	}
	return false
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
