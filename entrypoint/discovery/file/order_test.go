package file

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
)

// runSource runs a file source over dir that reads its order from saved,
// until the test ends.
func runSource(t *testing.T, dir, saved string) *running {
	t.Helper()
	s, err := New(Config{Dir: dir, Rescan: DefaultRescan, Saved: saved}, slog.New(slog.DiscardHandler))
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

// save writes a snapshot as the applier keeps it in SEAMLESS_STATE_DIR
// (apply.saveSnapshot): {"source", "saved_at", "results": [{"query",
// "result"}]}.
func save(t *testing.T, path string, s model.Snapshot) {
	t.Helper()
	type result struct {
		Query  model.Query  `json:"query"`
		Result model.Result `json:"result"`
	}
	v := struct {
		Source  string   `json:"source"`
		Results []result `json:"results"`
	}{Source: s.Source}
	for q, r := range s.Results {
		v.Results = append(v.Results, result{q, r})
	}
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, path, string(data))
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
	dir, saved := t.TempDir(), filepath.Join(t.TempDir(), "sources", "file.json")
	write(t, filepath.Join(dir, "web.yaml"), "name: web\ntags: [seamless.http.host=web.test]\ninstances: [{address: 10.0.0.1, port: 80}]\n")
	r := runSource(t, dir, saved)
	r.until(t, "web:80")
	write(t, filepath.Join(dir, "aaa.yaml"), "name: aaa\ntags: [seamless.http.host=web.test]\ninstances: [{address: 10.0.0.9, port: 80}]\n")
	snap := r.until(t, "aaa:80 web:80")
	if h := holderOf(t, snap); h != "web" {
		t.Fatalf("web.test went to %s, a service added after web", h)
	}
	save(t, saved, snap)
	r.stop()
	<-r.done

	again := runSource(t, dir, saved).until(t, "aaa:80 web:80")
	if h := holderOf(t, again); h != "web" {
		t.Fatalf("after a restart web.test went to %s", h)
	}
}
