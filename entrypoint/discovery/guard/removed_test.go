package guard

import (
	"strconv"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// What the guard remembers of removals is bounded in count and in time:
// memory stays flat under churn of instance names.
func TestRemovalsAreForgottenByCountAndAge(t *testing.T) {
	var r removals
	now := time.Unix(1e9, 0)
	k := func(i int) key { return key{model.LocalCatalog, "web", strconv.Itoa(i)} }
	for i := range 3 * rememberRemovals {
		r.add(k(i), now)
	}
	if r.len() != rememberRemovals || len(r.order)-r.head != rememberRemovals || cap(r.order) > 4*rememberRemovals {
		t.Errorf("after %d removals: %d remembered, %d in order (cap %d); want %d, bounded",
			3*rememberRemovals, r.len(), len(r.order)-r.head, cap(r.order), rememberRemovals)
	}
	if r.has(k(0), now) || !r.has(k(3*rememberRemovals-1), now) {
		t.Error("the oldest must be forgotten first, the newest kept")
	}

	// Recorded again: the newer time counts, and the older entry does not
	// forget it.
	newest := k(3*rememberRemovals - 1)
	r.add(newest, now.Add(rememberFor/2))
	if !r.has(newest, now.Add(rememberFor)) {
		t.Error("a removal recorded again is remembered from its newer time")
	}
	if r.has(k(3*rememberRemovals-2), now.Add(rememberFor)) {
		t.Error("a removal older than rememberFor is still remembered")
	}
	r.add(k(-1), now.Add(rememberFor))
	if r.len() != 2 {
		t.Errorf("%d remembered after the older ones aged out, want 2", r.len())
	}
}
