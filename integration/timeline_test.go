//go:build docker

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/integration/compose"
)

// timeline puts what happened during a compose test in one order: the
// test's own marks, the engine's kill, die and start of the project's
// containers, and seamless's applies and reloads. A loss in a scale step
// can then be read against when a replica was told to stop, when it died
// and when seamless applied its removal; the logs of a removed replica
// are gone with it, the engine's events are not.
type timeline struct {
	t     *testing.T
	c     *client.Client
	p     *compose.Project
	begin time.Time
	marks []event
}

type event struct {
	at   time.Time
	what string
}

func newTimeline(t *testing.T, c *client.Client, p *compose.Project) *timeline {
	return &timeline{t: t, c: c, p: p, begin: time.Now()}
}

func (tl *timeline) mark(at time.Time, format string, args ...any) {
	tl.marks = append(tl.marks, event{at, "test: " + fmt.Sprintf(format, args...)})
}

// log writes the timeline as one block.
func (tl *timeline) log() {
	tl.t.Helper()
	all := slices.Clone(tl.marks)
	all = append(all, tl.engine()...)
	all = append(all, tl.seamless()...)
	slices.SortStableFunc(all, func(a, b event) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for _, e := range all {
		fmt.Fprintf(&b, "\n  %s  +%6.3fs  %s", clock(e.at), e.at.Sub(tl.begin).Seconds(), e.what)
	}
	tl.t.Logf("timeline of %s:%s", tl.p.Name, b.String())
}

// engine replays the project's container events since the beginning.
func (tl *timeline) engine() []event {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := tl.c.Events(ctx, client.EventsListOptions{
		Since: strconv.FormatInt(tl.begin.Add(-time.Second).Unix(), 10),
		Until: strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10),
		Filters: make(client.Filters).
			Add("type", "container").
			Add("event", "start", "kill", "die").
			Add("label", "com.docker.compose.project="+tl.p.Name),
	})
	var out []event
	for {
		select {
		case m, ok := <-res.Messages:
			if !ok {
				return out
			}
			what := fmt.Sprintf("engine: %s %s", m.Actor.Attributes["name"], m.Action)
			if s := m.Actor.Attributes["signal"]; s != "" {
				what += " signal " + s
			}
			if c := m.Actor.Attributes["exitCode"]; c != "" {
				what += " exit " + c
			}
			out = append(out, event{time.Unix(0, m.TimeNano), what})
		case err := <-res.Err:
			if err != nil && !errors.Is(err, io.EOF) {
				out = append(out, event{time.Now(), "engine: events: " + err.Error()})
			}
			return out
		}
	}
}

var (
	logTime  = regexp.MustCompile(`\btime=(\S+)`)
	logField = regexp.MustCompile(`\b(msg|change|duration|err|reason)=("(?:[^"\\]|\\.)*"|\S+)`)
)

// seamless picks its applies and reloads out of its log.
func (tl *timeline) seamless() []event {
	out, err := tl.p.Run("logs", "--no-color", "seamless")
	if err != nil {
		return []event{{time.Now(), "seamless: logs: " + err.Error()}}
	}
	var evs []event
	for line := range strings.Lines(out) {
		if !strings.Contains(line, "component=apply") && !strings.Contains(line, "component=reload") {
			continue
		}
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		var fields []string
		for _, f := range logField.FindAllStringSubmatch(line, -1) {
			fields = append(fields, f[1]+"="+f[2])
		}
		evs = append(evs, event{at, "seamless: " + strings.Join(fields, " ")})
	}
	return evs
}
