package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The backends of the discovery benchmarks, and the probes that watch a
// change arrive through HAProxy.

// namedBackends are HTTP servers on 127.0.0.1 that answer their name.
type namedBackends struct {
	ports map[string]int
	srvs  []*http.Server
	wg    sync.WaitGroup
}

func startNamedBackends(names ...string) (*namedBackends, error) {
	b := &namedBackends{ports: map[string]int{}}
	for _, name := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.stop()
			return nil, err
		}
		body := []byte(name + "\n")
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.Write(body)
			}),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       time.Minute,
			// HAProxy's TCP health checks connect and close at once:
			// thousands of them are not worth a log line each.
			ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
		}
		b.srvs = append(b.srvs, srv)
		b.ports[name] = ln.Addr().(*net.TCPAddr).Port
		b.wg.Go(func() { _ = srv.Serve(ln) })
	}
	return b, nil
}

func (b *namedBackends) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range b.srvs {
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	}
	b.wg.Wait()
}

// pollClient sends the probes that look for a change: a new connection per
// request, so that the first request after a reload reaches the new
// worker, and no retries that would hide a failure.
var pollClient = &http.Client{
	Timeout: time.Second,
	Transport: &http.Transport{
		DisableKeepAlives: true,
		Proxy:             nil,
	},
}

// probe sends GET / with the Host header host to addr.
func probe(ctx context.Context, addr, host string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = host
	resp, err := pollClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// answer names a response as expect does: the body of a 200, else the
// status code.
func answer(code int, body string) string {
	if code == http.StatusOK {
		return body
	}
	return fmt.Sprint(code)
}

// verdict is what a probe's response says about a change.
type verdict int

const (
	pending   verdict = iota // still the old configuration
	reflected                // the change serves
	stray                    // neither: counted, polling goes on
)

// pollUntil probes addr every interval until judge says a response
// reflects the change, and returns when that response arrived. Transport
// errors count as stray. It fails at deadline.
func pollUntil(ctx context.Context, addr, host string, every time.Duration, deadline time.Time,
	judge func(code int, body string) verdict) (at time.Time, strays int, err error) {
	var last string
	for {
		start := time.Now()
		code, body, err := probe(ctx, addr, host)
		now := time.Now()
		switch {
		case err != nil:
			strays++
			last = err.Error()
		default:
			switch judge(code, body) {
			case reflected:
				return now, strays, nil
			case stray:
				strays++
			}
			last = answer(code, body)
		}
		if now.After(deadline) {
			return now, strays, fmt.Errorf("not served before the deadline (last answer %q)", last)
		}
		if err := sleepUntil(ctx, start.Add(every)); err != nil {
			return now, strays, err
		}
	}
}
