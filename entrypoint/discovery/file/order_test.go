package file

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
)

// runSource runs a file source over dir that reads its order from the
// snapshot the applier saved under state, until the test ends.
func runSource(t *testing.T, dir, state string) *running {
	t.Helper()
	load := func() (model.Snapshot, error) {
		s, _, err := apply.LoadSnapshot(state, Name)
		return s, err
	}
	s, err := New(Config{Dir: dir, Rescan: DefaultRescan, Saved: load}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{Source: s, out: make(chan model.Snapshot), stop: cancel, done: make(chan struct{})}
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

func holderOf(t *testing.T, s model.Snapshot) string {
	t.Helper()
	rt, _ := routes.Build(*s.Local(), routes.Policy{})
	for _, r := range rt.Rules {
		if r.Host == "web.test" {
			return r.Service
		}
	}
	t.Fatalf("nobody holds web.test: %+v", rt)
	return ""
}

// A services file added later does not take a host from the service that
// holds it, whatever the names, and still not after a restart: the order
// of first sight is kept with the saved snapshot (issue 10, item 2).
func TestFirstSeenKeepsTheRouteAcrossRestarts(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	write(t, filepath.Join(dir, "web.yaml"), "name: web\ntags: [seamless.http.host=web.test]\ninstances: [{address: 10.0.0.1, port: 80}]\n")
	r := runSource(t, dir, state)
	r.until(t, "web:80")
	write(t, filepath.Join(dir, "aaa.yaml"), "name: aaa\ntags: [seamless.http.host=web.test]\ninstances: [{address: 10.0.0.9, port: 80}]\n")
	snap := r.until(t, "aaa:80 web:80")
	if h := holderOf(t, snap); h != "web" {
		t.Fatalf("web.test went to %s, a service added after web", h)
	}
	// As the applier keeps it: a change of its format breaks this test.
	if err := apply.SaveSnapshot(state, snap, time.Now()); err != nil {
		t.Fatal(err)
	}
	r.stop()
	<-r.done

	again := runSource(t, dir, state).until(t, "aaa:80 web:80")
	if h := holderOf(t, again); h != "web" {
		t.Fatalf("after a restart web.test went to %s", h)
	}
}
