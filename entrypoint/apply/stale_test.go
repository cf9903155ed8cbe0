package apply

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// reportingSource is a fakeSource that says how it is doing.
type reportingSource struct {
	*fakeSource
	mu sync.Mutex
	st model.SourceStatus
}

func (r *reportingSource) Status() model.SourceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

func (r *reportingSource) set(st model.SourceStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.st = st
}

// A stale source (Consul frozen past its wait) makes /readyz say so, by
// name, while the configuration keeps what it last said: degraded, still ready.
func TestAStaleSourceIsReadyButDegraded(t *testing.T) {
	c := &reportingSource{fakeSource: newSource("consul"), st: model.SourceStatus{Up: true}}
	r := newRig(t, t.TempDir(), lines{}, c)
	c.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if err := r.a.Ready(); err != nil {
		t.Fatalf("not ready before: %v", err)
	}
	c.set(model.SourceStatus{Stale: true, StaleReason: "no answer to catalog from Consul at http://127.0.0.1:8500 for 1m20s"})
	err := r.a.Ready()
	var degraded *model.Degraded
	if !errors.As(err, &degraded) || !strings.Contains(err.Error(), "consul") || !strings.Contains(err.Error(), "1m20s") {
		t.Errorf("ready error %v, want a *model.Degraded naming the stale source and why", err)
	}
	if got := r.file(t); got != "server web 10.0.0.1\n" {
		t.Errorf("file %q: the last good data must keep serving", got)
	}
	c.set(model.SourceStatus{Up: true})
	if err := r.a.Ready(); err != nil {
		t.Errorf("not ready once fresh again: %v", err)
	}
}
