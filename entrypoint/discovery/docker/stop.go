package docker

import (
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
)

// A container being stopped keeps running while it drains (`docker stop`
// sends its stop signal, waits up to its stop timeout, then kills it), and
// a re-list at that moment still finds it running. The engine's kill event
// says which signal it sent: a container that received a stop signal is
// reported in maintenance from then on, so that HAProxy sends it no new
// request while it finishes those in flight, until it exits and leaves
// the list. A lossless `docker compose up --scale web=1` needs this.

// defaultStopTimeout is the engine's stop timeout when the container sets
// none (`docker stop -t`, Compose's stop_grace_period).
const defaultStopTimeout = 10 * time.Second

// stopMargin is how much longer than its stop timeout a container may run
// after a stop signal and still count as stopping. One that runs on
// ignored the signal (`docker kill -s TERM` to a process that handles it)
// and is routed again from the next re-list.
const stopMargin = 10 * time.Second

// kill is a signal the engine sent a container.
type kill struct {
	signal int       // its number; 0 when the event did not say
	sent   time.Time // by the engine's clock, to compare with StartedAt
	seen   time.Time // by this process's clock, for the timeout
}

// killOf returns the signal of a container's kill event.
func killOf(m events.Message) (kill, bool) {
	if m.Type != events.ContainerEventType || m.Action != events.ActionKill {
		return kill{}, false
	}
	sig, _ := strconv.Atoi(m.Actor.Attributes["signal"])
	return kill{signal: sig, sent: time.Unix(0, m.TimeNano), seen: time.Now()}, true
}

// stops reports whether k stops c at now: it was sent to the container's
// current run, it is a signal that ends a process (SIGTERM, SIGINT,
// SIGQUIT, SIGKILL or the container's own stop signal), and the stop
// timeout has not long passed.
func (k kill) stops(c container.InspectResponse, now time.Time) bool {
	if started, err := time.Parse(time.RFC3339Nano, c.State.StartedAt); err == nil && !k.sent.IsZero() && !k.sent.After(started) {
		return false // sent before the container (re)started
	}
	switch k.signal {
	case 2, 3, 9, 15: // SIGINT, SIGQUIT, SIGKILL, SIGTERM
	default:
		if k.signal == 0 || k.signal != signalNumber(c.Config.StopSignal) {
			return false
		}
	}
	timeout := defaultStopTimeout
	if t := c.Config.StopTimeout; t != nil {
		if *t < 0 { // waits for as long as it takes
			return true
		}
		timeout = time.Duration(*t) * time.Second
	}
	return now.Sub(k.seen) <= timeout+stopMargin
}

// signals are the names of the signals a stop signal is usually given by,
// with their Linux numbers.
var signals = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "WINCH": 28, "PWR": 30,
}

// signalNumber reads a stop signal as Docker takes it: "SIGQUIT", "QUIT"
// or "3". It returns 0 for anything else.
func signalNumber(s string) int {
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return n
	}
	return signals[strings.TrimPrefix(strings.ToUpper(s), "SIG")]
}

// signalName is "SIGTERM" for 15, "signal 37" for a number without a name.
func signalName(n int) string {
	for name, num := range signals {
		if num == n {
			return "SIG" + name
		}
	}
	return "signal " + strconv.Itoa(n)
}
