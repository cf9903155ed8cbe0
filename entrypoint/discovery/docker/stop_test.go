package docker

import (
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func TestKillStops(t *testing.T) {
	started := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := started.Add(time.Hour)
	after := kill{signal: 15, sent: started.Add(time.Minute), seen: now}
	timeout := func(s int) *int { return &s }
	for _, tc := range []struct {
		name       string
		k          kill
		stopSignal string
		timeout    *int
		now        time.Time
		want       bool
	}{
		{name: "SIGTERM (docker stop)", k: after, want: true},
		{name: "SIGKILL (docker kill)", k: kill{signal: 9, sent: after.sent, seen: now}, want: true},
		{name: "SIGINT", k: kill{signal: 2, sent: after.sent, seen: now}, want: true},
		{name: "SIGQUIT", k: kill{signal: 3, sent: after.sent, seen: now}, want: true},
		{name: "SIGHUP is a reload, not a stop", k: kill{signal: 1, sent: after.sent, seen: now}},
		{name: "SIGUSR1", k: kill{signal: 10, sent: after.sent, seen: now}},
		{name: "the container's own stop signal by name", k: kill{signal: 28, sent: after.sent, seen: now}, stopSignal: "SIGWINCH", want: true},
		{name: "the container's own stop signal without SIG", k: kill{signal: 28, sent: after.sent, seen: now}, stopSignal: "winch", want: true},
		{name: "the container's own stop signal by number", k: kill{signal: 37, sent: after.sent, seen: now}, stopSignal: "37", want: true},
		{name: "another signal than the container's own", k: kill{signal: 28, sent: after.sent, seen: now}, stopSignal: "SIGUSR1"},
		{name: "a signal the event did not name", k: kill{sent: after.sent, seen: now}},
		{name: "sent before the container started again", k: kill{signal: 15, sent: started.Add(-time.Second), seen: now}},
		{name: "within the default timeout and margin", k: after, now: now.Add(19 * time.Second), want: true},
		{name: "long past the default timeout: the signal was ignored", k: after, now: now.Add(21 * time.Second)},
		{name: "within the container's own timeout", k: after, timeout: timeout(60), now: now.Add(65 * time.Second), want: true},
		{name: "a container that waits as long as it takes", k: after, timeout: timeout(-1), now: now.Add(24 * time.Hour), want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := inspected()
			c.State.StartedAt = started.Format(time.RFC3339Nano)
			c.Config.StopSignal, c.Config.StopTimeout = tc.stopSignal, tc.timeout
			at := tc.now
			if at.IsZero() {
				at = now
			}
			if got := tc.k.stops(c, at); got != tc.want {
				t.Errorf("stops = %v", got)
			}
		})
	}
}

func TestKillOf(t *testing.T) {
	m := events.Message{Type: events.ContainerEventType, Action: events.ActionKill, TimeNano: 1e18,
		Actor: events.Actor{ID: testID, Attributes: map[string]string{"signal": "15", LabelEnable: "true"}}}
	k, ok := killOf(m)
	if !ok || k.signal != 15 || !k.sent.Equal(time.Unix(0, 1e18)) || k.seen.IsZero() {
		t.Errorf("killOf = %+v, %v", k, ok)
	}
	m.Action = events.ActionDie
	if _, ok := killOf(m); ok {
		t.Error("a die event is a kill")
	}
}

func TestConvertStopping(t *testing.T) {
	c := inspected()
	c.State.StartedAt = "2026-01-01T12:00:00.123456789Z"
	now := time.Date(2026, 1, 1, 13, 0, 0, 0, time.UTC)
	r := convert(c, "", &kill{signal: 15, sent: now.Add(-time.Second), seen: now}, now)
	in := r.instance
	if in == nil || in.Status != model.StatusMaintenance || len(in.Checks) != 1 || in.Checks[0].CheckID != CheckStopping ||
		in.Checks[0].Notes != "the container is stopping (SIGTERM)" {
		t.Fatalf("instance %+v", in)
	}
	if len(r.notes) != 1 || !strings.Contains(r.notes[0].msg, "container stopping (SIGTERM); reported in maintenance") {
		t.Errorf("notes %+v", r.notes)
	}
	if r := convert(c, "", &kill{signal: 1, sent: now, seen: now}, now); r.instance.Status != model.StatusPassing || len(r.notes) != 0 {
		t.Errorf("after SIGHUP: %+v, notes %+v", r.instance, r.notes)
	}
}

func TestSignalNames(t *testing.T) {
	for s, want := range map[string]int{"SIGTERM": 15, "TERM": 15, "sigquit": 3, "9": 9, "": 0, "SIGNOPE": 0, "-1": 0} {
		if got := signalNumber(s); got != want {
			t.Errorf("signalNumber(%q) = %d", s, got)
		}
	}
	if signalName(15) != "SIGTERM" || signalName(37) != "signal 37" {
		t.Errorf("signalName: %q, %q", signalName(15), signalName(37))
	}
}
