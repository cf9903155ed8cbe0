package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Name is the source's name in snapshots, instances and status.
const Name = "docker"

// Config configures the source.
type Config struct {
	// Network is the network whose container IP is used
	// (SEAMLESS_DOCKER_NETWORK). Empty: a container's only network; a
	// container on several is left out, with the reason in the log.
	Network string
	// Rescan is how often every container is listed again even without an
	// event; 0 means DefaultRescan.
	Rescan time.Duration
	// ClientOptions are applied after client.FromEnv, which reads
	// DOCKER_HOST, DOCKER_API_VERSION, DOCKER_CERT_PATH and
	// DOCKER_TLS_VERIFY. The API version is negotiated with the engine.
	ClientOptions []client.Opt
	// Client, when set, is used instead of a client built from the
	// environment and ClientOptions; the source does not close it.
	Client *client.Client
}

// DefaultRescan is Config.Rescan's default.
const DefaultRescan = 30 * time.Second

// settle is how long the first relevant event of a burst waits for the
// rest (`docker compose up` starting ten containers), so that one re-list
// covers them. Later events do not extend it, so no burst delays a change
// longer, and a storm of events costs at most one re-list per settle.
const settle = 100 * time.Millisecond

// requestTimeout bounds one re-list (the list and every inspect), so that
// an engine that accepts connections but does not answer cannot hold Run.
const requestTimeout = 30 * time.Second

// streamSettled is how long an event stream must have lasted for its end
// to start a new series of retries, rather than continue the last one.
const streamSettled = time.Minute

// Source is the Docker source. Create it with New; call Run once.
type Source struct {
	cli     *client.Client
	own     bool   // cli was made by New: Run closes it
	host    string // the engine's address and where it comes from, for errors
	network string
	rescan  time.Duration
	log     *slog.Logger

	mu        sync.Mutex
	status    model.SourceStatus
	listErr   string // the last re-list's error; "" when it succeeded
	streamErr string // why the event stream is down; "" while it is up
}

var (
	_ model.Source   = (*Source)(nil)
	_ model.Reporter = (*Source)(nil)
)

// New builds the Docker client and returns the source; log may be nil. It
// does not contact the engine: an engine that is not there yet is retried
// by Run, not a configuration error. A DOCKER_HOST that does not parse, or
// TLS files that cannot be read, are.
func New(cfg Config, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Rescan < 0 {
		return nil, fmt.Errorf("docker rescan interval %s is negative", cfg.Rescan)
	}
	if cfg.Rescan == 0 {
		cfg.Rescan = DefaultRescan
	}
	s := &Source{
		cli: cfg.Client, network: cfg.Network, rescan: cfg.Rescan,
		log:    log.With("component", "discovery", "source", Name),
		status: model.SourceStatus{Name: Name},
	}
	if s.cli == nil {
		opts := append([]client.Opt{client.FromEnv}, cfg.ClientOptions...)
		cli, err := client.New(opts...)
		if err != nil {
			return nil, fmt.Errorf("building the Docker client (%s): %w", describeEnv(), err)
		}
		s.cli, s.own = cli, true
	}
	s.host = describeHost(s.cli.DaemonHost())
	return s, nil
}

// describeEnv says what DOCKER_HOST asks for.
func describeEnv() string {
	if v := os.Getenv(client.EnvOverrideHost); v != "" {
		return client.EnvOverrideHost + "=" + v
	}
	return client.EnvOverrideHost + " unset"
}

// describeHost names the engine's address for messages, and where it
// comes from when that is DOCKER_HOST or the default.
func describeHost(host string) string {
	switch env := os.Getenv(client.EnvOverrideHost); {
	case env != "" && host == env:
		return host + " (DOCKER_HOST)"
	case env == "" && host == client.DefaultDockerHost:
		return host + " (the default socket: DOCKER_HOST is unset)"
	}
	return host
}

// Name returns "docker".
func (s *Source) Name() string { return Name }

// Status says whether the engine answers: Up when the last re-list
// succeeded and the event stream is not known to be down. Containers left
// out for their labels do not make the source down: each is logged, with
// the reason, when it is first seen.
func (s *Source) Status() model.SourceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Up = !st.LastSuccess.IsZero() && s.listErr == "" && s.streamErr == ""
	return st
}

// Run lists the labelled containers, sends them, and sends them again
// whenever they change, until ctx ends. See model.Source for the contract:
// a slow reader gets only the newest snapshot, and a re-list that changes
// nothing sends nothing. While the engine cannot be reached Run sends
// nothing (what was sent stays in use), reports the error in Status, and
// retries with backoff.
func (s *Source) Run(ctx context.Context, out chan<- model.Snapshot) {
	s.log.Info("watching Docker containers", "host", s.host, "network", s.network, "rescan", s.rescan)
	if s.own {
		defer s.cli.Close()
	}
	var (
		pending  *model.Snapshot // newest, not yet taken
		sent     *model.Catalog  // last taken; nil before the first
		ev       *stream         // nil while not subscribed
		known    = map[string]bool{}
		kills    = map[string]kill{} // the last signal of each listed container
		listBO   = newBackoff(s.rescan)
		streamBO = newBackoff(s.rescan)
		settling bool
		settleT  = time.NewTimer(settle)
		refreshT = time.NewTimer(0) // the first list, at once
		tr       = newTracker(s.log)
	)
	settleT.Stop()
	defer settleT.Stop()
	defer refreshT.Stop()
	defer func() { ev.close() }()
	for {
		var (
			send chan<- model.Snapshot // nil, so never chosen, without a pending snapshot
			snap model.Snapshot
		)
		if pending != nil {
			send, snap = out, *pending
		}
		select {
		case <-ctx.Done():
			return
		case send <- snap:
			sent, pending = snap.Local(), nil
			continue
		case m := <-ev.messages():
			streamBO.Reset()
			if !relevant(m, s.network, known) {
				continue
			}
			s.log.Debug("Docker event", "type", string(m.Type), "action", string(m.Action), "id", shortID(m.Actor.ID))
			if k, ok := killOf(m); ok {
				kills[m.Actor.ID] = k
			}
			if !settling {
				settling = true
				settleT.Reset(settle)
			}
			continue
		case err := <-ev.errors():
			if ctx.Err() != nil {
				return
			}
			if ev.age() > streamSettled {
				streamBO.Reset() // it had been fine: this is a new series
			}
			ev.close()
			ev = nil
			retry := streamBO.Next()
			s.streamFailed(err, retry)
			refreshT.Reset(retry) // subscribe again, and re-list what the gap hid
			continue
		case <-settleT.C:
			settling = false
		case <-refreshT.C:
		}

		// Subscribe before listing, so that no change falls between the two.
		if ev == nil {
			ev = s.subscribe(ctx)
		}
		found, err := s.list(ctx, kills)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			retry := listBO.Next()
			s.listFailed(err, retry)
			refreshT.Reset(retry)
			continue
		}
		// A stream that failed at once (a proxy refusing /events) has said
		// so by now: record that before calling the source up.
		select {
		case err := <-ev.errors():
			ev.close()
			ev = nil
			retry := streamBO.Next()
			s.streamFailed(err, retry)
			refreshT.Reset(retry)
		default:
			refreshT.Reset(s.rescan)
		}
		listBO.Reset()
		s.listed(ev != nil)
		cat, ids := tr.update(found)
		known = ids
		for id := range kills {
			if !ids[id] {
				delete(kills, id) // exited: its stop is over
			}
		}
		if sent != nil && reflect.DeepEqual(cat, sent) {
			pending = nil // the reader has it already
		} else {
			pending = &model.Snapshot{Source: Name, Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: cat}}}
		}
	}
}

// listed records a successful re-list; subscribed says the event stream
// is open and has not failed.
func (s *Source) listed(subscribed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listErr != "" {
		s.log.Info("Docker engine answers again", "host", s.host)
	}
	s.listErr = ""
	if subscribed {
		s.streamErr = ""
	}
	s.status.LastSuccess = time.Now()
}

// listFailed records a failed re-list; the first of a series is logged as a
// warning.
func (s *Source) listFailed(err error, retry time.Duration) {
	msg := s.explain("listing containers", err) + " (the containers listed before stay in use)"
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listErr == "" {
		s.log.Warn("cannot list Docker containers; keeping those listed before and retrying", "err", msg, "retry_in", retry.Round(time.Millisecond))
	} else {
		s.log.Debug("listing Docker containers failed again", "err", msg, "retry_in", retry.Round(time.Millisecond))
	}
	s.listErr = msg
	s.status.LastError, s.status.LastErrorAt = msg, time.Now()
}

// streamFailed records the end of the event stream. The engine restarting
// ends it normally; anything else is a warning, once per series.
func (s *Source) streamFailed(err error, retry time.Duration) {
	msg := s.explain("watching container events", err) + "; changes are seen at the next re-list only"
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.streamErr != "" || s.listErr != "": // logged already, or the list's failure says it
		s.log.Debug("Docker event stream failed again", "err", msg)
	case isEOF(err):
		s.log.Info("Docker event stream ended; subscribing again and listing every container", "host", s.host, "retry_in", retry.Round(time.Millisecond))
	default:
		s.log.Warn("Docker event stream failed; subscribing again and listing every container", "err", msg, "retry_in", retry.Round(time.Millisecond))
	}
	s.streamErr = msg
	if s.listErr == "" { // a failing list is what the operator must fix first
		s.status.LastError, s.status.LastErrorAt = msg, time.Now()
	}
}

// explain turns err into a message an operator can act on: what failed,
// which engine, and what to check.
func (s *Source) explain(what string, err error) string {
	switch {
	case client.IsErrConnectionFailed(err):
		return fmt.Sprintf("%s: cannot reach the Docker engine at %s: %v; check that the engine runs, that its socket is mounted "+
			"into this container (-v /var/run/docker.sock:/var/run/docker.sock:ro) and readable by seamless's user, or set DOCKER_HOST",
			what, s.host, err)
	case cerrdefs.IsPermissionDenied(err):
		return fmt.Sprintf("%s: the Docker engine at %s refused: %v; a socket proxy in front of it must allow "+
			"GET /_ping, /version, /containers and /events", what, s.host, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("%s: the Docker engine at %s did not answer within %s", what, s.host, requestTimeout)
	}
	return fmt.Sprintf("%s: Docker engine at %s: %v", what, s.host, err)
}
