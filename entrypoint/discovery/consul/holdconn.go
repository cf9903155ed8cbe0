package consul

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"
)

// connTransport is an HTTP/1.1 RoundTripper that waits for an answer on
// the caller's goroutine alone. net/http's Transport adds a reader and a
// writer goroutine per connection: with a blocking query held on each of
// a thousand connections, that is 2,000 goroutines and their stacks doing
// nothing but wait. Here a held query costs its caller's goroutine, the
// connection and no buffer until the first byte of the answer arrives.
//
// It keeps up to keep idle connections per agent and dials through the
// api client's dialer (TCP, or the unix socket of a unix:// address).
//
// HTTPS is left to fallback, the client's own transport: Consul's HTTPS
// listener speaks HTTP/2, which carries every held query on one
// connection (a few per 250 queries) where HTTP/1.1 would need one TLS
// connection each, against an agent's default of 200 per client, and
// each would keep TLS's record buffers. Requests through a proxy
// (HTTP_PROXY) go there too.
type connTransport struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	proxied  func(*http.Request) bool
	fallback http.RoundTripper
	keep     int
	idleFor  time.Duration // an idle connection older than this is not reused

	mu   sync.Mutex
	idle map[string][]idleConn // by host:port, newest last
}

type idleConn struct {
	c     *heldConn
	since time.Time
}

// newConnTransport takes its dialer and proxy rule from t, the transport
// the api client built, which serves what connTransport does not.
func newConnTransport(t *http.Transport, keep int) *connTransport {
	ct := &connTransport{dial: t.DialContext, fallback: t, keep: keep,
		idleFor: t.IdleConnTimeout, idle: map[string][]idleConn{}}
	if ct.dial == nil {
		ct.dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if proxy := t.Proxy; proxy != nil {
		ct.proxied = func(r *http.Request) bool { u, err := proxy(r); return u != nil || err != nil }
	}
	return ct
}

// heldConn is a connection with the one byte read while waiting for an
// answer: the read buffer is taken from a pool only once the answer
// arrives, and that byte says the agent had started to answer.
type heldConn struct {
	net.Conn
	first    [1]byte
	hasFirst bool
	parked   atomic.Pointer[parkedConn] // while parked: what its Close wakes
}

// Close closes the connection and resumes a query parked on it.
func (c *heldConn) Close() error {
	if pc := c.parked.Load(); pc != nil {
		pc.wake()
	}
	return c.Conn.Close()
}

func (c *heldConn) Read(p []byte) (int, error) {
	if c.hasFirst && len(p) > 0 {
		p[0], c.hasFirst = c.first[0], false
		return 1, nil
	}
	return c.Conn.Read(p)
}

// waitFirst blocks until the answer's first byte arrives.
func (c *heldConn) waitFirst() error {
	for {
		n, err := c.Conn.Read(c.first[:])
		if n == 1 {
			c.hasFirst = true
			return nil
		}
		if err != nil {
			return err
		}
	}
}

var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, connReadBuffer) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, connWriteBuffer) }}
)

// errNothingRead marks a failure before the agent sent any byte of an
// answer: a request that may be sent twice can be, on a new connection.
type errNothingRead struct{ err error }

func (e *errNothingRead) Error() string { return e.err.Error() }
func (e *errNothingRead) Unwrap() error { return e.err }

func (t *connTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.serves(req) {
		return t.fallback.RoundTrip(req)
	}
	for attempt := 0; ; attempt++ {
		p, err := t.send(req, time.Time{})
		if err == nil {
			p.wait()
			var resp *http.Response
			if resp, err = p.answer(); err == nil {
				return resp, nil
			}
		}
		// As net/http: a connection the agent closed while it was idle
		// fails the next request on it; send that request again once.
		if attempt > 0 || p == nil || !p.replayable(err) {
			closeBody(req)
			return nil, err
		}
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			again := *req // not the caller's: it may not be changed
			again.Body = body
			req = &again
		}
	}
}

// serves reports whether req is connTransport's own (plain HTTP, no
// proxy), not its fallback's.
func (t *connTransport) serves(req *http.Request) bool {
	return req.URL.Scheme == "http" && (t.proxied == nil || !t.proxied(req))
}

// replayable: an idempotent request whose body (if any) can be sent again.
func replayable(r *http.Request) bool {
	idem := r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions
	return idem && (r.Body == nil || r.Body == http.NoBody || r.GetBody != nil)
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}

// hostPort is where r goes: its URL's host and port, 80 when it names
// none (an IPv6 host keeps its brackets only once).
func hostPort(r *http.Request) string {
	return net.JoinHostPort(r.URL.Hostname(), cmp.Or(r.URL.Port(), "80"))
}

// get returns an idle connection to key, or a new one, and tells an
// httptrace in the request's context that it has one (failoverTransport
// tells an agent that is away from one that answered badly that way).
func (t *connTransport) get(ctx context.Context, key string, req *http.Request) (*heldConn, bool, error) {
	c := t.takeIdle(key)
	reused := c != nil
	if c == nil {
		var err error
		if c, err = t.dialConn(ctx, req); err != nil {
			return nil, false, err
		}
	}
	if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: c.Conn, Reused: reused})
	}
	return c, reused, nil
}

func (t *connTransport) takeIdle(key string) *heldConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	for list := t.idle[key]; len(list) > 0; list = t.idle[key] {
		ic := list[len(list)-1]
		list[len(list)-1] = idleConn{}
		t.idle[key] = list[:len(list)-1]
		if t.idleFor > 0 && time.Since(ic.since) > t.idleFor {
			ic.c.Close()
			continue
		}
		return ic.c
	}
	return nil
}

// put keeps c for the next request to key, or closes it when keep are idle.
func (t *connTransport) put(key string, c *heldConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.idle[key]) >= t.keep {
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{}) // a held query's
	t.idle[key] = append(t.idle[key], idleConn{c, time.Now()})
}

// CloseIdleConnections closes the connections that hold no request.
func (t *connTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]idleConn{}
	t.mu.Unlock()
	for _, list := range idle {
		for _, ic := range list {
			ic.c.Close()
		}
	}
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

func (t *connTransport) dialConn(ctx context.Context, req *http.Request) (*heldConn, error) {
	conn, err := t.dial(ctx, "tcp", hostPort(req))
	if err != nil {
		return nil, err
	}
	return &heldConn{Conn: conn}, nil
}

// pending is a request written to the agent whose answer has not begun:
// whoever holds it waits for the answer's first byte (wait) on any
// goroutine, then reads it (answer). A cancelled context closes the
// connection, whether it waits for the head or the body.
type pending struct {
	t      *connTransport
	key    string
	c      *heldConn
	req    *http.Request
	ctx    context.Context
	stop   func() bool
	gz     bool // the request asked for gzip; the caller did not
	reused bool
	err    error // waiting's
}

// send writes req on an idle connection or a new one, which fails once
// deadline (if not zero) passes. Only a failure to connect comes without
// a pending: a failed write comes with one that answers it, so that the
// caller can tell whether to send again.
func (t *connTransport) send(req *http.Request, deadline time.Time) (*pending, error) {
	ctx := req.Context()
	key := hostPort(req)
	dctx := ctx
	if !deadline.IsZero() {
		// A dial ends with the query's deadline too: a replay's dial to
		// an agent that does not answer must not outlive the query by
		// the dialer's own timeout.
		var cancel context.CancelFunc
		dctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	c, reused, err := t.get(dctx, key, req)
	if err != nil {
		return nil, err
	}
	if !deadline.IsZero() {
		_ = c.SetDeadline(deadline) // a closed connection fails the write
	}
	p := &pending{t: t, key: key, c: c, req: req, ctx: ctx, reused: reused,
		stop: context.AfterFunc(ctx, func() { c.Close() })}
	// The copy asking for gzip lives only while it is written: a held
	// query keeps no second request and header.
	out, gz := withGzip(req)
	p.gz = gz
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	err = out.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	if err != nil {
		p.err = &errNothingRead{fmt.Errorf("sending the request: %w", err)}
	}
	return p, nil
}

// wait blocks until the answer's first byte arrives, the connection
// fails or the context ends. Its frames are few: a goroutine that does
// nothing else keeps the smallest stack while a query is held.
func (p *pending) wait() {
	if p.err != nil {
		return
	}
	if err := p.c.waitFirst(); err != nil {
		p.err = &errNothingRead{fmt.Errorf("waiting for the answer: %w", err)}
	}
}

// answer reads the answer's head, once wait returned. The body returned
// gives the connection back to the pool once read to its end and closed.
func (p *pending) answer() (*http.Response, error) {
	if p.err != nil {
		return nil, p.fail(p.err)
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(p.c)
	resp, err := http.ReadResponse(br, p.req)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(br, p.req) // an informational answer precedes the answer
	}
	if err != nil {
		br.Reset(nil)
		readers.Put(br)
		return nil, p.fail(fmt.Errorf("reading the answer: %w", err))
	}
	b := &heldBody{t: p.t, key: p.key, c: p.c, br: br, body: resp.Body, stop: p.stop, ctx: p.ctx,
		reuse: !resp.Close && !p.req.Close}
	if resp.Body == http.NoBody {
		b.finish(true)
	} else {
		resp.Body = b
	}
	if p.gz {
		ungzip(resp) // the decoder reads from the connection's body
	}
	return resp, nil
}

func (p *pending) fail(err error) error {
	p.stop()
	p.c.Close()
	if p.ctx.Err() != nil {
		return p.ctx.Err()
	}
	return err
}

// replayable reports whether err, answer's, may be met by sending the
// request again on a new connection: nothing was read on a connection
// that had been idle, which the agent may have closed meanwhile.
func (p *pending) replayable(err error) bool {
	var nothing *errNothingRead
	return p.reused && errors.As(err, &nothing) && p.ctx.Err() == nil && replayable(p.req)
}

// heldBody is an answer's body: read to its end, it gives the connection
// back; closed before that, it closes the connection (draining a body of
// unknown length could take as long as the agent likes).
type heldBody struct {
	t     *connTransport
	key   string
	c     *heldConn
	br    *bufio.Reader
	body  io.ReadCloser // http.ReadResponse's, reading from br
	stop  func() bool
	ctx   context.Context
	reuse bool

	mu      sync.Mutex // Close may come from another goroutine than Read
	reading bool       // a Read uses br: whoever ends it returns br
	done    error      // what Read returns once finished
}

var errBodyClosed = errors.New("read on closed response body")

func (b *heldBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.done != nil {
		b.mu.Unlock()
		return 0, b.done
	}
	b.reading = true
	b.mu.Unlock()
	n, err := b.body.Read(p)
	if err != nil && err != io.EOF && b.ctx.Err() != nil {
		err = b.ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reading = false
	switch {
	case b.done != nil: // closed while reading
		b.releaseLocked()
		return n, b.done
	case err == io.EOF:
		b.finishLocked(true)
	case err != nil:
		b.finishLocked(false)
	}
	return n, err
}

func (b *heldBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done == nil {
		b.finishLocked(false)
	}
	return nil
}

// finish ends the round trip: the connection goes back to the pool if
// the body was read to its end, the agent keeps it open, nothing follows
// the answer and the context did not close it meanwhile.
func (b *heldBody) finish(eof bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.finishLocked(eof)
}

func (b *heldBody) finishLocked(eof bool) {
	b.done = errBodyClosed
	if eof {
		b.done = io.EOF
	}
	if eof && b.stop() && b.reuse && b.br.Buffered() == 0 {
		b.t.put(b.key, b.c)
	} else {
		b.stop()
		b.c.Close() // unblocks a Read in progress
	}
	if !b.reading {
		b.releaseLocked()
	}
}

// releaseLocked returns the read buffer to the pool.
func (b *heldBody) releaseLocked() {
	if b.br != nil {
		b.br.Reset(nil)
		readers.Put(b.br)
		b.br = nil
	}
}
