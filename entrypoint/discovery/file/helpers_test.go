package file

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

const wait = 10 * time.Second

// svc returns a services file declaring name with one instance per port
// on 10.0.0.1.
func svc(name string, ports ...int) string {
	s := "name: " + name + "\ninstances:\n"
	for _, p := range ports {
		s += fmt.Sprintf("  - address: 10.0.0.1\n    port: %d\n", p)
	}
	return s
}

// summary is a snapshot as "api:81 web:80,82" (services and their ports).
func summary(s model.Snapshot) string {
	ports := map[string][]string{}
	var names []string
	for _, in := range s.Local().Instances {
		if ports[in.Name] == nil {
			names = append(names, in.Name)
		}
		ports[in.Name] = append(ports[in.Name], fmt.Sprint(in.Port))
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, n+":"+strings.Join(ports[n], ","))
	}
	return strings.Join(parts, " ")
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAtomic writes as editors and config tools do: a temporary file in
// the same directory, renamed over the target.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	write(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// running is a Source in Run.
type running struct {
	*Source
	out  chan model.Snapshot
	logs *testenv.Records
	stop context.CancelFunc
	done chan struct{}
}

func start(t *testing.T, dir string, rescan time.Duration) *running {
	t.Helper()
	logs := &testenv.Records{}
	s, err := New(Config{Dir: dir, Rescan: rescan}, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{Source: s, out: make(chan model.Snapshot), logs: logs, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		s.Run(ctx, r.out)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
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
	var last string
	for {
		select {
		case s := <-r.out:
			if last = summary(s); last == want {
				return s
			}
		case <-deadline:
			t.Fatalf("no snapshot %q within %s; the last was %q", want, wait, last)
		}
	}
}
