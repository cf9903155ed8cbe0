package certs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/seamless-lb/seamless/internal/regular"
)

// SourceDir is the source label of certificates from SEAMLESS_CERTS_DIR.
const SourceDir = "dir"

// maxFiles bounds the certificates a directory may hold.
const maxFiles = 1000

// settle is how long a burst of events (a cert and its key written one
// after the other, a ..data swap) is let finish before the directory is
// read.
const settle = 100 * time.Millisecond

// Set is a full read of a source: every certificate in use, by name.
type Set struct {
	Certs map[string]*Entry
}

// Entry is one certificate of a source.
type Entry struct {
	Name   string // letters, digits, '.', '_', '-': the installed file's name
	Source string
	File   string // where it came from, for messages
	*Cert
}

// equal reports whether two sets hold the same bundles under the same names.
func (s Set) equal(o Set) bool {
	return maps.EqualFunc(s.Certs, o.Certs, func(a, b *Entry) bool { return bytes.Equal(a.PEM, b.PEM) })
}

// Dir reads certificates from a directory: NAME.pem bundles (certificate,
// chain and key in one file), or NAME.crt with its key in NAME.key (or in
// NAME.crt itself). Hidden names (Kubernetes' ..data and its timestamped
// directories), editors' backups and subdirectories are ignored; symbolic
// links are followed, so a mounted Secret or ConfigMap works. A file that
// fails Check is refused with a message naming it; when it had been good,
// its last good content keeps serving until it is fixed or removed.
type Dir struct {
	dir    string
	rescan time.Duration
	now    func() time.Time
	log    *slog.Logger
	good   map[string]*Entry // last good content, by name
	logged map[string]string // problems logged, by file, so each is logged once
}

// NewDir returns a source for dir, read every rescan besides the
// notifications. now may be nil (time.Now).
func NewDir(dir string, rescan time.Duration, now func() time.Time, log *slog.Logger) *Dir {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Dir{dir: dir, rescan: rescan, now: now, log: log.With("component", "certs", "dir", dir),
		good: map[string]*Entry{}, logged: map[string]string{}}
}

// Scan reads the directory once. Problems are logged (each once, until it
// changes) and returned by file name.
func (d *Dir) Scan() (Set, map[string]string, error) {
	names, err := d.list()
	if err != nil {
		return Set{}, nil, fmt.Errorf("certificates directory %s: %w", d.dir, err)
	}
	problems := map[string]string{}
	good := map[string]*Entry{}
	for _, base := range names.bundles {
		file := filepath.Join(d.dir, base.file)
		data, err := regular.ReadFile(file)
		if err == nil && base.key != "" {
			var key []byte
			if key, err = regular.ReadFile(filepath.Join(d.dir, base.key)); err == nil {
				data = append(append(data, '\n'), key...)
			}
		}
		var c *Cert
		if err == nil {
			c, err = Check(data, d.now())
		}
		if err != nil {
			problems[base.file] = err.Error()
			if last, ok := d.good[base.name]; ok {
				good[base.name] = last
				problems[base.file] += "; its last good content keeps serving"
			}
			continue
		}
		good[base.name] = &Entry{Name: base.name, Source: SourceDir, File: file, Cert: c}
	}
	for _, f := range names.orphans {
		problems[f] = "a key without its certificate (NAME.key needs NAME.crt)"
	}
	for f, p := range problems {
		if d.logged[f] != p {
			d.log.Error("certificate refused", "file", filepath.Join(d.dir, f), "err", p)
		}
	}
	for f := range d.logged {
		if _, ok := problems[f]; !ok {
			d.log.Info("certificate file no longer refused", "file", filepath.Join(d.dir, f))
		}
	}
	d.logged = problems
	d.good = good
	return Set{Certs: maps.Clone(good)}, problems, nil
}

type bundle struct {
	name string // installed name
	file string // the certificate's file, base name
	key  string // the key's file, "" when in file
}

type listing struct {
	bundles []bundle
	orphans []string
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// list finds the bundles of the directory, sorted by file name.
func (d *Dir) list() (listing, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return listing{}, err
	}
	files := map[string]bool{}
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || strings.HasPrefix(n, "#") || strings.HasSuffix(n, "~") || e.IsDir() {
			continue
		}
		files[n] = true
	}
	var l listing
	for _, n := range slices.Sorted(maps.Keys(files)) {
		ext := strings.ToLower(filepath.Ext(n))
		stem := strings.TrimSuffix(n, filepath.Ext(n))
		b := bundle{name: installName(stem), file: n}
		switch ext {
		case ".pem":
		case ".crt":
			for _, k := range []string{stem + ".key", stem + ".KEY"} {
				if files[k] {
					b.key = k
				}
			}
		case ".key":
			if !files[stem+".crt"] && !files[stem+".CRT"] {
				l.orphans = append(l.orphans, n)
			}
			continue
		default:
			continue
		}
		if len(l.bundles) == maxFiles {
			return listing{}, fmt.Errorf("holds more than %d certificates", maxFiles)
		}
		l.bundles = append(l.bundles, b)
	}
	// web.pem and web.crt would both be "web": the later one gets the
	// hash of its file name.
	seen := map[string]bool{}
	for i := range l.bundles {
		if seen[l.bundles[i].name] {
			l.bundles[i].name = installName(l.bundles[i].file)
		}
		seen[l.bundles[i].name] = true
	}
	return l, nil
}

// installName makes a file name safe for a crt-list line and a runtime
// command: names of other characters keep what they can and add a hash of
// the whole.
func installName(stem string) string {
	safe := unsafeName.ReplaceAllString(stem, "_")
	if safe == stem && len(stem) <= 100 && stem != "" {
		return stem
	}
	sum := sha256.Sum256([]byte(stem))
	return fmt.Sprintf("%.60s-%s", safe, hex.EncodeToString(sum[:4]))
}

// Run reads the directory at once, then whenever it changes (inotify, let
// settle) and every rescan, and sends each set that differs from the one
// sent before. A slow reader gets only the newest set. It returns when ctx
// ends.
func (d *Dir) Run(ctx context.Context, out chan<- Set) {
	var (
		w        *fsnotify.Watcher
		pending  *Set
		sent     *Set
		settling bool
		settleT  = time.NewTimer(settle)
		rescanT  = time.NewTimer(0)
	)
	settleT.Stop()
	defer settleT.Stop()
	defer rescanT.Stop()
	defer func() {
		if w != nil {
			w.Close()
		}
	}()
	var events <-chan fsnotify.Event
	var errs <-chan error
	for {
		var send chan<- Set
		var s Set
		if pending != nil {
			send, s = out, *pending
		}
		select {
		case <-ctx.Done():
			return
		case send <- s:
			sent, pending = &s, nil
			continue
		case ev, ok := <-events:
			// The directory itself removed or renamed away (a volume
			// swapped): watch whatever the path names at the next read.
			if !ok || ev.Name == d.dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				if ok {
					w.Close()
				}
				w, events, errs = nil, nil, nil
			}
			if !settling {
				settling = true
				settleT.Reset(settle)
			}
			continue
		case _, ok := <-errs:
			if !ok {
				w, events, errs = nil, nil, nil
			}
			if !settling {
				settling = true
				settleT.Reset(settle)
			}
			continue
		case <-settleT.C:
			settling = false
		case <-rescanT.C:
			rescanT.Reset(d.rescan)
		}
		// Watch before reading, so that no change falls between the two.
		// A directory replaced as a whole is found by the rescan.
		if w == nil {
			if nw, err := fsnotify.NewWatcher(); err == nil {
				if err := nw.Add(d.dir); err == nil {
					w, events, errs = nw, nw.Events, nw.Errors
				} else {
					nw.Close()
				}
			}
		}
		set, _, err := d.Scan()
		if err != nil {
			d.log.Warn("cannot read the certificates directory; the certificates in use stay", "err", err)
			continue
		}
		if sent != nil && set.equal(*sent) {
			pending = nil
		} else {
			pending = &set
		}
	}
}
