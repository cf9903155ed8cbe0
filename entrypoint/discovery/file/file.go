// Package file is the discovery source that reads services from a
// directory of files (SEAMLESS_SERVICES_DIR), one service per file.
//
// # Which files
//
// Every regular file (or symlink to one) directly in the directory whose
// name ends in .yaml, .yml or .json, in any case. Hidden names (.web.yaml,
// and so editors' .web.yaml.swp and Kubernetes' ..data), names that start
// with '#' or end in '~' (Emacs and other editors' backups) and
// subdirectories are ignored. A .json file is read as JSON, any other as
// YAML; files are UTF-8, with or without a byte order mark.
//
// # Format
//
// JSON and YAML have the same fields:
//
//	name: web                        # required: the service's name
//	tags: ["seamless.http.host=web.example.com"]   # optional
//	meta: {team: shop}               # optional
//	instances:                       # optional; none is a service without instances
//	  - address: 10.0.0.11           # required: IP address or host name
//	    port: 8080                   # required: 1-65535
//	    weight: 10                   # optional: 1 or more; left out, HAProxy's default
//	    id: web-1                    # optional: unique in the file; default address:port
//	    tags: ["canary"]             # optional: added after the service's tags
//	    meta: {zone: a}              # optional: merged over the service's meta
//
// Parsing is strict, and every error names the file and the line: unknown
// fields, a field given twice, a wrong type, a missing name, address or
// port, a port outside 1-65535, a weight below 1, two instances with the
// same id or the same address and port. String fields take any scalar as
// written (`version: 1.10` is "1.10"), but not null, a list or a mapping;
// integers are decimal (not 010, 0x1f or 1_000). An optional field set to
// null is left out. YAML anchors and aliases work; merge keys (<<) do not.
// One file holds one YAML document. Names, tags and meta are passed on as
// they are: whether HAProxy can take them is for the renderer to check.
//
// Each instance becomes a model.Instance with Source "file", Status
// passing, the service's Name, and ID, Address, Port, Weight, Tags and
// Meta as above. Node is empty and the catalog has no nodes: a file says
// nothing of the machine an instance runs on. Datacenter is empty (the
// local one).
//
// # Errors
//
// A file that does not parse is logged (file:line and what is wrong) and
// keeps the service it declared when it last parsed in this process; a file
// that never parsed contributes nothing. A deleted file removes its
// service. When two files declare the same service, the first in lexical
// order of file names wins and the other is reported. Status is not Up
// while any file has a problem.
//
// # Bounds
//
// No input may exhaust the memory of PID 1 (see limits.go): a file holds
// at most 256 KiB and 5,000 instances; the directory at most 2,000
// services files, 16 MiB and 20,000 instances together. A file past a
// limit is rejected like a malformed one (the totals reject the files last
// in lexical order); a directory of more files is not read at all, and
// every service read before stays in use.
//
// # Watching
//
// The directory is watched with inotify (fsnotify), and any event in it
// re-reads the whole directory: an editor's write-and-rename, a Kubernetes
// ConfigMap swapping its ..data symlink, files created or removed. When the
// directory itself is removed or renamed, the watch follows the path to the
// new directory. Every Config.Rescan the directory is read again anyway, to
// catch what inotify cannot see (a change in a symlink's target elsewhere,
// a full event queue).
package file

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Name is the source's name in snapshots, instances and status.
const Name = "file"

// Config configures the source.
type Config struct {
	// Dir is the directory of services files (SEAMLESS_SERVICES_DIR).
	Dir string
	// Rescan is how often the whole directory is read again even without
	// an event; 0 means DefaultRescan.
	Rescan time.Duration
	// Saved loads the applier's saved snapshot of this source (in
	// SEAMLESS_STATE_DIR, apply.LoadSnapshot), read once for the
	// services' order of first sight (see order.go); nil, or an error
	// satisfying errors.Is(err, fs.ErrNotExist), starts afresh.
	Saved func() (model.Snapshot, error)
}

// DefaultRescan is Config.Rescan's default.
const DefaultRescan = 30 * time.Second

// settle is how long the first event of a burst waits for the rest (an
// editor's create, write and rename), so that one re-read covers them.
// It is not extended by later events: no burst delays a change longer.
const settle = 5 * time.Millisecond

// Backoff between attempts to read a directory that cannot be read; it
// doubles up to Config.Rescan.
const minBackoff = 100 * time.Millisecond

// Source is the services directory source. Create it with New; call Run
// once.
type Source struct {
	dir    string
	rescan time.Duration
	saved  func() (model.Snapshot, error)
	log    *slog.Logger

	mu     sync.Mutex
	status model.SourceStatus
}

var (
	_ model.Source   = (*Source)(nil)
	_ model.Reporter = (*Source)(nil)
)

// New checks that cfg.Dir is a readable directory and returns the source.
// log may be nil.
func New(cfg Config, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Dir == "" {
		return nil, errors.New("SEAMLESS_SERVICES_DIR is empty")
	}
	dir := filepath.Clean(cfg.Dir)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("SEAMLESS_SERVICES_DIR %s does not exist: %w", dir, err)
	case err != nil:
		return nil, fmt.Errorf("SEAMLESS_SERVICES_DIR %s: %w", dir, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("SEAMLESS_SERVICES_DIR %s is not a directory", dir)
	}
	if _, err := os.ReadDir(dir); err != nil {
		return nil, fmt.Errorf("SEAMLESS_SERVICES_DIR %s cannot be read: %w", dir, err)
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = DefaultRescan
	}
	return &Source{
		dir: dir, rescan: cfg.Rescan, saved: cfg.Saved,
		log:    log.With("component", "discovery", "source", Name),
		status: model.SourceStatus{Name: Name},
	}, nil
}

// Name returns "file".
func (s *Source) Name() string { return Name }

// Status says whether the last read of the directory was clean.
func (s *Source) Status() model.SourceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Run reads the directory, sends its services, and sends them again
// whenever they change, until ctx ends. See model.Source for the contract:
// a slow reader gets only the newest snapshot, and a read that changes
// nothing sends nothing. While the directory cannot be read (it was
// removed after New), Run retries with backoff and sends nothing.
func (s *Source) Run(ctx context.Context, out chan<- model.Snapshot) {
	s.log.Info("reading services files", "dir", s.dir, "rescan", s.rescan)
	sc := newScanner(s.dir, s.log)
	sc.order = loadFirstSeen(s.saved, s.log)
	w := &watch{dir: s.dir, log: s.log}
	defer w.close()

	var (
		pending  *model.Snapshot // newest, not yet taken
		sent     *model.Catalog  // last taken; nil before the first
		backoff  time.Duration
		settling bool
		settleT  = time.NewTimer(settle)
		rescanT  = time.NewTimer(0) // the first read, at once
	)
	settleT.Stop()
	defer settleT.Stop()
	defer rescanT.Stop()
	for {
		var (
			send chan<- model.Snapshot // nil, so never chosen, without a pending snapshot
			snap model.Snapshot
		)
		if pending != nil {
			send, snap = out, *pending
		}
		select {
		case <-ctx.Done():
			return
		case send <- snap:
			sent, pending = snap.Local(), nil
			continue
		case ev, ok := <-w.events():
			if !ok { // the watcher stopped: make another at the next read
				w.close()
			} else {
				w.saw(ev)
			}
			if !settling {
				settling = true
				settleT.Reset(settle)
			}
			continue
		case err, ok := <-w.errors():
			if !ok {
				w.close()
			} else { // an overflowed queue lost events: read everything again
				s.log.Warn("watching the services directory", "dir", s.dir, "err", err)
			}
			if !settling {
				settling = true
				settleT.Reset(settle)
			}
			continue
		case <-settleT.C:
			settling = false
		case <-rescanT.C:
		}

		// Watch before reading, so that no change falls between the two.
		w.ensure()
		cat, problems, err := sc.scan()
		s.record(problems, err)
		if err != nil {
			backoff = min(max(2*backoff, minBackoff), s.rescan)
			rescanT.Reset(backoff)
			continue
		}
		backoff = 0
		rescanT.Reset(s.rescan)
		if sent != nil && reflect.DeepEqual(cat, sent) {
			pending = nil // the reader has it already
		} else {
			pending = &model.Snapshot{Source: Name, Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: cat}}}
		}
	}
}

// record updates the status after a read.
func (s *Source) record(problems []string, err error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && len(problems) == 0 {
		s.status.Up, s.status.LastSuccess = true, now
		return
	}
	s.status.Up, s.status.LastErrorAt = false, now
	if err != nil {
		s.status.LastError = err.Error()
		return
	}
	s.status.LastError = problems[0]
	if n := len(problems) - 1; n > 0 {
		s.status.LastError += fmt.Sprintf(" (and %d more file(s) with problems; see the log)", n)
	}
}
