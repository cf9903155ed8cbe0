package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
)

// retryAfter spaces attempts at a rendering whose reload could not be
// confirmed (as opposed to refused).
const retryAfter = 5 * time.Second

// Writes that fail (disk full, read-only, I/O) are retried after a delay
// that doubles from writeRetryMin to writeRetryMax.
const (
	writeRetryMin = time.Second
	writeRetryMax = 30 * time.Second
)

// updateRuntime changes the slots over the runtime API. It reports false
// when that failed and a reload must apply the rendering instead.
func (a *Applier) updateRuntime(ctx context.Context, at attempt) bool {
	err := a.runtime(ctx, at)
	switch {
	case err == nil:
		a.took(at, metrics.Runtime)
		return true
	case ctx.Err() != nil:
		return true // stopping
	}
	a.opts.Metrics.RuntimeUpdates.WithLabelValues(metrics.Failure).Inc()
	a.log.Warn("runtime update failed; reloading instead", "why", at.why, "change", at.change, "err", err)
	a.diverged = a.diverged || !errors.Is(err, haproxy.ErrNotApplied)
	return false
}

// runtime changes the slots over the runtime API, checks that HAProxy
// runs them, and writes the file, so that a later reload changes nothing.
// The file is written while HAProxy takes the commands, and takes its
// name once HAProxy runs them: the file on disk is still what runs, and
// the change reaches it sooner (at 10,000 × 10 the 7.5 MB file took some
// 28 ms to write and sync, the commands 14). Its directory is synced
// later, with the snapshots (save): a crash until then may bring the
// previous file back, whole, and the syncs were a large part of
// seamless's CPU per change at 100 × 10, where syscalls cost most.
func (a *Applier) runtime(ctx context.Context, at attempt) error {
	rend := at.rend
	var cmds []string
	var run func() error
	if at.moves != nil {
		cmds = moveCommands(at.moves)
		run = func() error { return moveServers(ctx, a.opts.Runtime, cmds, at.moves) }
	} else {
		var err error
		if cmds, err = slotCommands(a.runRend.Servers, rend.Servers, !rend.NoHealthChecks); err != nil {
			return fmt.Errorf("%w: %w", haproxy.ErrNotApplied, err)
		}
		run = func() error {
			touched := touchedSlots(cmds)
			want, states, err := applyAndRead(ctx, a.opts.Runtime, cmds, rend.Servers, touched)
			if err == nil {
				err = verify(want, states, touched)
			}
			return err
		}
	}
	file := stageFile(a.opts.Path, rend.Config, 0o640)
	if err := run(); err != nil {
		file.discard()
		if at.moves == nil && !errors.Is(err, haproxy.ErrNotApplied) {
			if a.untrusted == nil {
				a.untrusted = map[string]bool{}
			}
			maps.Copy(a.untrusted, touchedSlots(cmds))
		}
		return err
	}
	if err := file.commit(); err != nil {
		return fmt.Errorf("HAProxy runs the change, but the file could not follow: %w", err)
	}
	a.running, a.runRend = rend.Config, &rend
	a.unsynced.Store(true)
	a.log.Debug("runtime commands", "commands", strings.Join(cmds, "; "))
	return nil
}

// addressSettles bounds how long moved servers may take to show their new
// address in `show servers state`, the commands included, before the
// change counts as not taken.
const addressSettles = time.Second

// moveServers sends the commands of moves and polls until HAProxy shows
// them. 3.x applies a new address after the command's connection: `show
// servers state` on the same connection to the worker's socket still
// shows the old one.
func moveServers(ctx context.Context, rt Runtime, cmds []string, moves []serverMove) error {
	ctx, cancel := context.WithTimeout(ctx, addressSettles)
	defer cancel()
	if err := rt.Apply(ctx, cmds); err != nil {
		return err
	}
	backends := map[string]bool{}
	for _, m := range moves {
		backends[m.backend] = true
	}
	names := slices.Sorted(maps.Keys(backends))
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		states, err := readBackends(ctx, rt, names)
		if err == nil {
			if err = verifyMoves(moves, states); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// reloadWith writes and validates the rendering, reloads HAProxy, and
// puts the previous file back when HAProxy does not take it.
func (a *Applier) reloadWith(ctx context.Context, at attempt) {
	if ctx.Err() != nil {
		return // stopping: no server state to save, no candidate to check
	}
	a.saveServerState(ctx, at.rend)
	previous, prevTaken := a.running, a.taken
	if !bytes.Equal(at.rend.Config, a.running) {
		check := validated
		if a.taken && serversOnly(a.running, at.rend.Config) {
			check = vouched
			a.log.Debug("not checked with haproxy -c: it differs from the running configuration only in servers moved, added or removed", "why", at.why)
		}
		if err := a.write(ctx, at.rend.Config, at.rend.Files, check); err != nil {
			if ctx.Err() == nil { // stopping cut the check short: no fault of the file
				a.writeFailed(at, err)
			}
			return
		}
	}
	o, err := a.opts.Reload(ctx, "discovery: "+at.why)
	if err != nil || !o.OK {
		// HAProxy runs the previous file: put it back, so that the file
		// on disk stays what runs (also when stopping).
		if !bytes.Equal(previous, at.rend.Config) && previous != nil {
			if err := WriteFile(a.opts.Path, previous, 0o640); err != nil {
				a.log.Error("cannot restore the configuration HAProxy runs", "path", a.opts.Path, "err", err)
			} else {
				a.running, a.taken = previous, prevTaken
			}
		}
	}
	switch {
	case err != nil:
		return // stopping
	case o.OK:
		a.diverged, a.untrusted = false, nil
		a.took(at, metrics.Reloaded)
		return
	}
	var ce *haproxy.ConfigError
	refused := errors.Is(o.Err, reload.ErrRefused) || errors.As(o.Err, &ce) && !transient(o.Err)
	switch {
	case refused && a.diverged && bytes.Equal(at.rend.Config, previous):
		// The old workers run these very bytes, so the refusal is not
		// theirs (a port taken meanwhile?); while HAProxy is out of step
		// with them, try again, backing off.
		a.backoff = min(max(a.backoff*2, writeRetryMin), writeRetryMax)
		a.recheck, a.why = time.Now().Add(a.backoff), "retrying the reload of the running configuration"
	case refused:
		// The same bytes would fail again: wait for different ones.
		a.refused = at.digest()
	default:
		// Not confirmed in time, or haproxy -c could not run: try the
		// same rendering again later. HAProxy may yet load one it was
		// sent, while the file is back to the old.
		if errors.Is(o.Err, haproxy.ErrUnconfirmed) {
			a.diverged = true
		}
		a.recheck, a.why = time.Now().Add(retryAfter), "retrying the reload"
	}
	a.record(metrics.Failed, at.why, at.change, at.start, o.Err)
	a.log.Error("HAProxy did not take the new configuration; the file is back to what runs",
		"why", at.why, "change", at.change, "err", o.Err)
}

// writeFailed: the candidate could not be written or validated. A
// refusal waits for different bytes; anything else is retried.
func (a *Applier) writeFailed(at attempt, err error) {
	if transient(err) {
		a.retryLater(at.why, at.change, at.start, err)
		return
	}
	a.refused = at.digest()
	a.record(metrics.Refused, at.why, at.change, at.start, err)
	a.opts.Metrics.ConfigErrors.Inc()
	a.log.Error("new configuration refused; the running one keeps serving",
		"why", at.why, "change", at.change, "err", err)
}

// saveServerState keeps the servers' runtime state for the next worker.
func (a *Applier) saveServerState(ctx context.Context, next model.Rendering) {
	if a.opts.StateFile == "" || a.opts.Runtime == nil {
		return
	}
	state := "1\n"
	var prev []model.ServerSlot
	if a.runRend != nil {
		prev = a.runRend.Servers.Flat()
	}
	if raw, _, err := a.opts.Runtime.ServersState(ctx); err == nil {
		state = keepState(raw, prev, next.Servers.Flat(), a.untrusted)
	} else {
		a.log.Warn("cannot save the servers' runtime state; the new worker starts from the file", "err", err)
	}
	if err := WriteFile(a.opts.StateFile, []byte(state), 0o640); err != nil {
		a.log.Warn("cannot write the server-state file", "path", a.opts.StateFile, "err", err)
	}
}

// WriteError is a configuration that could not be written (disk full,
// read-only file system, I/O or permission error): a fault of the disk,
// not of the configuration, so it is retried.
type WriteError struct {
	Path string
	Err  error
}

func (e *WriteError) Error() string { return fmt.Sprintf("cannot write %s: %v", e.Path, e.Err) }
func (e *WriteError) Unwrap() error { return e.Err }

// transient: err says nothing against the configuration, so the same
// bytes may pass later. Only a *haproxy.ConfigError is a refusal, and not
// one for a taken port (another process may free it); a disk that fails,
// or a haproxy -c that cannot run at all (no fork, no file descriptor, a
// timeout), is retried.
func transient(err error) bool {
	var ce *haproxy.ConfigError
	var be *haproxy.BindError
	return !errors.As(err, &ce) || errors.As(err, &be)
}

// retryLater schedules another attempt at a rendering that could not be
// written or validated for a transient reason, backing off.
func (a *Applier) retryLater(why, change string, start time.Time, err error) {
	a.backoff = min(max(a.backoff*2, writeRetryMin), writeRetryMax)
	if next := time.Now().Add(a.backoff); a.recheck.IsZero() || next.Before(a.recheck) {
		a.recheck, a.why = next, "retrying the new configuration"
	}
	a.record(metrics.Failed, why, change, start, err)
	msg := "cannot validate the new configuration now; the running one keeps serving, retrying"
	var we *WriteError
	var be *haproxy.BindError
	switch {
	case errors.As(err, &we):
		a.opts.Metrics.ConfigWriteErrors.Inc()
		msg = "cannot write the new configuration; the running one keeps serving, retrying"
	case errors.As(err, &be):
		msg = "a listening address of the new configuration is taken; the running one keeps serving, retrying until it is free"
	}
	a.log.Error(msg, "why", why, "change", change, "retry_in", a.backoff, "err", err)
}

// checking is how write makes sure of a candidate.
type checking int

const (
	validated checking = iota // Validate
	unchecked                 // not at all: HAProxy's start parses it
	vouched                   // not at all, and Vouch: only servers moved, added or removed (serversOnly)
)

// write writes the files data names, then validates data as a candidate
// beside Path (as check says) and renames it into place; Path is
// untouched when validation fails. Failures of the disk are *WriteError.
func (a *Applier) write(ctx context.Context, data []byte, files []model.File, check checking) error {
	if err := writeFiles(files); err != nil {
		return err
	}
	if check == vouched {
		return a.writeVouched(data)
	}
	// The candidate's own name need not outlive a crash: its directory
	// is synced once it is renamed into place.
	cand := a.opts.Path + ".new"
	if err := stageFile(cand, data, 0o640).commit(); err != nil {
		return &WriteError{Path: cand, Err: err}
	}
	if check == validated {
		if err := a.opts.Validate(ctx, cand); err != nil {
			return err
		}
	}
	if err := os.Rename(cand, a.opts.Path); err != nil {
		return &WriteError{Path: a.opts.Path, Err: err}
	}
	a.running, a.taken, a.backoff = data, false, 0
	if err := syncDir(filepath.Dir(a.opts.Path)); err != nil {
		// The file has its name: it is what the reload loads, or the
		// file on disk would not be what runs. The next save syncs
		// the directory again.
		a.unsynced.Store(true)
		a.log.Warn("cannot sync the configuration's directory; trying again at the next save",
			"path", a.opts.Path, "err", err)
	}
	return nil
}

// writeVouched puts data in place at once: nothing refuses it before the
// reload (serversOnly), so it needs no candidate's name, and the
// directory is synced later, with the snapshots (save), as after a
// runtime change. Two renames and two syncs of the directory were a
// tenth of seamless's CPU per change with a template at 100 × 10.
func (a *Applier) writeVouched(data []byte) error {
	f := stageFile(a.opts.Path, data, 0o640)
	if err := f.commit(); err != nil {
		return &WriteError{Path: a.opts.Path, Err: err}
	}
	a.unsynced.Store(true)
	if a.opts.Vouch != nil {
		if err := a.opts.Vouch(a.opts.Path, data); err != nil {
			// The reload's own check, if any, runs in full.
			a.log.Debug("cannot vouch for the configuration", "path", a.opts.Path, "err", err)
		}
	}
	a.running, a.taken, a.backoff = data, false, 0
	return nil
}

// writeFiles writes and syncs each file whose content differs from what
// its path holds: a file's name holds a digest of its content, so most
// are there already. Failures are *WriteError, retried like the
// configuration's.
func writeFiles(files []model.File) error {
	for _, f := range files {
		if old, err := os.ReadFile(f.Path); err == nil && bytes.Equal(old, f.Data) {
			continue
		}
		if err := WriteFile(f.Path, f.Data, 0o640); err != nil {
			return &WriteError{Path: f.Path, Err: err}
		}
	}
	return nil
}
