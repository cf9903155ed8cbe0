package docker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

const wait = 30 * time.Second

// summary is the snapshot's instances whose container name starts with
// prefix, as "api:9090 web:8080 web:8081(critical)": other tests' and
// other users' containers on the same engine are left out.
func summary(s model.Snapshot, prefix string) string {
	var parts []string
	for _, in := range s.Local().Instances {
		if !strings.HasPrefix(in.Meta[MetaContainer], prefix) {
			continue
		}
		p := fmt.Sprintf("%s:%d", strings.TrimPrefix(in.Name, prefix), in.Port)
		if in.Status != model.StatusPassing {
			p += "(" + in.Status + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// find returns the instance of the container named name in s, or nil.
func find(s model.Snapshot, name string) *model.Instance {
	for _, in := range s.Local().Instances {
		if in.Meta[MetaContainer] == name {
			return &in
		}
	}
	return nil
}

// running is a Source in Run.
type running struct {
	*Source
	out    chan model.Snapshot
	logs   *testenv.Records
	prefix string
	stop   context.CancelFunc
	done   chan struct{}
}

// start runs a source of cfg; summaries only show containers named with
// prefix.
func start(t *testing.T, cfg Config, prefix string) *running {
	t.Helper()
	logs := &testenv.Records{}
	s, err := New(cfg, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{Source: s, out: make(chan model.Snapshot), logs: logs, prefix: prefix, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		s.Run(ctx, r.out)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
		if t.Failed() {
			t.Logf("source log:\n%s", logs)
		}
	})
	return r
}

// next returns the next snapshot.
func (r *running) next(t *testing.T) model.Snapshot {
	t.Helper()
	select {
	case s := <-r.out:
		return s
	case <-time.After(wait):
		t.Fatalf("no snapshot within %s", wait)
		return model.Snapshot{}
	}
}

// until reads snapshots until one summarises as want.
func (r *running) until(t *testing.T, want string) model.Snapshot {
	t.Helper()
	deadline := time.After(wait)
	last := "(none)"
	for {
		select {
		case s := <-r.out:
			if last = summary(s, r.prefix); last == want {
				return s
			}
		case <-deadline:
			t.Fatalf("no snapshot %q within %s; the last was %q", want, wait, last)
		}
	}
}

// quiet fails if a snapshot is waiting.
func (r *running) quiet(t *testing.T, why string) {
	t.Helper()
	select {
	case s := <-r.out:
		t.Fatalf("a snapshot %s: %q", why, summary(s, r.prefix))
	default:
	}
}
