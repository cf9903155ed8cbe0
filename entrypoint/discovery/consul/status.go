package consul

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Status reports the latest success and error, and whether the source is
// up: Run is running, something succeeded, and the last attempt of every
// watch did.
func (s *Source) Status() model.SourceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	var overdue []string
	now := time.Now()
	for _, q := range slices.SortedFunc(maps.Keys(s.watches), func(a, b model.Query) int { return strings.Compare(a.String(), b.String()) }) {
		if r := s.overdue(s.watches[q], now); r != "" {
			overdue = append(overdue, r)
		}
	}
	if why, since := s.probe.stale(); why != "" {
		// First: it explains the rest, and it is known within seconds
		// while a blocking query in flight may not fail for a minute.
		overdue = append([]string{fmt.Sprintf("%s (for %s)", why, now.Sub(since).Round(time.Second))}, overdue...)
	}
	st.Stale, st.StaleReason = len(overdue) > 0, strings.Join(overdue, "; ")
	st.Up = s.runCtx != nil && !st.LastSuccess.IsZero() && len(s.failing) == 0 && !st.Stale
	return st
}

// overdue says why w is stale at now, or "". s.mu is held.
func (s *Source) overdue(w *watch, now time.Time) string {
	if w.staleAnswer != "" {
		return fmt.Sprintf("answers to %s are refused as stale: %s", w.q, w.staleAnswer)
	}
	d := now.Sub(w.answered)
	if d <= s.staleAfter(w.q) {
		return ""
	}
	return fmt.Sprintf("no answer to %s from Consul at %s for %s (its requests answer within %s, plus a margin of %s)",
		w.q, s.addr(), d.Round(100*time.Millisecond), s.staleAfter(w.q)-s.cfg.Margin, s.cfg.Margin)
}

// checkStale logs each watch that became overdue since the last check.
func (s *Source) checkStale(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		if w.stale || w.staleAnswer != "" { // the latter logged on its own
			continue
		}
		if r := s.overdue(w, now); r != "" {
			w.stale = true
			s.log.Warn("Consul is stale: "+r+"; its last good data keeps serving", "query", w.q.String())
		}
	}
}

// succeeded records w's answer r; it is dropped if w was stopped
// meanwhile. stale says why a part of it is still stale, or is "".
func (s *Source) succeeded(w *watch, r model.Result, stale string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watches[w.q] != w {
		return
	}
	s.setStaleAnswerLocked(w, stale)
	if s.failing[w.q] {
		delete(s.failing, w.q)
		s.log.Info("query answered again", "query", w.q.String())
	}
	s.status.LastSuccess = time.Now()
	w.answered = s.status.LastSuccess
	if w.stale {
		w.stale = false
		s.log.Info("Consul answered again; the source is fresh", "query", w.q.String())
	}
	first := !s.tried[w.q]
	s.tried[w.q] = true
	if old, ok := s.results[w.q]; !ok || !sameResult(old, r) {
		s.results[w.q] = r
		s.version++
		s.signal()
	} else if first {
		s.signal()
	}
}

// failed records w's error; the first of a series is logged as a warning.
// stale says why w's query is stale, or is "": an answer refused as stale
// is not a failure of Consul, and is logged once per episode instead.
func (s *Source) failed(w *watch, err error, retry time.Duration, stale string) {
	msg := s.explain(w.q, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watches[w.q] != w {
		return
	}
	s.status.LastError, s.status.LastErrorAt = msg, time.Now()
	s.setStaleAnswerLocked(w, stale)
	if _, ok := isStale(err); ok {
		if s.failing[w.q] {
			delete(s.failing, w.q) // Consul answers, if not well
		}
		if !s.tried[w.q] {
			s.tried[w.q] = true
			s.signal()
		}
		return
	}
	if !s.failing[w.q] {
		s.log.Warn("Consul query failed; keeping its last answer and retrying", "query", w.q.String(), "err", msg, "retry_in", retry.Round(time.Millisecond))
	} else {
		s.log.Debug("Consul query failed again", "query", w.q.String(), "err", msg, "retry_in", retry.Round(time.Millisecond))
	}
	s.failing[w.q] = true
	if !s.tried[w.q] {
		s.tried[w.q] = true
		s.signal()
	}
}

// explain turns err into a message an operator can act on.
func (s *Source) explain(q model.Query, err error) string {
	what := "reading " + q.String()
	var se api.StatusError
	if errors.As(err, &se) {
		body := se.Body
		if len(body) > 200 {
			body = body[:200] + "..."
		}
		switch se.Code {
		case http.StatusForbidden, http.StatusUnauthorized:
			return fmt.Sprintf("%s: Consul at %s (%s) refused the request (%d %q): the token (%s or %s) lacks %s",
				what, s.addr(), s.addrHint, se.Code, body, api.HTTPTokenEnvName, api.HTTPTokenFileEnvName, rightsFor(q))
		default:
			return fmt.Sprintf("%s: Consul at %s (%s) answered %d: %q", what, s.addr(), s.addrHint, se.Code, body)
		}
	}
	return fmt.Sprintf("%s: Consul at %s (%s): %v", what, s.addr(), s.addrHint, err)
}

// rightsFor names the ACL rights q needs.
func rightsFor(q model.Query) string {
	switch q.Kind {
	case model.QueryKey, model.QueryPrefix:
		return "key:read on " + fmt.Sprintf("%q", q.Key)
	case model.QueryCatalog:
		return `node:read and service:read (node_prefix "" and service_prefix "" read)`
	}
	return "the rights for this query"
}

// sameResult reports whether b is a's answer unchanged: a catalog is
// compared by pointer (its fetcher returns the same one while nothing
// changed), the small KV and datacenter answers by value.
func sameResult(a, b model.Result) bool {
	return a.Catalog == b.Catalog && reflect.DeepEqual(a.Pairs, b.Pairs) && slices.Equal(a.Datacenters, b.Datacenters)
}
