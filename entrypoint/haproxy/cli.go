package haproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MasterCLI talks to HAProxy's master CLI (-S), one command per connection.
type MasterCLI struct {
	Network, Addr string

	mu sync.Mutex
	// reexec is how long the last reload took from the master taking it
	// to its outcome in `show proc`: on 2.6 the time the master takes to
	// re-execute, which the next reload's polling need not spend polling.
	reexec time.Duration
	// answers: the master answered the last reload with its outcome
	// (2.7+), so the next one needs no `show proc` before it.
	answers bool
	// last is `show proc` as the last reload's outcome was read from it,
	// when that reload was confirmed (2.6): the next reload's counters
	// before it, since only reloads move them.
	last    Procs
	hasLast bool
}

// NewMasterCLI takes a -S argument.
func NewMasterCLI(s string) *MasterCLI {
	n, a := MasterAddr(s)
	return &MasterCLI{Network: n, Addr: a}
}

// Do sends one command and returns the whole answer. The master only answers
// once the client has shut its write side, so that is done after the
// command.
func (m *MasterCLI) Do(ctx context.Context, cmd string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, m.Network, m.Addr)
	if err != nil {
		return "", fmt.Errorf("master CLI %s: %w", m.Addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := io.WriteString(conn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("master CLI %q: %w", cmd, err)
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The connection's deadline is ctx's, and may pass before
			// ctx's own timer fires.
			err = context.DeadlineExceeded
		}
		return string(b), fmt.Errorf("master CLI %q: %w", cmd, err)
	}
	return string(b), nil
}

// ShowProc runs `show proc` once.
func (m *MasterCLI) ShowProc(ctx context.Context) (Procs, error) {
	out, err := m.Do(ctx, "show proc")
	if err != nil {
		return Procs{}, err
	}
	return ParseShowProc(out)
}

// WaitShowProc polls `show proc` until ok accepts an answer or ctx ends.
// While the master re-executes, connections are refused, reset or left
// unanswered, so errors are retried rather than returned. A refused
// connect costs microseconds, and the polls start 1 ms apart, so the
// confirmation comes within a few milliseconds of the master coming back.
func (m *MasterCLI) WaitShowProc(ctx context.Context, ok func(Procs) bool) (Procs, error) {
	p, _, err := m.waitShowProc(ctx, 0, time.Millisecond, ok)
	return p, err
}

// maxPollDelay bounds the growing time between polls. A 2.6 master
// re-executing a configuration of 100 backends took some 115 ms to
// answer again here, and polls 2 ms apart from its learned quiet time on
// were a fifth of seamless's CPU per change with a template at 100 × 10;
// an answer is now found at most 8 ms late.
const maxPollDelay = 8 * time.Millisecond

// waitShowProc is WaitShowProc after quiet, a time when ok cannot yet hold
// (cut to half of what is left before ctx's deadline, so that an answer
// is asked for before it), with delay between its first two polls. It
// returns how many polls it took.
func (m *MasterCLI) waitShowProc(ctx context.Context, quiet, delay time.Duration, ok func(Procs) bool) (_ Procs, polls int, _ error) {
	if dl, has := ctx.Deadline(); has {
		quiet = min(quiet, time.Until(dl)/2)
	}
	if quiet > 0 {
		select {
		case <-ctx.Done():
			return Procs{}, 0, ctx.Err()
		case <-time.After(quiet):
		}
	}
	var last error
	for attempts := 1; ; attempts++ {
		attempt, cancel := context.WithTimeout(ctx, time.Second)
		p, err := m.ShowProc(attempt)
		cancel()
		if err == nil && ok(p) {
			return p, attempts, nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return p, attempts, fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return p, attempts, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, maxPollDelay)
	}
}

// WaitWorkerReady polls until a worker answers through the master, and
// returns `show proc` from then. 3.1+ lists a worker as soon as it is
// forked, while it still loads its configuration: it serves nothing yet,
// and a signal sent to the master then is lost. A worker that answers
// "show version" has finished loading.
func (m *MasterCLI) WaitWorkerReady(ctx context.Context) (Procs, error) {
	for {
		p, err := m.WaitShowProc(ctx, Procs.HasWorkers)
		if err != nil {
			return p, err
		}
		w := append(append([]Proc{}, p.Workers...), p.Old...)[0]
		attempt, cancel := context.WithTimeout(ctx, time.Second)
		out, err := m.Do(attempt, fmt.Sprintf("@!%d show version", w.Pid))
		cancel()
		if v := strings.TrimSpace(out); err == nil && v != "" && v[0] >= '0' && v[0] <= '9' {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// ReloadResult is a confirmed outcome of a reload.
type ReloadResult struct {
	OK bool
	// Messages are HAProxy's start-up messages when the master returned
	// them (2.7+).
	Messages string
	// Procs is `show proc` after the reload.
	Procs Procs
	// NewWorkers are the pids of workers that did not exist before.
	NewWorkers []int
	// Polls is how many `show proc` it took to find the outcome after
	// the reload was sent.
	Polls int
}

// ErrUnconfirmed means the reload was sent but its outcome could not be
// established before the deadline.
var ErrUnconfirmed = errors.New("reload not confirmed")

// ErrNotSent means the master never took the reload: it did not answer, or
// stayed busy with an earlier one until the deadline. Nothing changed, so
// the request still stands.
var ErrNotSent = errors.New("reload not sent")

// Reload asks the master to reload and waits for the outcome. HAProxy 2.7+
// answers "Success=1|0" followed by the start-up messages; 2.6 closes the
// connection without a word while it re-executes, so the outcome is read
// from `show proc`: the master's reload counter moves, then either its
// failed counter moved too or a new worker exists. A master that answered
// the last reload is not asked `show proc` before this one: its answer
// says the outcome, and the current workers after it are the new ones.
// Nor is a 2.6 master whose last reload's outcome this read: the `show
// proc` that confirmed it holds the counters from before this one. That
// was one of some six connections per reload, each costing seamless about
// 0.2 ms of CPU here. Reloads are sent one at a time (the reloader's);
// Reload is not for concurrent use.
func (m *MasterCLI) Reload(ctx context.Context) (ReloadResult, error) {
	m.mu.Lock()
	answers := m.answers
	before, cached := m.last, m.hasLast
	m.hasLast = false // kept again only once this reload is confirmed
	m.mu.Unlock()
	if !answers && !cached {
		var err error
		if before, err = m.WaitShowProc(ctx, func(Procs) bool { return true }); err != nil {
			return ReloadResult{}, fmt.Errorf("%w: master not answering: %v", ErrNotSent, err)
		}
	}
	answer, err := m.reloadWhenIdle(ctx)
	switch {
	case errors.Is(err, errBusy):
		return ReloadResult{}, fmt.Errorf("%w: %v", ErrNotSent, err)
	case err != nil && !IsConnDrop(err) && answer == "" && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded):
		return ReloadResult{}, fmt.Errorf("%w: %v", ErrNotSent, err)
	case cached && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
		// A 2.6 master ends a reload it read with a plain close. One
		// re-executing for a reload sent by hand drops connections it
		// had not read yet: this reload may never have run, and that
		// one's outcome would pass for its own. Without the `show proc`
		// before, which would have waited for the master, send it again.
		return ReloadResult{}, fmt.Errorf("%w: the master dropped the connection unread (%v)", ErrNotSent, err)
	}
	var res ReloadResult
	explicit := strings.HasPrefix(strings.TrimSpace(answer), "Success=")
	// Also a reload cut short, which the master may still be executing:
	// the next waits for it to answer `show proc` first.
	m.mu.Lock()
	m.answers = explicit
	m.mu.Unlock()
	if answers && !explicit {
		// Without the counters from before, `show proc` cannot tell
		// this reload's outcome from an earlier one's.
		return res, fmt.Errorf("%w: the master did not answer the reload as it answered the last one (%v)", ErrUnconfirmed, err)
	}
	if explicit {
		first, rest, _ := strings.Cut(strings.TrimSpace(answer), "\n")
		res.OK = strings.TrimSpace(first) == "Success=1"
		_, msgs, found := strings.Cut(rest, "--\n")
		if !found {
			msgs = rest
		}
		res.Messages = strings.TrimSpace(msgs)
		if !res.OK {
			// 3.1+ refuses a reload while one runs without re-executing,
			// so the counter would never move: report the refusal now.
			res.Procs, _ = m.ShowProc(ctx)
			return res, nil
		}
	}
	sent := time.Now()
	quiet, first := time.Duration(0), time.Millisecond
	if !explicit { // 2.7+ answered once the reload was done
		m.mu.Lock()
		quiet, first = quietAfterReload(m.reexec), firstPollDelay(m.reexec)
		m.mu.Unlock()
	}
	after, polls, err := m.waitShowProc(ctx, quiet, first, func(p Procs) bool { return p.Master.Reloads > before.Master.Reloads })
	res.Polls = polls
	if err != nil {
		return res, fmt.Errorf("%w: %v", ErrUnconfirmed, err)
	}
	if !explicit && cached && after.Master.Reloads > before.Master.Reloads+1 && after.Master.Failed > 0 {
		// Another reload came between (a USR2 sent to the master by
		// hand), and the counters kept are not from just before this
		// one. 2.6 counts failures since the last success, so none
		// says that this one succeeded; otherwise it is not known.
		return res, fmt.Errorf("%w: the master reloaded %d times, not once, and the last %d failed",
			ErrUnconfirmed, after.Master.Reloads-before.Master.Reloads, after.Master.Failed)
	}
	if !explicit && after.Master.Failed == before.Master.Failed {
		// A failed reload's time is not a good one's (a refused bind
		// took 2 s on 2.6). When the quiet time was long enough, the
		// reload took at most that: halve it, or it would shrink by
		// only an eighth per reload.
		took := time.Since(sent)
		if polls == 1 && quiet > 0 {
			took /= 2
		}
		m.mu.Lock()
		m.reexec = took
		m.mu.Unlock()
	}
	res.Procs = after
	old := before.WorkerPids()
	for _, w := range after.Workers {
		if !old[w.Pid] {
			res.NewWorkers = append(res.NewWorkers, w.Pid)
		}
	}
	if !explicit {
		failed := after.Master.Failed > before.Master.Failed
		res.OK = !failed && len(res.NewWorkers) > 0
		last := after // not sharing res.Procs's lists with the caller
		last.Workers, last.Old = slices.Clone(after.Workers), slices.Clone(after.Old)
		m.mu.Lock()
		m.last, m.hasLast = last, true
		m.mu.Unlock()
	}
	return res, nil
}

// quietAfterReload is how long a reload's outcome is not polled for, after
// the last one took reexec to show: seven eighths of it, at most a
// second. Polling every 2 ms while a 2.6 master re-executed was a quarter
// of seamless's CPU per change with a template at 100 services × 10
// instances, and a configuration's good reloads take about as long as
// each other (112–138 ms there). On 2.7+ the master answers once the
// reload is done, and nothing is waited.
func quietAfterReload(reexec time.Duration) time.Duration {
	return min(reexec*7/8, time.Second)
}

// firstPollDelay is the time between the first two polls after the quiet
// time: a sixteenth of the last reload's, from 1 ms to maxPollDelay. Polls
// 1, 2 and 4 ms apart after a quiet time of 100 ms found a reload's
// outcome in about six connections where three do.
func firstPollDelay(reexec time.Duration) time.Duration {
	return min(max(reexec/16, time.Millisecond), maxPollDelay)
}

// busyAnswer is how 3.1+ refuses a reload while another (or the initial
// load) is still in progress: nothing was tried, so ask again.
const busyAnswer = "Another reload is still in progress"

var errBusy = errors.New("master busy with another reload")

// reloadWhenIdle sends "reload", repeating it while the master answers that
// it is busy.
func (m *MasterCLI) reloadWhenIdle(ctx context.Context) (string, error) {
	delay := 5 * time.Millisecond
	for {
		answer, err := m.Do(ctx, "reload")
		if err != nil || !strings.Contains(answer, busyAnswer) {
			return answer, err
		}
		select {
		case <-ctx.Done():
			return answer, fmt.Errorf("%w: %v", errBusy, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// IsConnDrop reports the ways a master that re-executes ends a connection.
func IsConnDrop(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}
