package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const (
	// DefaultProbe is how often, while another agent serves, the
	// preferred (first) agent is asked whether it answers again.
	DefaultProbe = 5 * time.Second
	// dialTimeout bounds a connection attempt to one agent when there are
	// several: a silent (firewalled) agent is left for the next quickly,
	// well before a request's own deadline.
	dialTimeout = 3 * time.Second
)

// parseAgents checks a list of agents, "host:port" or
// "http(s)://host:port", and returns their host:port and their one scheme.
func parseAgents(list []string) (hosts []string, scheme string, err error) {
	for _, a := range list {
		s, hp := "http", strings.TrimSpace(a)
		if i := strings.Index(hp, "://"); i >= 0 {
			s, hp = hp[:i], hp[i+3:]
		}
		if s != "http" && s != "https" {
			return nil, "", fmt.Errorf("consul agent %q: scheme %q, want http or https (a unix socket names one agent: use CONSUL_HTTP_ADDR)", a, s)
		}
		host, port, err := net.SplitHostPort(hp)
		if err != nil || host == "" {
			return nil, "", fmt.Errorf("consul agent %q: want host:port", a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, "", fmt.Errorf("consul agent %q: port %q is not a number from 1 to 65535", a, port)
		}
		if scheme != "" && s != scheme {
			return nil, "", fmt.Errorf("consul agents %q: mixed schemes %s and %s; the agents share one TLS configuration", strings.Join(list, ","), scheme, s)
		}
		scheme = s
		hosts = append(hosts, hp)
	}
	if len(hosts) == 0 {
		return nil, "", errors.New("consul agents: empty list")
	}
	return hosts, scheme, nil
}

// failoverTransport sends every request of the client (so every watch) to
// the current agent. When an agent cannot be reached (no connection: dial
// refused or timed out, not an HTTP answer, which is Consul's to give),
// the request goes to the next agent in order, which becomes the current
// one. While the current agent is not the first (preferred, usually the
// local one), run probes the first and returns to it once it answers with
// a leader. Indexes are the cluster's, so watches keep them across agents.
type failoverTransport struct {
	next   http.RoundTripper
	scheme string
	hosts  []string
	cur    atomic.Int32
	probe  time.Duration
	log    *slog.Logger
}

// current is the agent requests go to now, as scheme://host:port.
func (f *failoverTransport) current() string {
	return f.scheme + "://" + f.hosts[f.cur.Load()]
}

func (f *failoverTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var resp *http.Response
	err := f.each(r.Context(), r.Body != nil && r.GetBody == nil, func(i int) (err error, reached bool) {
		resp, err, reached = f.try(r, i)
		return err, reached
	})
	return resp, err
}

// each calls try with the current agent, then with the next ones in turn
// while try says it could not reach one, and makes the first that it
// reached the current one. once: the request cannot be sent twice.
func (f *failoverTransport) each(ctx context.Context, once bool, try func(i int) (err error, reached bool)) error {
	start := int(f.cur.Load())
	var errs []error
	for k := range f.hosts {
		i := (start + k) % len(f.hosts)
		err, reached := try(i)
		if err == nil || reached || ctx.Err() == context.Canceled {
			if err == nil && i != start {
				f.moveTo(start, i, errors.Join(errs...))
			}
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", f.hosts[i], err))
		if ctx.Err() != nil || once {
			// Out of time (the next request goes to the next agent), or
			// a body that cannot be sent twice.
			if next := (i + 1) % len(f.hosts); next != i {
				f.moveTo(start, next, err)
			}
			return err
		}
	}
	return fmt.Errorf("no Consul agent answers (%s, tried in order): %w", strings.Join(f.hosts, ", "), errors.Join(errs...))
}

// try sends r to agent i; reached says an agent took the connection, so
// that err (if any) is not the agent's absence.
func (f *failoverTransport) try(r *http.Request, i int) (resp *http.Response, err error, reached bool) {
	var got atomic.Bool
	ctx := httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { got.Store(true) },
	})
	req := r.Clone(ctx)
	req.URL.Scheme, req.URL.Host, req.Host = f.scheme, f.hosts[i], f.hosts[i]
	if r.GetBody != nil {
		if req.Body, err = r.GetBody(); err != nil {
			return nil, err, false
		}
	}
	resp, err = f.next.RoundTrip(req)
	if err == nil {
		return resp, nil, true
	}
	var op *net.OpError
	dial := errors.As(err, &op) && op.Op == "dial"
	return nil, err, got.Load() && !dial
}

// moveTo makes agent to the current one, unless another request moved it
// from from already; it logs the move once.
func (f *failoverTransport) moveTo(from, to int, why error) {
	if f.cur.CompareAndSwap(int32(from), int32(to)) {
		f.log.Warn(fmt.Sprintf("Consul agent %s does not answer; failing over to %s", f.hosts[from], f.hosts[to]),
			"from", f.hosts[from], "to", f.hosts[to], "err", why)
	}
}

// run probes the preferred agent while another serves, until ctx ends.
func (f *failoverTransport) run(ctx context.Context) {
	t := time.NewTicker(f.probe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := f.cur.Load()
		if cur == 0 {
			continue
		}
		if err := f.ready(ctx); err != nil {
			f.log.Debug("the preferred Consul agent is not back", "agent", f.hosts[0], "err", err)
			continue
		}
		if f.cur.CompareAndSwap(cur, 0) {
			f.log.Info(fmt.Sprintf("the preferred Consul agent %s answers again; back to it from %s", f.hosts[0], f.hosts[cur]),
				"from", f.hosts[cur], "to", f.hosts[0])
		}
	}
}

// ready asks the preferred agent for the cluster's leader: an agent that
// answers but has not joined its cluster yet knows none, and would fail
// every query.
func (f *failoverTransport) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(f.probe, 5*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.scheme+"://"+f.hosts[0]+"/v1/status/leader", nil)
	if err != nil {
		return err
	}
	resp, err := f.next.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %d", resp.StatusCode)
	}
	var leader string
	if err := json.Unmarshal(body, &leader); err != nil || leader == "" {
		return fmt.Errorf("knows no leader (%q)", body)
	}
	return nil
}
