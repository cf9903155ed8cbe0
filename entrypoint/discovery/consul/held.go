package consul

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// A per-service catalog holds a blocking query on each service's health,
// and most of them wait for minutes. Through the API client each waits
// on its watch's goroutine under every frame of the client, of net/http's
// Client and of the transports (3.6 KiB of them), so a goroutine whose
// stack grew to 8 KiB while it decoded an answer never shrinks back: 8
// KiB of stack and 5 KiB of heap (the client's copies of the request,
// its headers and URL) per watched service, 13 MiB at 1,000. A held
// health query instead writes its request, and waits for the answer's
// first byte on a goroutine of its own that does nothing else (2 KiB of
// stack); the watch's loop goes on, on that goroutine, once the answer
// begins (subWatch.loop).

// agentRequest is what the API client adds to each of its requests, as
// New resolved its configuration: Address, PathPrefix and Token as
// api.NewClient left them (a unix socket's path, the token file read).
type agentRequest struct {
	scheme     string
	address    string
	pathPrefix string
	params     url.Values  // the configuration's datacenter, namespace, partition and wait
	header     http.Header // read only: shared by every request
}

func newAgentRequest(ac *api.Config) *agentRequest {
	r := &agentRequest{scheme: ac.Scheme, address: ac.Address, pathPrefix: ac.PathPrefix, params: url.Values{}, header: http.Header{}}
	// As api.Client.newRequest, then toHTTP and doRequest.
	if strings.HasPrefix(r.address, "/") { // a unix socket: its path is no host
		r.address = "localhost"
	}
	if ac.Datacenter != "" {
		r.params.Set("dc", ac.Datacenter)
	}
	if ac.Namespace != "" {
		r.params.Set("ns", ac.Namespace)
	}
	if ac.Partition != "" {
		r.params.Set("partition", ac.Partition)
	}
	if ac.WaitTime != 0 {
		r.params.Set("wait", durToMsec(ac.WaitTime))
	}
	if ac.Token != "" {
		r.header.Set("X-Consul-Token", ac.Token)
	}
	r.header.Set("Content-Type", "application/json; charset=utf-8")
	if ac.HttpAuth != nil {
		req := http.Request{Header: r.header}
		req.SetBasicAuth(ac.HttpAuth.Username, ac.HttpAuth.Password)
	}
	return r
}

// health is the request of Health().Service(name, tag, false, q) for the
// options queryOptions and read set (datacenter, stale, index, wait), to
// host.
func (r *agentRequest) health(ctx context.Context, host, dc, name, tag string, stale bool, index uint64, wait time.Duration) *http.Request {
	return r.get(ctx, host, "/v1/health/service/"+name, dc, tag, stale, index, wait)
}

// get is the request of Raw().Query(path, ...) with those options, plus
// a tag parameter when tag is set.
func (r *agentRequest) get(ctx context.Context, host, path, dc, tag string, stale bool, index uint64, wait time.Duration) *http.Request {
	params := make(url.Values, len(r.params)+4)
	for k, v := range r.params {
		params[k] = v // replaced, never appended to
	}
	if dc != "" {
		params.Set("dc", dc)
	}
	if stale {
		params.Set("stale", "")
	}
	if index != 0 {
		params.Set("index", strconv.FormatUint(index, 10))
	}
	if wait != 0 {
		params.Set("wait", durToMsec(wait))
	}
	if tag != "" {
		params.Add("tag", tag)
	}
	u := &url.URL{Scheme: r.scheme, Host: host, Path: r.pathPrefix + path, RawQuery: params.Encode()}
	req := &http.Request{Method: http.MethodGet, URL: u, Host: host, Header: r.header,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	return req.WithContext(ctx)
}

// durToMsec is the API client's rendering of a wait.
func durToMsec(d time.Duration) string {
	ms := d / time.Millisecond
	if d > 0 && ms == 0 {
		ms = 1
	}
	return strconv.FormatInt(int64(ms), 10) + "ms"
}

// heldHealth is a health query written to the agent, its answer not yet
// begun. What ends it closes its connection: the sub-watch's end (the
// request's context), Consul's restart or the agent's return (while it
// waits on an index), its deadline. A context of its own for each would
// cost as much as the rest of it.
type heldHealth struct {
	s         *Source
	sb        *sub
	p         *pending
	index     uint64 // waited on
	quietTo   uint64 // subWatch.quietTo when sent
	deadline  time.Time
	c         *splitCatalog
	onRestart bool // registered with cutAtRestart
	// A cut (a restart, the agent's return) closes conn while the answer
	// has not begun; once it has, the deadline bounds it, and its
	// connection goes back to the pool when read: a cut then must not
	// close a connection that another request may have taken.
	mu    sync.Mutex
	cut   bool
	begun bool
	conn  *heldConn
}

// holdHealth writes the health query of w's service, waiting on index,
// with the transports' rules: counted, sent to the current agent or the
// next one that can be reached, and its answer refused when stale. It
// returns nil (and no error) where connTransport does not serve the
// request (HTTPS, a proxy): read reads it then.
func (c *splitCatalog) holdHealth(w *subWatch, index uint64, wait time.Duration) (*heldHealth, error) {
	s, sb := c.s, w.sb
	if s.conns == nil {
		return nil, nil
	}
	if wait <= 0 {
		wait = s.cfg.WaitTime
	}
	request := func(host string) *http.Request {
		return s.request.health(w.ctx, host, c.dc, sb.name, s.cfg.TagFilter, s.cfg.Stale, index, wait)
	}
	req := request(s.request.address)
	if !s.conns.serves(req) || s.agents != nil && !s.servesEveryAgent() {
		return nil, nil
	}
	// queryOptions' timeout, index being at least 1.
	h := &heldHealth{s: s, sb: sb, index: index, quietTo: w.quietTo(), deadline: time.Now().Add(s.cfg.Margin + s.maxWait()), c: c}
	s.started.Add(1)
	var err error
	if s.agents == nil {
		h.p, err = s.conns.send(req, h.deadline)
	} else {
		// Only a connection that could not be made fails over: a
		// failed write is answered by the held query, as by try.
		err = s.agents.each(w.ctx, false, func(i int) (error, bool) {
			var err error
			h.p, err = s.conns.send(request(s.agents.hosts[i]), h.deadline)
			return err, err == nil
		})
	}
	if err != nil {
		s.finished.Add(1)
		return nil, fmt.Errorf("reading service %q: %w", sb.name, err)
	}
	h.conn = h.p.c        // before any cut can run
	if w.cur.wait() > 0 { // a fresh read answers at once anyway
		h.onRestart = true
		c.cutAtRestart(w.epoch, h)
	}
	s.probe.cutAtReconnection(w.reconnection, h)
	return h, nil
}

// servesEveryAgent reports whether conns serves requests to each agent:
// a held query fails over from one to the next on conns itself, which
// must not reach directly an agent the proxy rule (NO_PROXY) sends
// through a proxy. The rule is the environment's, read once.
func (s *Source) servesEveryAgent() bool {
	s.holdsAllOnce.Do(func() {
		s.holdsAll = true
		for _, host := range s.agents.hosts {
			r := &http.Request{Method: http.MethodGet, URL: &url.URL{Scheme: s.agents.scheme, Host: host}, Header: http.Header{}}
			s.holdsAll = s.holdsAll && s.conns.serves(r)
		}
	})
	return s.holdsAll
}

// cutAtRestart has h cut short by the restart that ends epoch, at once
// if it came already. The held queries are kept here, not in a callback
// each on the context: that took 200 bytes a query, and at the restart a
// goroutine each at once.
func (c *splitCatalog) cutAtRestart(epoch context.Context, h *heldHealth) {
	cutAtEnd(&c.restartMu, &c.restartHeld, epoch, h)
}

// cutAtReconnection is cutAtRestart for the agent's return after a cut
// (agentProbe.reconnection).
func (p *agentProbe) cutAtReconnection(reconnection context.Context, h *heldHealth) {
	cutAtEnd(&p.mu, &p.reheld, reconnection, h)
}

// cutAtEnd adds h to held, the set that whoever ends ctx cuts short under
// mu, or cuts h at once if ctx has ended already: ctx is then no longer
// the one held belongs to.
func cutAtEnd(mu *sync.Mutex, held *map[*heldHealth]struct{}, ctx context.Context, h *heldHealth) {
	mu.Lock()
	if ctx.Err() == nil {
		if *held == nil {
			*held = map[*heldHealth]struct{}{}
		}
		(*held)[h] = struct{}{}
		mu.Unlock()
		return
	}
	mu.Unlock()
	h.cutShort()
}

// uncut ends what cutAtRestart and cutAtReconnection set up.
func (h *heldHealth) uncut() {
	if h.onRestart {
		h.c.restartMu.Lock()
		delete(h.c.restartHeld, h)
		h.c.restartMu.Unlock()
	}
	p := h.s.probe
	p.mu.Lock()
	delete(p.reheld, h)
	p.mu.Unlock()
}

// cutAll cuts every query of held short.
func cutAll(held map[*heldHealth]struct{}) {
	for h := range held {
		h.cutShort()
	}
}

func (h *heldHealth) cutShort() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cut = true
	if !h.begun {
		h.conn.Close()
	}
}

// begin notes that the answer has begun on the connection held: a cut
// leaves it alone from now on. It reports whether a cut came first.
func (h *heldHealth) begin() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.begun = true
	return h.cut
}

// rehold makes c the connection a cut closes until its answer begins,
// and closes it if a cut came first.
func (h *heldHealth) rehold(c *heldConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conn, h.begun = c, false
	if h.cut {
		c.Close()
	}
}

// wait blocks until the answer begins (or the query fails).
func (h *heldHealth) wait() { h.p.wait() }

// resend writes the held query again on a new connection, where a new
// query would go: to the current agent, or with several the next that can
// be reached (the agent that closed the connection may be gone).
func (h *heldHealth) resend() (*pending, error) {
	s, p := h.s, h.p
	if s.agents == nil {
		return p.t.send(p.req, h.deadline)
	}
	var again *pending
	err := s.agents.each(p.req.Context(), false, func(i int) (error, bool) {
		req := p.req
		if host := s.agents.hosts[i]; host != req.URL.Host {
			req = req.Clone(req.Context())
			req.URL.Host, req.Host = host, host
		}
		var err error
		again, err = p.t.send(req, h.deadline)
		return err, err == nil
	})
	return again, err
}

var answerBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// answer reads the answer once wait returned, as readHealth reads one:
// no entries when the index did not move.
func (h *heldHealth) answer() ([]healthEntry, *api.QueryMeta, error) {
	s, p := h.s, h.p
	defer s.finished.Add(1)
	defer h.uncut()
	cut := h.begin()
	resp, err := p.answer()
	if err != nil && p.replayable(err) && !cut && time.Now().Before(h.deadline) {
		// The agent closed the idle connection: once more on a new one,
		// on this goroutine.
		var again *pending
		if again, err = h.resend(); err == nil {
			h.rehold(again.c)
			again.wait()
			h.begin()
			resp, err = again.answer()
		}
	}
	if err != nil {
		return nil, nil, err
	}
	body := io.Reader(resp.Body)
	if resp.Body != http.NoBody {
		body = &countingBody{ReadCloser: resp.Body, n: &s.received}
	}
	buf := answerBuffers.Get().(*bytes.Buffer)
	defer func() {
		buf.Reset()
		answerBuffers.Put(buf)
	}()
	_, err = buf.ReadFrom(body)
	resp.Body.Close()
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, api.StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(buf.String())}
	}
	if bound := s.cfg.MaxStale; bound > 0 {
		if sa := checkFresh(resp.Header, bound); sa != nil {
			sa.path, sa.server = p.req.URL.Path, p.req.URL.Host
			return nil, nil, sa
		}
	}
	meta, err := queryMeta(resp.Header)
	if err != nil {
		return nil, nil, err
	}
	entries, err := healthEntries(buf.Bytes(), h.index, meta.LastIndex, h.quietTo)
	if err != nil {
		return nil, nil, err
	}
	if entries != nil {
		h.c.decoded.Add(1)
	}
	return entries, meta, nil
}

// queryMeta is what seamless reads of the API client's QueryMeta: the
// index and whether ACLs filtered the answer.
func queryMeta(h http.Header) (*api.QueryMeta, error) {
	meta := &api.QueryMeta{ResultsFilteredByACLs: h.Get("X-Consul-Results-Filtered-By-ACLs") == "true"}
	if v := h.Get("X-Consul-Index"); v != "" {
		var err error
		if meta.LastIndex, err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, fmt.Errorf("X-Consul-Index %q: %w", v, err)
		}
	}
	return meta, nil
}
