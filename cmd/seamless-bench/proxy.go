package main

import (
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// countingProxy is a reverse proxy in front of Consul for one tool of
// `seamless-bench peer`: it counts the tool's requests and the bytes of
// Consul's answers by path class, as they travel to the tool.
//
// Bytes are the response bodies as sent, i.e. gzip-encoded when the tool
// asked for it (its Accept-Encoding is passed through unchanged, and the
// upstream transport neither adds one nor decodes), plus the response
// headers separately. Blocking queries pass through unbuffered
// (FlushInterval -1), and neither side caps connections.
type countingProxy struct {
	addr string
	srv  *http.Server
	ln   net.Listener
	tr   *http.Transport
	done chan struct{}

	mu     sync.Mutex
	counts proxyCounts
	open   int
}

// The path classes of proxyCounts.Class.
const (
	classHealth  = "/v1/health/service/*"
	classCatalog = "/v1/catalog/services"
	classNodes   = "/v1/catalog/nodes"
	classUINodes = "/v1/internal/ui/nodes"
	classKV      = "/v1/kv/*"
	classOther   = "other"
)

var pathClasses = []string{classHealth, classCatalog, classNodes, classUINodes, classKV, classOther}

func classify(path string) string {
	switch {
	case strings.HasPrefix(path, "/v1/health/service/"):
		return classHealth
	case path == "/v1/catalog/services":
		return classCatalog
	case path == "/v1/catalog/nodes":
		return classNodes
	case path == "/v1/internal/ui/nodes":
		return classUINodes
	case strings.HasPrefix(path, "/v1/kv/"):
		return classKV
	}
	return classOther
}

// What a blocking query's answer was: the first of its watch (no index),
// its wait running out with nothing changed (the index it asked with comes
// back), or news.
const (
	kindFirst = iota
	kindIdle
	kindChange
	nKinds
)

var kindNames = [nKinds]string{"first", "idle", "change"}

// traffic is requests and bytes.
type traffic struct {
	Requests, Body, Header int64
}

func (t traffic) add(o traffic) traffic {
	return traffic{t.Requests + o.Requests, t.Body + o.Body, t.Header + o.Header}
}

func (t traffic) sub(o traffic) traffic {
	return traffic{t.Requests - o.Requests, t.Body - o.Body, t.Header - o.Header}
}

// proxyCounts are the proxy's counters at one moment. Answers are counted
// when they have been sent in full.
type proxyCounts struct {
	Class map[string]traffic
	Kind  [nKinds]traffic
	// Gzip is the answers sent gzip-encoded; AcceptGzip the requests that
	// asked for it.
	Gzip, AcceptGzip int64
	Errors           int64 // answers the proxy could not get from Consul
	Conns            int64 // client connections accepted
	PeakOpen         int   // most client connections open at once
}

func (c proxyCounts) total() traffic {
	var t traffic
	for _, v := range c.Class {
		t = t.add(v)
	}
	return t
}

// sub is c minus an earlier reading; PeakOpen stays c's.
func (c proxyCounts) sub(o proxyCounts) proxyCounts {
	d := proxyCounts{Class: map[string]traffic{}, Gzip: c.Gzip - o.Gzip, AcceptGzip: c.AcceptGzip - o.AcceptGzip,
		Errors: c.Errors - o.Errors, Conns: c.Conns - o.Conns, PeakOpen: c.PeakOpen}
	for k, v := range c.Class {
		d.Class[k] = v.sub(o.Class[k])
	}
	for i := range c.Kind {
		d.Kind[i] = c.Kind[i].sub(o.Kind[i])
	}
	return d
}

// startProxy listens on a free loopback port and forwards to the Consul
// HTTP API at upstream (host:port).
func startProxy(upstream string) (*countingProxy, error) {
	target, err := url.Parse("http://" + upstream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countingProxy{addr: ln.Addr().String(), ln: ln, done: make(chan struct{}),
		counts: proxyCounts{Class: map[string]traffic{}}}
	p.tr = &http.Transport{
		Proxy:       nil,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		// One upstream connection per held blocking query, kept for the
		// next: as many as the tool holds, never a pool that makes the
		// proxy reconnect (which would cost Consul what the tool did not).
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 1 << 20,
		IdleConnTimeout:     15 * time.Minute,
		// Pass the tool's Accept-Encoding on as it is: no gzip added, no
		// answer decoded on the way.
		DisableCompression: true,
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     p.tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.mu.Lock()
			p.counts.Errors++
			p.mu.Unlock()
			w.WriteHeader(http.StatusBadGateway)
		},
		ErrorLog: discardLogger,
	}
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(rp, w, r) }),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          discardLogger,
		ConnState: func(_ net.Conn, st http.ConnState) {
			p.mu.Lock()
			defer p.mu.Unlock()
			switch st {
			case http.StateNew:
				p.counts.Conns++
				p.open++
				p.counts.PeakOpen = max(p.counts.PeakOpen, p.open)
			case http.StateClosed, http.StateHijacked:
				p.open--
			}
		},
	}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

func (p *countingProxy) serve(rp *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) {
	cw := &countingWriter{ResponseWriter: w}
	rp.ServeHTTP(cw, r)
	asked := r.URL.Query().Get("index")
	kind := kindChange
	switch {
	case asked == "":
		kind = kindFirst
	case asked == cw.Header().Get("X-Consul-Index"):
		kind = kindIdle
	}
	t := traffic{Requests: 1, Body: cw.body, Header: cw.header}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := classify(r.URL.Path)
	p.counts.Class[c] = p.counts.Class[c].add(t)
	p.counts.Kind[kind] = p.counts.Kind[kind].add(t)
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		p.counts.AcceptGzip++
	}
	if cw.Header().Get("Content-Encoding") == "gzip" {
		p.counts.Gzip++
	}
}

// read returns the counters now.
func (p *countingProxy) read() proxyCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counts
	c.Class = map[string]traffic{}
	for k, v := range p.counts.Class {
		c.Class[k] = v
	}
	return c
}

// resetPeak starts a new peak of open connections from those open now.
func (p *countingProxy) resetPeak() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts.PeakOpen = p.open
}

// stop closes the listener and every connection, held queries included.
func (p *countingProxy) stop() {
	_ = p.srv.Close()
	<-p.done
	p.tr.CloseIdleConnections()
}

// countingWriter counts what the proxy writes to the tool. Unwrap lets
// the reverse proxy flush through it.
type countingWriter struct {
	http.ResponseWriter
	body, header int64
	wrote        bool
}

func (w *countingWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		// The status line and the header block as HTTP/1.1 sends them.
		n := int64(len(fmt.Sprintf("HTTP/1.1 %03d %s\r\n", code, http.StatusText(code))))
		cw := &byteCounter{}
		_ = w.Header().Write(cw)
		w.header = n + cw.n + 2
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.body += int64(n)
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type byteCounter struct{ n int64 }

func (c *byteCounter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	return len(b), nil
}

// discardLogger silences the proxy's and its server's own logging: a
// tool hanging up on a held query is not news.
var discardLogger = stdlog.New(io.Discard, "", 0)
