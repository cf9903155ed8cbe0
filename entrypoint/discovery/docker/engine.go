package docker

import (
	"context"
	"errors"
	"fmt"
	"github.com/seamless-lb/seamless/internal/backoff"
	"io"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"
)

// The engine's calls the source makes, all reads: GET /_ping (API version
// negotiation), GET /containers/json, GET /containers/{id}/json and
// GET /events.

// list lists the running containers labelled seamless.enable=true and
// converts each. A container removed between the list and its inspect is
// left out; any other failure fails the whole re-list, so that a partial
// answer never replaces a whole one.
func (s *Source) list(ctx context.Context, kills map[string]kill) ([]converted, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	res, err := s.cli.ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).Add("label", LabelEnable+"=true"),
	})
	if err != nil {
		return nil, err
	}
	out := make([]converted, 0, len(res.Items))
	for _, c := range res.Items {
		in, err := s.cli.ContainerInspect(ctx, c.ID, client.ContainerInspectOptions{})
		switch {
		case cerrdefs.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("inspecting container %s: %w", shortID(c.ID), err)
		}
		var k *kill
		if kl, ok := kills[c.ID]; ok {
			k = &kl
		}
		out = append(out, convertSafely(in.Container, s.network, k, time.Now()))
	}
	return out, nil
}

// eventFilter is what the engine is asked to stream: the container events
// that can change what the source reports, and network (dis)connections.
// The engine ANDs filter terms, so the label and the network name cannot
// be asked for here without losing one kind or the other: relevant
// narrows the stream further.
func eventFilter() client.Filters {
	return make(client.Filters).
		Add("type", string(events.ContainerEventType), string(events.NetworkEventType)).
		Add("event", "start", "restart", "die", "stop", "kill", "pause", "unpause",
			"health_status", "destroy", "rename", "connect", "disconnect")
}

// relevant reports whether an event may change what the source reports:
// any event of a container labelled seamless.enable=true (containers'
// events carry their labels), and a container of the last list joining or
// leaving the configured network (any network when none is configured).
// Every relevant event triggers a full re-list, never an incremental
// update: simple, and never out of order.
func relevant(m events.Message, network string, known map[string]bool) bool {
	switch m.Type {
	case events.ContainerEventType:
		return m.Actor.Attributes[LabelEnable] == "true"
	case events.NetworkEventType:
		if network != "" && m.Actor.Attributes["name"] != network {
			return false
		}
		return known[m.Actor.Attributes["container"]]
	}
	return false
}

// stream is one subscription to the engine's events. A nil *stream is no
// subscription: its channels are nil, so never ready.
type stream struct {
	res     client.EventsResult
	cancel  context.CancelFunc
	started time.Time
}

func (s *Source) subscribe(ctx context.Context) *stream {
	ctx, cancel := context.WithCancel(ctx)
	return &stream{res: s.cli.Events(ctx, client.EventsListOptions{Filters: eventFilter()}), cancel: cancel, started: time.Now()}
}

// age is how long ago the subscription was made.
func (st *stream) age() time.Duration { return time.Since(st.started) }

func (st *stream) messages() <-chan events.Message {
	if st == nil {
		return nil
	}
	return st.res.Messages
}

// errors yields the error that ended the stream. The client closes the
// channel after it, and close must follow: a closed channel is always
// ready.
func (st *stream) errors() <-chan error {
	if st == nil {
		return nil
	}
	return st.res.Err
}

func (st *stream) close() {
	if st != nil {
		st.cancel()
	}
}

// isEOF reports whether err is the engine closing the stream (it
// restarted), rather than failing it. A closed error channel gives nil.
func isEOF(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// newBackoff starts at 250 ms and doubles up to 30 s, or to limit if that
// is less (a retry need not wait longer than the next rescan would).
func newBackoff(limit time.Duration) *backoff.Backoff {
	return backoff.New(250*time.Millisecond, min(30*time.Second, limit))
}
