package file

import (
	"log/slog"
	"os"
	"slices"

	"github.com/fsnotify/fsnotify"
)

// watch keeps an inotify watch on the directory at a path, moving it when
// the path comes to name another directory. Without a watch (inotify's
// limits reached) the source still reads the directory every Rescan.
// Only Run's goroutine uses it.
type watch struct {
	dir string
	log *slog.Logger
	w   *fsnotify.Watcher
	// on is the directory the watch is on; nil when there is none.
	on     os.FileInfo
	failed bool // the last attempt failed and was logged
	ever   bool // a watch was on once
}

// ensure watches the directory dir names now, if it does not already.
func (w *watch) ensure() {
	fi, err := os.Stat(w.dir)
	if err != nil {
		return // the read that follows reports it
	}
	// An inode number can come back for a new directory; a watch that
	// inotify dropped (the directory deleted) is gone from the list.
	if w.on != nil && os.SameFile(w.on, fi) && slices.Contains(w.w.WatchList(), w.dir) {
		return
	}
	if w.w == nil {
		if w.w, err = fsnotify.NewWatcher(); err != nil {
			w.fail(err)
			return
		}
	}
	// Drop the watch on the directory the path named before, if any.
	_ = w.w.Remove(w.dir)
	if err := w.w.Add(w.dir); err != nil {
		w.fail(err)
		return
	}
	if w.ever {
		w.log.Info("watching the services directory again", "dir", w.dir)
	}
	w.on, w.failed, w.ever = fi, false, true
}

func (w *watch) fail(err error) {
	if !w.failed {
		w.log.Warn("cannot watch the services directory; it is read every rescan interval only", "dir", w.dir, "err", err)
	}
	w.failed = true
}

// saw notes an event: the directory itself removed or renamed away ends
// the watch, and the next ensure watches whatever the path names then.
func (w *watch) saw(ev fsnotify.Event) {
	if ev.Name == w.dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
		w.log.Info("services directory removed or renamed; following the path", "dir", w.dir, "op", ev.Op.String())
		w.on = nil
	}
}

// events and errors are the watcher's channels, nil (never ready) without
// a watcher.
func (w *watch) events() <-chan fsnotify.Event {
	if w.w == nil {
		return nil
	}
	return w.w.Events
}

func (w *watch) errors() <-chan error {
	if w.w == nil {
		return nil
	}
	return w.w.Errors
}

// close ends the watch; a later ensure starts another.
func (w *watch) close() {
	if w.w != nil {
		w.w.Close()
		w.w, w.on = nil, nil
	}
}
