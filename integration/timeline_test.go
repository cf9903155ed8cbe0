//go:build docker

package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/integration/compose"
)

// timeline puts what happened during a compose test in one order: the
// test's own marks, the engine's kill, die and start of the project's
// containers, seamless's applies, reloads and warnings, the replicas'
// own log (registered, deregistered, drained) and Consul's warnings. A
// loss in a scale step can then be read against when a replica was told
// to stop, when it left the catalog, when it died and when seamless
// applied its removal.
type timeline struct {
	t     *testing.T
	c     *client.Client
	p     *compose.Project
	begin time.Time
	marks []event

	// The replicas' logs, followed from when follow first sees each:
	// a removed replica's log is gone with it.
	mu       sync.Mutex
	followed map[string]bool
	replicas []event
	ctx      context.Context // ends with the test
	logged   bool
}

type event struct {
	at   time.Time
	what string
}

func newTimeline(t *testing.T, c *client.Client, p *compose.Project) *timeline {
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	tl := &timeline{t: t, c: c, p: p, begin: time.Now(), followed: map[string]bool{}, ctx: ctx}
	// A test that stops at a fatal error still shows what happened.
	t.Cleanup(func() {
		if t.Failed() && !tl.logged {
			tl.log()
		}
	})
	return tl
}

// follow starts following the log of each of service's containers it
// has not seen yet, until the container is removed or the test ends.
func (tl *timeline) follow(service string) {
	ctx, cancel := context.WithTimeout(tl.ctx, 20*time.Second)
	defer cancel()
	res, err := tl.c.ContainerList(ctx, client.ContainerListOptions{
		All: true,
		Filters: make(client.Filters).
			Add("label", "com.docker.compose.project="+tl.p.Name).
			Add("label", "com.docker.compose.service="+service),
	})
	if err != nil {
		tl.add(event{time.Now(), service + ": list: " + err.Error()})
		return
	}
	for _, ct := range res.Items {
		tl.mu.Lock()
		seen := tl.followed[ct.ID]
		tl.followed[ct.ID] = true
		tl.mu.Unlock()
		if seen {
			continue
		}
		r, err := tl.c.ContainerLogs(tl.ctx, ct.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Follow: true})
		if err != nil {
			tl.add(event{time.Now(), service + " " + ct.ID[:12] + ": logs: " + err.Error()})
			continue
		}
		go func() {
			defer r.Close()
			// The stream's frame headers stay in the lines; only the
			// fields are read out of them.
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64*1024), 1<<20)
			for sc.Scan() {
				if e, ok := slogEvent(sc.Text()); ok {
					tl.add(event{e.at, service + " " + ct.ID[:12] + ": " + e.what})
				}
			}
			if err := sc.Err(); err != nil && tl.ctx.Err() == nil {
				tl.add(event{time.Now(), service + " " + ct.ID[:12] + ": log: " + err.Error()})
			}
		}()
	}
}

func (tl *timeline) add(e event) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.replicas = append(tl.replicas, e)
}

func (tl *timeline) mark(at time.Time, format string, args ...any) {
	tl.marks = append(tl.marks, event{at, "test: " + fmt.Sprintf(format, args...)})
}

// log writes the timeline as one block.
func (tl *timeline) log() {
	tl.t.Helper()
	tl.logged = true
	all := slices.Clone(tl.marks)
	all = append(all, tl.engine()...)
	all = append(all, tl.seamless()...)
	all = append(all, tl.consul()...)
	tl.mu.Lock()
	all = append(all, tl.replicas...)
	tl.mu.Unlock()
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
	logLevel = regexp.MustCompile(`\blevel=(WARN|ERROR)\b`)
	logField = regexp.MustCompile(`\b(msg|change|duration|err|reason|why|after)=("(?:[^"\\]|\\.)*"|\S+)`)
)

// seamless picks its applies, reloads, warnings and errors out of its
// log.
func (tl *timeline) seamless() []event {
	out, err := tl.p.Run("logs", "--no-color", "seamless")
	if err != nil {
		return []event{{time.Now(), "seamless: logs: " + err.Error()}}
	}
	var evs []event
	for line := range strings.Lines(out) {
		if !strings.Contains(line, "component=apply") && !strings.Contains(line, "component=reload") &&
			!strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			continue
		}
		if e, ok := slogEvent(line); ok {
			evs = append(evs, event{e.at, "seamless: " + e.what})
		}
	}
	return evs
}

// slogEvent reads a log line of seamless or the demo backend: its time
// and the fields worth a timeline.
func slogEvent(line string) (event, bool) {
	m := logTime.FindStringSubmatch(line)
	if m == nil {
		return event{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		return event{}, false
	}
	var fields []string
	if m := logLevel.FindStringSubmatch(line); m != nil {
		fields = append(fields, m[1]) // INFO and DEBUG go unmarked
	}
	for _, f := range logField.FindAllStringSubmatch(line, -1) {
		fields = append(fields, f[1]+"="+f[2])
	}
	return event{at, strings.Join(fields, " ")}, true
}

// consulLine is a line of the Consul agent's log (its warnings and
// errors: the compose file runs it with -log-level warn).
var consulLine = regexp.MustCompile(`^(?:\S+\s+\|\s+)?(\d{4}-\d\d-\d\dT\S+)\s+\[(\w+)\]\s+(.*)$`)

// consul picks the Consul agent's warnings and errors out of its log,
// when the project has an agent.
func (tl *timeline) consul() []event {
	out, err := tl.p.Run("logs", "--no-color", "consul")
	if err != nil {
		return nil // no such service in this project
	}
	var evs []event
	for line := range strings.Lines(out) {
		m := consulLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", m[1])
		if err != nil {
			continue
		}
		evs = append(evs, event{at, "consul: [" + m[2] + "] " + m[3]})
	}
	return evs
}
