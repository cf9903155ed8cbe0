package consul

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// DefaultMaxStale is the usual bound on how far behind the leader a stale
// read may be: two of Raft's election timeouts in Consul's default
// production timing (raft_multiplier 5: a follower starts an election
// after 5s without the leader), so a server that answers with more is cut
// off from its cluster, not merely slow. Consul's own discovery_max_stale
// is a bound of the same kind, checked by the servers.
const DefaultMaxStale = 10 * time.Second

// staleAnswer is an answer from a Consul server too far behind its leader,
// or that knows no leader: its data may be old, so it is not used.
type staleAnswer struct {
	path        string
	server      string // the agent that relayed it
	lastContact time.Duration
	noLeader    bool
	bound       time.Duration
}

func (e *staleAnswer) Error() string {
	if e.noLeader {
		return fmt.Sprintf("the Consul server answering %s through %s knows no leader (X-Consul-KnownLeader: false; last contact %s ago)",
			e.path, e.server, e.lastContact)
	}
	return fmt.Sprintf("the Consul server answering %s through %s last heard from its leader %s ago, more than SEAMLESS_CONSUL_MAX_STALE=%s",
		e.path, e.server, e.lastContact, e.bound)
}

// freshnessTransport refuses answers staler than bound (0: no bound) as
// a *staleAnswer error, so that every query's usual failure path keeps the
// last good data, reads afresh and retries after a backoff.
type freshnessTransport struct {
	next  http.RoundTripper
	bound time.Duration
}

func (f *freshnessTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(r)
	if err != nil || f.bound <= 0 || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	if sa := checkFresh(resp.Header, f.bound); sa != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // keeps the connection
		resp.Body.Close()
		sa.path, sa.server = r.URL.Path, r.URL.Host
		return nil, sa
	}
	return resp, nil
}

// checkFresh reads Consul's headers on an answer's freshness. Headers that
// are absent or not numbers say nothing (a proxy may strip them, and
// local endpoints send none). Answers from the agent's streaming view
// (X-Consul-Query-Backend: streaming) always say KnownLeader false and
// LastContact 0 (Consul 1.14): they carry no measure, so they pass.
func checkFresh(h http.Header, bound time.Duration) *staleAnswer {
	if h.Get("X-Consul-Query-Backend") == "streaming" {
		return nil
	}
	var sa staleAnswer
	if ms, err := strconv.ParseUint(h.Get("X-Consul-LastContact"), 10, 63); err == nil {
		sa.lastContact = time.Duration(ms) * time.Millisecond
	}
	sa.noLeader = h.Get("X-Consul-KnownLeader") == "false"
	if !sa.noLeader && sa.lastContact <= bound {
		return nil
	}
	sa.bound = bound
	return &sa
}

// isStale reports whether err is a refused stale answer, and why.
func isStale(err error) (string, bool) {
	var sa *staleAnswer
	if errors.As(err, &sa) {
		return sa.Error(), true
	}
	return "", false
}

// staleness says whether w's query is stale, given the error of its
// latest fetch: a fetcher that assembles several queries knows it better
// (one of its parts may be stale while another answered).
func staleness(f fetcher, err error) string {
	if sf, ok := f.(interface{ staleness() (string, bool) }); ok {
		if r, ok := sf.staleness(); ok {
			return r
		}
	}
	r, _ := isStale(err)
	return r
}

// setStaleAnswer records whether w's latest answer was refused as stale,
// logging the first watch that becomes stale and the last that recovers:
// once per episode. s.mu is held.
func (s *Source) setStaleAnswerLocked(w *watch, reason string) {
	if (w.staleAnswer != "") == (reason != "") {
		w.staleAnswer = reason
		return
	}
	others := false
	for _, o := range s.watches {
		if o != w && o.staleAnswer != "" {
			others = true
		}
	}
	w.staleAnswer = reason
	switch {
	case others:
	case reason != "":
		s.log.Warn("Consul's answer is stale: "+reason+"; the last good data keeps serving, retrying", "query", w.q.String())
	default:
		s.log.Info("Consul's answers are fresh again", "query", w.q.String())
	}
}
