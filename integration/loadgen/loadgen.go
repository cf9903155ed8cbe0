// Package loadgen is a bounded HTTP/1.1 load generator for tests and the
// reload benchmark.
//
// The client is written by hand on net.Conn instead of using net/http.Client:
// the standard Transport silently retries idempotent requests that fail on a
// reused connection, which would hide exactly the failures a lossless reload
// has to avoid. Here every attempt is counted once and never retried.
package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Mode selects how clients use connections.
type Mode int

const (
	// NewConn opens one TCP connection per request (Connection: close).
	NewConn Mode = iota
	// KeepAlive reuses persistent HTTP/1.1 connections and never retries a
	// failed request.
	KeepAlive
)

// String returns the name used in tables and flags.
func (m Mode) String() string {
	switch m {
	case NewConn:
		return "newconn"
	case KeepAlive:
		return "keepalive"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config bounds and shapes a run. Start validates it.
type Config struct {
	Target      string        // host:port; the host must be a loopback IP literal
	Mode        Mode          // NewConn or KeepAlive
	Workers     int           // concurrent clients, default 1
	Path        string        // request path, default "/"
	MaxRequests int64         // hard bound on total requests, required > 0
	MaxDuration time.Duration // hard bound on run time, required > 0
	Timeout     time.Duration // per-request timeout, default 5s
	// TLS, when set, makes every connection HTTPS with this client
	// configuration (its ServerName is also the Host header); a failed
	// handshake is a failure of class "handshake: ...".
	TLS *tls.Config
}

// Result holds the totals of a run.
type Result struct {
	Requests int64            // completed attempts (ok + failed)
	Failed   int64            // attempts that got no response or a status >= 500
	Errors   map[string]int64 // failure class -> count
	Elapsed  time.Duration    // run time so far, or until the workers finished
	LastBody string           // trimmed body of the newest successful response
	// FirstFailure and LastFailure are when the first and the latest
	// failed attempts ended, zero without one: they place a loss on the
	// timeline of what the test did.
	FirstFailure, LastFailure time.Time
}

// Load is a running load. Its methods are safe for concurrent use.
type Load struct {
	cfg    Config
	start  time.Time
	cancel context.CancelFunc
	issued atomic.Int64 // request slots handed out, bounded by MaxRequests
	stats  []*workerStats
	done   chan struct{}

	mu       sync.Mutex
	finished time.Time // zero until every worker returned
}

// Start validates cfg and starts the workers. The run ends when MaxRequests
// attempts were made, MaxDuration passed, ctx ended, or Stop was called.
func Start(ctx context.Context, cfg Config) (*Load, error) {
	cfg, err := validate(cfg)
	if err != nil {
		return nil, err
	}
	// The deadline derives from start, so Elapsed of a run cut by
	// MaxDuration is never below it, however late this goroutine runs.
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, start.Add(cfg.MaxDuration))
	l := &Load{
		cfg:    cfg,
		start:  start,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	var wg sync.WaitGroup
	for range cfg.Workers {
		st := &workerStats{errors: map[string]int64{}}
		l.stats = append(l.stats, st)
		wg.Go(func() { l.work(ctx, st) })
	}
	go func() {
		wg.Wait()
		l.mu.Lock()
		l.finished = time.Now()
		l.mu.Unlock()
		cancel()
		close(l.done)
	}()
	return l, nil
}

func validate(cfg Config) (Config, error) {
	host, _, err := net.SplitHostPort(cfg.Target)
	if err != nil {
		return cfg, fmt.Errorf("loadgen: target %q: %w", cfg.Target, err)
	}
	// Only IP literals: a name could resolve anywhere, and this tool must
	// never send load off the machine.
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return cfg, fmt.Errorf("loadgen: target %q is not a loopback IP address", cfg.Target)
	}
	if cfg.Mode != NewConn && cfg.Mode != KeepAlive {
		return cfg, fmt.Errorf("loadgen: unknown mode %d", cfg.Mode)
	}
	if cfg.MaxRequests <= 0 {
		return cfg, errors.New("loadgen: MaxRequests must be > 0")
	}
	if cfg.MaxDuration <= 0 {
		return cfg, errors.New("loadgen: MaxDuration must be > 0")
	}
	if cfg.Workers < 0 || cfg.Timeout < 0 {
		return cfg, errors.New("loadgen: Workers and Timeout must not be negative")
	}
	if cfg.Workers == 0 {
		cfg.Workers = 1
	}
	if cfg.Path == "" {
		cfg.Path = "/"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	return cfg, nil
}

// Done is closed when the run has ended and every worker has returned:
// because a bound was reached, the context ended, or Stop was called.
func (l *Load) Done() <-chan struct{} { return l.done }

// Stop ends the run, waits for the workers and returns the totals. A request
// cut short by Stop is not counted. Stop may be called more than once.
func (l *Load) Stop() Result {
	l.cancel()
	<-l.done
	return l.Snapshot()
}

// Snapshot returns the totals so far without stopping the run.
func (l *Load) Snapshot() Result {
	r := Result{Errors: map[string]int64{}}
	var lastAt time.Time
	for _, st := range l.stats {
		st.mu.Lock()
		r.Requests += st.requests
		r.Failed += st.failed
		for k, v := range st.errors {
			r.Errors[k] += v
		}
		if st.lastAt.After(lastAt) {
			lastAt, r.LastBody = st.lastAt, st.lastBody
		}
		if !st.firstFail.IsZero() && (r.FirstFailure.IsZero() || st.firstFail.Before(r.FirstFailure)) {
			r.FirstFailure = st.firstFail
		}
		if st.lastFail.After(r.LastFailure) {
			r.LastFailure = st.lastFail
		}
		st.mu.Unlock()
	}
	l.mu.Lock()
	end := l.finished
	l.mu.Unlock()
	if end.IsZero() {
		end = time.Now()
	}
	r.Elapsed = end.Sub(l.start)
	return r
}

// workerStats is owned by one worker; Snapshot reads it under mu. Per-worker
// counters keep the hot path free of a lock shared by every worker.
type workerStats struct {
	mu       sync.Mutex
	requests int64
	failed   int64
	errors   map[string]int64
	lastBody string
	lastAt   time.Time

	firstFail, lastFail time.Time
}

func (st *workerStats) record(class, body string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.requests++
	if class != "" {
		st.failed++
		st.errors[class]++
		st.lastFail = time.Now()
		if st.firstFail.IsZero() {
			st.firstFail = st.lastFail
		}
		return
	}
	st.lastBody = body
	st.lastAt = time.Now()
}

func (l *Load) work(ctx context.Context, st *workerStats) {
	c := newClient(l.cfg)
	defer c.close()
	for ctx.Err() == nil {
		if l.issued.Add(1) > l.cfg.MaxRequests {
			return
		}
		body, class := c.do(ctx)
		if class != "" && ctx.Err() != nil {
			// The run ended while this request was in flight: it was
			// abandoned by us, not failed by the server.
			return
		}
		st.record(class, body)
		if class != "" {
			// A real client does not spin on a refused connection; without
			// a pause an outage would be counted in thousands of instant
			// failures per worker and swamp the figures.
			select {
			case <-ctx.Done():
			case <-time.After(failurePause):
			}
		}
	}
}

const failurePause = 10 * time.Millisecond
