package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// tlsLoad is one client mode of the TLS benchmark: every request on a new
// connection (a full handshake each), or keep-alive connections. Requests
// are written by hand, never retried (net/http's Transport retries a GET
// on a reused connection that broke, which would hide exactly the
// failures a reload causes).
type tlsLoad struct {
	addr, host string
	keepAlive  bool
	max        int64 // requests of the whole load, at most

	mu         sync.Mutex
	handshakes int64
	hsFailed   int64
	requests   int64
	reqFailed  int64
	errs       map[string]int64
	lat        []time.Duration // per request; with a new connection, handshake included
	issued     int64
}

func newTLSLoad(addr, host string, keepAlive bool, max int64) *tlsLoad {
	return &tlsLoad{addr: addr, host: host, keepAlive: keepAlive, max: max, errs: map[string]int64{}}
}

// merge adds o's counts and latencies to l's.
func (l *tlsLoad) merge(o *tlsLoad) {
	if o == nil {
		return
	}
	l.handshakes += o.handshakes
	l.hsFailed += o.hsFailed
	l.requests += o.requests
	l.reqFailed += o.reqFailed
	l.lat = append(l.lat, o.lat...)
	for k, v := range o.errs {
		l.errs[k] += v
	}
}

// run runs workers until ctx ends or the load has issued max requests.
func (l *tlsLoad) run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { l.work(ctx) })
	}
	wg.Wait()
}

// take reserves one request of the budget.
func (l *tlsLoad) take() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.issued >= l.max {
		return false
	}
	l.issued++
	return true
}

func (l *tlsLoad) fail(handshake bool, class string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if handshake {
		l.hsFailed++
	} else {
		l.reqFailed++
	}
	l.errs[class]++
}

func (l *tlsLoad) work(ctx context.Context) {
	var (
		conn *tls.Conn
		br   *bufio.Reader
	)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	req := []byte("GET / HTTP/1.1\r\nHost: " + l.host + "\r\nUser-Agent: seamless-bench\r\n\r\n")
	// No ClientSessionCache: no resumption, every new connection is a
	// full handshake.
	cfg := &tls.Config{ServerName: l.host, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	// The run ends at ctx's deadline, checked by the clock too: ctx.Err
	// is set by a timer that a busy machine runs late, while a dial
	// already fails at once with "i/o timeout", which would count as a
	// burst of failed handshakes.
	over := func() bool {
		d, ok := ctx.Deadline()
		return ctx.Err() != nil || ok && !time.Now().Before(d)
	}
	for !over() && l.take() {
		start := time.Now()
		if conn == nil {
			d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := d.DialContext(dctx, "tcp", l.addr)
			cancel()
			if over() {
				return
			}
			if err != nil {
				l.fail(true, "handshake: "+classifyTLS(err))
				continue
			}
			l.mu.Lock()
			l.handshakes++
			l.mu.Unlock()
			conn, br = c.(*tls.Conn), bufio.NewReader(c)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		resp, err := func() (*http.Response, error) {
			if _, err := conn.Write(req); err != nil {
				return nil, err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp, err
		}()
		if over() {
			return
		}
		switch {
		case err != nil:
			l.fail(false, "request: "+classifyTLS(err))
		case resp.StatusCode != http.StatusOK:
			l.fail(false, fmt.Sprintf("request: status %d", resp.StatusCode))
		default:
			l.mu.Lock()
			l.requests++
			l.lat = append(l.lat, time.Since(start))
			l.mu.Unlock()
		}
		if err != nil || !l.keepAlive || resp.Close {
			conn.Close()
			conn = nil
		}
	}
}

// classifyTLS names an error's kind for the table's notes.
func classifyTLS(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	s := err.Error()
	for _, k := range []string{"connection reset", "connection refused", "broken pipe", "bad certificate", "handshake failure", "EOF"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}
