package routes

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// svc is a routed service with n instances.
func svc(name string, n int) []model.Instance {
	var out []model.Instance
	for i := 1; i <= n; i++ {
		out = append(out, inst(name, fmt.Sprintf("%s-%d", name, i), fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), 8080,
			"seamless.http.host="+name+".example"))
	}
	return out
}

// Rendering the same state twice without a commit gives the same bytes,
// whatever was rendered in between: only a commit moves the table.
func TestRenderingWithoutACommitMovesNothing(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := mustNew(t, slotOpts(&now))
	render(t, r, catalog(webs(1)...)) // committed: web1 in s1
	a := catalog(webs(2)...)
	b := catalog(append(webs(1), webs(3)[2])...)
	first, firstPlan := renderPlan(t, r, a)
	renderPlan(t, r, b) // refused by HAProxy, say: never committed
	second, secondPlan := renderPlan(t, r, a)
	if !bytes.Equal(first.Config, second.Config) {
		t.Errorf("the same state rendered differently after an uncommitted rendering:\nfirst %s\nsecond %s", slotStates(first), slotStates(second))
	}
	if !equalPlans(firstPlan, secondPlan) {
		t.Errorf("the same state proposed different tables: %v, then %v", firstPlan, secondPlan)
	}
}

// Services that come and go leave nothing behind: once a backend is no
// longer rendered, its slots and drain clocks are dropped at the next
// commit.
func TestChurnOfServiceNamesLeavesOnlyTheLiveBackends(t *testing.T) {
	const n = 5000
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	o := slotOpts(&now)
	r := mustNew(t, o)
	name := func(i int) string { return fmt.Sprintf("churn%d", i) }
	for i := range n {
		// churn<i> arrives with two instances; churn<i-1> loses one, which
		// drains; churn<i-2>'s drain has ended; churn<i-3> is gone.
		insts := svc(name(i), 2)
		for back := 1; back <= 2 && back <= i; back++ {
			insts = append(insts, svc(name(i-back), 1)...)
		}
		render(t, r, catalog(insts...))
		if got := r.table.Len(); got > 3 {
			t.Fatalf("after churn%d the table holds %d backends, more than the 3 rendered", i, got)
		}
		now = now.Add(o.DrainTimeout)
	}
	// The last service alone, every drain ended.
	render(t, r, catalog(svc(name(n-1), 2)...))
	draining := 0
	for _, slots := range r.table.committed().all() {
		for _, s := range slots {
			if s.draining() {
				draining++
			}
		}
	}
	if got := r.table.Len(); got != 1 || draining != 0 {
		t.Errorf("after %d services came and went the table holds %d backends and %d drain clocks; want 1 backend (the live one) and none", n, got, draining)
	}
}

// A service that vanished and came back starts from fresh slots: the same
// configuration as a seamless that never saw it leave.
func TestAServiceThatCameBackRendersAsNew(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	o := slotOpts(&now)
	o.Table = NewSlotTable()
	r := mustNew(t, o)
	both := catalog(append(webs(2), svc("api", 3)...)...)
	render(t, r, both)
	render(t, r, catalog(append(webs(2), svc("api", 3)[1:]...)...)) // api-1 drains
	render(t, r, catalog(webs(2)...))                               // api is gone
	if got := r.table.Len(); got != 1 {
		t.Errorf("api gone: the table holds %d backends, want 1", got)
	}
	now = now.Add(time.Hour)
	back := render(t, r, both)
	fresh := mustNew(t, slotOpts(&now))
	if want := render(t, fresh, both); !bytes.Equal(back.Config, want.Config) {
		t.Errorf("api came back as %s; a fresh start renders %s", slotStates(back), slotStates(want))
	}
	haproxyCheck(t, back.Config)
}
