package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// maxKeptBody is how much of a response body is kept for Result.LastBody;
// the rest is read and discarded.
const maxKeptBody = 256

// client is one worker's connection state. It is not safe for concurrent use.
type client struct {
	cfg       Config
	conn      net.Conn
	br        *bufio.Reader
	stopAfter func() bool // unregisters the context hook of conn
	raw       []byte      // the request, identical for every attempt
	req       *http.Request
}

func newClient(cfg Config) *client {
	connHdr := "close"
	if cfg.Mode == KeepAlive {
		connHdr = "keep-alive"
	}
	host := cfg.Target
	if cfg.TLS != nil && cfg.TLS.ServerName != "" {
		host = cfg.TLS.ServerName
	}
	raw := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: seamless-loadgen\r\nConnection: %s\r\n\r\n",
		cfg.Path, host, connHdr)
	return &client{cfg: cfg, raw: []byte(raw), req: &http.Request{Method: http.MethodGet}}
}

// do makes one attempt. It returns the trimmed body on success, or a failure
// class. The caller ignores the class when ctx has ended.
func (c *client) do(ctx context.Context) (body, class string) {
	if c.conn == nil {
		if phase, err := c.dial(ctx); err != nil {
			return "", classify(phase, err)
		}
	}
	if err := c.conn.SetDeadline(time.Now().Add(c.cfg.Timeout)); err != nil {
		c.close()
		return "", classify("write", err)
	}
	// The context hook moves the deadline into the past when ctx ends; if it
	// ran before the line above, our deadline replaced its, so look again.
	if ctx.Err() != nil {
		c.close()
		return "", "canceled"
	}
	if _, err := c.conn.Write(c.raw); err != nil {
		c.close()
		return "", classify("write", err)
	}
	// Peek first: http.ReadResponse reports a connection closed before the
	// first byte as "unexpected EOF", the same as a truncated response.
	if _, err := c.br.Peek(1); err != nil {
		c.close()
		return "", classify("read", err)
	}
	resp, err := http.ReadResponse(c.br, c.req)
	if err != nil {
		c.close()
		return "", classify("read", err)
	}
	var kept keepWriter
	_, err = io.Copy(&kept, resp.Body)
	resp.Body.Close()
	if err != nil {
		c.close()
		return "", classify("read body", err)
	}
	// A server that answers "Connection: close" ends the connection
	// politely: the next request dials again and nothing failed.
	if c.cfg.Mode == NewConn || resp.Close {
		c.close()
	}
	if resp.StatusCode >= 500 {
		return "", fmt.Sprintf("status %d", resp.StatusCode)
	}
	return strings.TrimSpace(string(kept.buf)), ""
}

// dial connects, and with TLS shakes hands; it returns the phase that
// failed.
func (c *client) dial(ctx context.Context) (string, error) {
	d := net.Dialer{Timeout: c.cfg.Timeout}
	conn, err := d.DialContext(ctx, "tcp", c.cfg.Target)
	if err != nil {
		return "connect", err
	}
	if c.cfg.TLS != nil {
		tc := tls.Client(conn, c.cfg.TLS)
		hctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			conn.Close()
			return "handshake", err
		}
		conn = tc
	}
	c.conn = conn
	c.br = bufio.NewReader(conn)
	// Unblock a read or write in flight when the run ends, so Stop returns
	// promptly instead of after a full request timeout.
	c.stopAfter = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return "", nil
}

func (c *client) close() {
	if c.conn == nil {
		return
	}
	c.stopAfter()
	c.conn.Close()
	c.conn, c.br, c.stopAfter = nil, nil, nil
}

// keepWriter keeps the first maxKeptBody bytes written to it.
type keepWriter struct{ buf []byte }

func (w *keepWriter) Write(p []byte) (int, error) {
	if room := maxKeptBody - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

var addrRE = regexp.MustCompile(`\[?[0-9a-fA-F:.]*[0-9a-fA-F]\]?:[0-9]+|"[^"]*"`)

// classify turns an error into a short, stable failure class such as
// "connect: connection refused" or "read: connection reset by peer".
// Addresses and ports never appear, so classes aggregate across connections.
func classify(phase string, err error) string {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.Is(err, io.EOF):
		// The peer closed before sending a byte of the response: the
		// classic "idle keep-alive connection closed as we sent" race.
		return "EOF"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return phase + ": timeout"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return phase + ": " + errno.Error()
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return phase + ": timeout"
	}
	var operr *net.OpError
	if errors.As(err, &operr) && operr.Err != nil {
		return phase + ": " + sanitize(operr.Err.Error())
	}
	if phase == "read" {
		// Everything else http.ReadResponse reports is a parse error whose
		// text quotes the offending bytes.
		return "read: malformed response"
	}
	return phase + ": " + sanitize(err.Error())
}

func sanitize(s string) string {
	s = addrRE.ReplaceAllString(s, "_")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}
