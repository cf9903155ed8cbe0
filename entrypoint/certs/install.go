package certs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// CLI sends one command to HAProxy's master CLI and returns the answer
// (haproxy.MasterCLI).
type CLI interface {
	Do(ctx context.Context, cmd string) (string, error)
}

// InstallerOptions configure an Installer.
type InstallerOptions struct {
	// Dir is where the installed certificates and the crt-list live
	// (SEAMLESS_STATE_DIR/certs): what HAProxy loads when it (re)starts.
	Dir string
	// CLI is the master CLI; commands go to the current worker ("@1").
	CLI CLI
	// Reload asks for a reload when the runtime API failed: the files
	// are right, so a reload serves them.
	Reload func(reason string)
	// Metrics records each certificate's end; nil: none.
	Metrics *Metrics
	Now     func() time.Time
	Log     *slog.Logger
}

// Installer keeps HAProxy's certificates equal to a Set: in the files
// HAProxy loads at start and at every reload (one PEM per certificate and
// a crt-list, the self-signed default first), and in the running worker
// through the runtime API, with no reload. A runtime failure falls back
// to a reload.
type Installer struct {
	o         InstallerOptions
	log       *slog.Logger
	list      string
	def       *Entry
	installed map[string]*Entry

	mu    sync.Mutex           // guards since and installed for Served
	since map[string]time.Time // when each name's current content was installed
	defAt time.Time
}

// safePath is what a path must look like to appear in a crt-list line and
// a runtime command.
var safePath = regexp.MustCompile(`^/[A-Za-z0-9._/-]{1,900}$`)

// NewInstaller makes the default certificate if needed and writes the
// crt-list with it alone; Install then adds the sources' certificates.
func NewInstaller(o InstallerOptions) (*Installer, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if !safePath.MatchString(o.Dir) {
		return nil, fmt.Errorf("certificates directory %q: only letters, digits and . _ / - may be used in the path (it goes into HAProxy's crt-list)", o.Dir)
	}
	i := &Installer{o: o, log: o.Log.With("component", "certs"), list: filepath.Join(o.Dir, "crt-list"), installed: map[string]*Entry{}}
	path := filepath.Join(o.Dir, "default.pem")
	c, created, err := EnsureDefault(path, o.Now())
	if err != nil {
		return nil, err
	}
	if created {
		i.log.Info("self-signed default certificate created; it is served to clients whose SNI names no certificate", "file", path,
			"not_after", c.NotAfter.UTC().Format(time.RFC3339))
	}
	i.def = &Entry{Name: "default", Source: "default", File: path, Cert: c}
	i.defAt = o.Now()
	if o.Metrics != nil {
		o.Metrics.set(i.def)
	}
	return i, nil
}

// CrtList is the crt-list file the HTTPS frontend binds with.
func (i *Installer) CrtList() string { return i.list }

func (i *Installer) path(name string) string { return filepath.Join(i.o.Dir, "live", name+".pem") }

// Prepare writes the files of set, before HAProxy runs: nothing is sent
// over the runtime API.
func (i *Installer) Prepare(set Set) error {
	if err := i.writeFiles(set); err != nil {
		return err
	}
	i.served(set, slices.Collect(maps.Keys(set.Certs)))
	for _, e := range set.Certs {
		i.warnExpiry(e)
	}
	return nil
}

// writeFiles writes the certificates of set, then the crt-list naming
// them, and removes the files of certificates no longer in it.
func (i *Installer) writeFiles(set Set) error {
	var lines strings.Builder
	lines.WriteString(i.def.File + "\n") // the first line is the default
	for _, name := range slices.Sorted(maps.Keys(set.Certs)) {
		e := set.Certs[name]
		p := i.path(name)
		if old, ok := i.installed[name]; !ok || string(old.PEM) != string(e.PEM) || !exists(p) {
			if err := writeFile(p, e.PEM); err != nil {
				return fmt.Errorf("certificate %s: %w", e.File, err)
			}
		}
		lines.WriteString(p + "\n")
	}
	if err := writeFile(i.list, []byte(lines.String())); err != nil {
		return fmt.Errorf("crt-list: %w", err)
	}
	entries, _ := os.ReadDir(filepath.Join(i.o.Dir, "live"))
	for _, de := range entries {
		name, ok := strings.CutSuffix(de.Name(), ".pem")
		if _, keep := set.Certs[name]; !ok || !keep {
			os.Remove(filepath.Join(i.o.Dir, "live", de.Name()))
		}
	}
	return nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// Install makes set the certificates HAProxy serves: the files first (so
// that any reload from now on loads set), then the running worker over the
// runtime API, each change verified with `show ssl cert`. When the runtime
// API fails, a reload is asked for. It returns what failed, if anything.
func (i *Installer) Install(ctx context.Context, set Set) error {
	var added, changed, removed []string
	for name, e := range set.Certs {
		switch old, ok := i.installed[name]; {
		case !ok:
			added = append(added, name)
		case string(old.PEM) != string(e.PEM):
			changed = append(changed, name)
		}
	}
	for name := range i.installed {
		if _, ok := set.Certs[name]; !ok {
			removed = append(removed, name)
		}
	}
	if len(added)+len(changed)+len(removed) == 0 {
		return nil
	}
	slices.Sort(added)
	slices.Sort(changed)
	slices.Sort(removed)
	if err := i.writeFiles(set); err != nil {
		// HAProxy keeps what it has; Run tries again.
		i.log.Error("cannot write the certificate files; HAProxy keeps its certificates", "err", err)
		return &WriteError{Err: err}
	}
	old := i.installed
	// The worker the commands reach now: a reload (a SIGHUP) in flight is
	// waited for, and one that starts later shows as another worker.
	before := i.worker(ctx)
	done := map[string]bool{}
	errs := i.runtime(ctx, set, old, added, changed, removed, done)
	if len(errs) > 0 && ctx.Err() == nil {
		if now := i.worker(ctx); now != 0 && now != before {
			// A reload since the files were written: the commands reached
			// the worker it replaced. The new one loaded the files, or
			// loaded them just before they changed: the same commands
			// find out which, and verify, instead of reloading again.
			i.log.Info("a reload replaced HAProxy's worker during the certificate install; installing on the new worker",
				"worker", now, "errors", len(errs))
			errs = i.runtime(ctx, set, old, added, changed, removed, done)
		}
	}
	// Served from now: committed, or (on a runtime failure) in the files
	// the reload below loads.
	i.served(set, slices.Concat(added, changed))
	if i.o.Metrics != nil {
		for _, name := range removed {
			i.o.Metrics.drop(old[name])
		}
	}
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			// Stopping (or the caller gave up): a reload now would start a
			// worker for nothing, and the files already hold set.
			i.log.Info("certificate install cut short by a stop; no reload", "err", err)
			return err
		}
		i.log.Error("the runtime API failed to install certificates; reloading to load them from the files", "err", err)
		if i.o.Reload != nil {
			i.o.Reload("certificates: the runtime API failed")
		}
		return err
	}
	return nil
}

// runtime sends the changes to the worker, logging each one done (once,
// by done) and returning what failed.
func (i *Installer) runtime(ctx context.Context, set Set, old map[string]*Entry, added, changed, removed []string, done map[string]bool) []error {
	var errs []error
	for _, name := range removed {
		if err := i.remove(ctx, name); err != nil {
			errs = append(errs, err)
			continue
		}
		if !done[name] {
			done[name] = true
			i.log.Info("certificate removed over the runtime API, no reload", "name", name, "file", old[name].File)
		}
	}
	for _, name := range slices.Concat(added, changed) {
		e := set.Certs[name]
		_, replace := old[name]
		if err := i.put(ctx, name, e, replace); err != nil {
			errs = append(errs, err)
			continue
		}
		if done[name] {
			continue
		}
		done[name] = true
		what := "added"
		if replace {
			what = "replaced"
		}
		i.log.Info("certificate "+what+" over the runtime API, no reload", "name", name, "file", e.File,
			"names", strings.Join(e.Names, ","), "serial", e.Serial.Text(16), "not_after", e.NotAfter.UTC().Format(time.RFC3339))
		i.warnExpiry(e)
	}
	return errs
}

func (i *Installer) warnExpiry(e *Entry) {
	if i.o.Metrics != nil {
		i.o.Metrics.set(e)
	}
	if now := i.o.Now(); e.Expiring(now) {
		i.log.Warn("certificate expires soon", "name", e.Name, "file", e.File,
			"not_after", e.NotAfter.UTC().Format(time.RFC3339), "in", e.NotAfter.Sub(now).Round(time.Minute).String())
	}
}

// WriteError is an Install that could not write the files: nothing
// changed, in HAProxy or on disk.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "writing the certificate files: " + e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// Run installs every set it receives until ctx ends. A set whose files
// could not be written (a full disk) is tried again, with backoff up to
// retryMax, until it is written or a newer set arrives.
func (i *Installer) Run(ctx context.Context, in <-chan Set) {
	var (
		retry   *Set
		backoff time.Duration
		timer   = time.NewTimer(time.Hour)
	)
	timer.Stop()
	defer timer.Stop()
	for {
		var set Set
		select {
		case <-ctx.Done():
			return
		case set = <-in:
			backoff = 0
		case <-timer.C:
			set = *retry
		}
		retry = nil
		var we *WriteError
		if err := i.Install(ctx, set); errors.As(err, &we) {
			backoff = min(max(2*backoff, retryMin), retryMax)
			retry = &set
			timer.Reset(backoff)
		} else {
			timer.Stop()
		}
	}
}

// The backoff of Run's retries.
var (
	retryMin = time.Second
	retryMax = time.Minute
)
