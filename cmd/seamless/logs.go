package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// haproxyLines turns HAProxy's output, one line per Write (as LogTap
// writes it), into log records, so that with SEAMLESS_LOG_FORMAT=json the
// whole stream is JSON for a log pipeline. HAProxy's own severity becomes
// the record's level.
//
// It, dedupe and summer take a line as a string too (io.StringWriter,
// which LogTap writes through), so that the string LogTap read is the
// one every step keeps: a []byte between them was a copy of every line
// at every step, and an old worker prints a line per proxy as it stops.
type haproxyLines struct{ log *slog.Logger }

func (h haproxyLines) Write(p []byte) (int, error) { return h.WriteString(string(p)) }

func (h haproxyLines) WriteString(s string) (int, error) {
	line := strings.TrimRight(s, "\r\n")
	level := slog.LevelInfo
	switch {
	case strings.HasPrefix(line, "[ALERT]"):
		level = slog.LevelError
	case strings.HasPrefix(line, "[WARNING]"):
		level = slog.LevelWarn
	}
	// A record of its own: Logger.Log would look up its caller's frame
	// for every line, and an old worker stopping prints one per proxy.
	ctx := context.Background()
	if hd := h.log.Handler(); hd.Enabled(ctx, level) {
		r := slog.NewRecord(time.Now(), level, line, 0)
		r.AddAttrs(slog.String("component", "haproxy"))
		_ = hd.Handle(ctx, r)
	}
	return len(s), nil
}

// onceEach passes HAProxy's output on, less the log target's copy of a
// message HAProxy also printed itself: with `log stderr` in the
// configuration every warning reaches seamless twice, once as
// "[WARNING]  (pid) : message" and once as a log line ending in message.
// Identical lines are never dropped: two equal traffic lines are two
// requests.
func onceEach(w io.Writer) io.Writer { return &dedupe{w: w} }

type dedupe struct {
	w      io.Writer
	mu     sync.Mutex
	recent [8]string // the last lines passed on, newest at recent[n%8]
	n      int
}

// minEcho keeps short messages from matching by accident.
const minEcho = 12

func (d *dedupe) Write(p []byte) (int, error) { return d.WriteString(string(p)) }

func (d *dedupe) WriteString(s string) (int, error) {
	line := strings.TrimRight(s, "\r\n")
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.recent {
		if r != "" && r != line && (echoes(r, line) || echoes(line, r)) {
			return len(s), nil
		}
	}
	d.recent[d.n%len(d.recent)] = line
	d.n++
	return io.WriteString(d.w, s)
}

// Flush flushes the writer it passes lines to, if that holds any back.
func (d *dedupe) Flush() error {
	if f, ok := d.w.(haproxy.Flusher); ok {
		return f.Flush()
	}
	return nil
}

// echoes: prefixed is "[LEVEL]  (pid) : message" and other ends with
// message.
func echoes(prefixed, other string) bool {
	// The cheap tests first: most pairs are two of HAProxy's own lines.
	if !strings.HasPrefix(prefixed, "[") || strings.HasPrefix(other, "[") {
		return false
	}
	_, msg, ok := strings.Cut(prefixed, ") : ")
	return ok && len(msg) >= minEcho && strings.HasSuffix(other, msg)
}

// stopsSummed passes HAProxy's output on, but of the "Proxy X stopped
// (cumulated conns: FE: a, BE: b)." warnings a worker prints for each of
// its proxies as it stops (the old worker, after every reload: a
// thousand lines at a thousand services) only the first keptStops; the
// rest become one line with their number and their connections summed,
// printed once the worker says something else, the master says it
// exited, stopsQuiet passed after the last stop of any worker, or
// HAProxy's output ended (Flush). Other processes' lines (the master's,
// while the old worker stops) pass on meanwhile.
func stopsSummed(w io.Writer) io.Writer { return newSummer(w, stopsQuiet) }

func newSummer(w io.Writer, quiet time.Duration) *summer {
	return &summer{w: w, quiet: quiet, runs: map[string]*stopRun{}}
}

const (
	keptStops  = 3
	stopsQuiet = 100 * time.Millisecond
)

type summer struct {
	w     io.Writer
	quiet time.Duration
	mu    sync.Mutex
	runs  map[string]*stopRun // by worker pid
	order []string            // the runs' pids, earliest first
	timer *time.Timer
}

// stopRun is what a worker stopped so far.
type stopRun struct {
	n      int
	fe, be int64 // connections of the stops past the first keptStops
}

func (s *summer) Write(p []byte) (int, error) { return s.WriteString(string(p)) }

func (s *summer) WriteString(text string) (int, error) {
	line := strings.TrimRight(text, "\r\n")
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, fe, be, ok := proxyStopped(line)
	if !ok {
		// The worker says something else, or the master says it exited:
		// its run has ended.
		var ferr error
		for _, pid := range []string{linePid(line), exitedWorker(line)} {
			if pid != "" && s.runs[pid] != nil {
				ferr = cmp.Or(ferr, s.flushLocked(pid))
			}
		}
		n, err := io.WriteString(s.w, text)
		return n, cmp.Or(err, ferr)
	}
	r := s.runs[pid]
	if r == nil {
		r = &stopRun{}
		s.runs[pid], s.order = r, append(s.order, pid)
	}
	r.n++
	if s.timer == nil {
		s.timer = time.AfterFunc(s.quiet, func() { _ = s.Flush() })
	} else {
		s.timer.Reset(s.quiet)
	}
	if r.n <= keptStops {
		return io.WriteString(s.w, text)
	}
	r.fe += fe
	r.be += be
	return len(text), nil
}

// Flush prints every run held back: HAProxy's output ended.
func (s *summer) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.order) > 0 {
		if err := s.flushLocked(s.order[0]); err != nil {
			return err
		}
	}
	return nil
}

// flushLocked ends pid's run, printing what it held back.
func (s *summer) flushLocked(pid string) error {
	r := s.runs[pid]
	delete(s.runs, pid)
	if i := slices.Index(s.order, pid); i >= 0 {
		s.order = slices.Delete(s.order, i, i+1)
	}
	if r == nil || r.n <= keptStops {
		return nil
	}
	_, err := fmt.Fprintf(s.w, "[WARNING]  (%s) : %d more proxies stopped (cumulated conns: FE: %d, BE: %d).\n",
		pid, r.n-keptStops, r.fe, r.be)
	return err
}

// exitedWorker is N of the master's "… worker (N) exited …"; "" for
// other lines.
func exitedWorker(line string) string { return pidBetween(line, " worker (", ") exited") }

// linePid is the pid of "[LEVEL]  (pid) : message"; "" for other lines.
func linePid(line string) string {
	if !strings.HasPrefix(line, "[") {
		return ""
	}
	return pidBetween(line, "(", ") : ")
}

// pidBetween is the number between the first open in line and the close
// after it; "" when there is none.
func pidBetween(line, open, close string) string {
	_, rest, ok := strings.Cut(line, open)
	if !ok {
		return ""
	}
	pid, _, ok := strings.Cut(rest, close)
	if !ok || pid == "" || strings.Trim(pid, "0123456789") != "" {
		return ""
	}
	return pid
}

// proxyStopped reads "[WARNING]  (pid) : Proxy name stopped (cumulated
// conns: FE: fe, BE: be).", as HAProxy 2.6 to 3.2 print it.
func proxyStopped(line string) (pid string, fe, be int64, ok bool) {
	if !strings.HasPrefix(line, "[WARNING]") {
		return "", 0, 0, false
	}
	pid = linePid(line)
	_, rest, found := strings.Cut(line, ") : Proxy ")
	if pid == "" || !found {
		return "", 0, 0, false
	}
	name, rest, found := strings.Cut(rest, " stopped (cumulated conns: FE: ")
	if !found || name == "" || strings.ContainsAny(name, " \t") {
		return "", 0, 0, false
	}
	feS, rest, found := strings.Cut(rest, ", BE: ")
	if !found {
		return "", 0, 0, false
	}
	beS, found := strings.CutSuffix(rest, ").")
	if !found {
		return "", 0, 0, false
	}
	var err1, err2 error
	fe, err1 = strconv.ParseInt(feS, 10, 64)
	be, err2 = strconv.ParseInt(beS, 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, 0, false
	}
	return pid, fe, be, true
}
