package consul

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/discovery/guard"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// ids is the sorted IDs of service name's instances in s, without their
// node's name.
func ids(s model.Snapshot, name string) []string {
	var out []string
	for _, in := range instances(s, name) {
		out = append(out, strings.TrimPrefix(in.ID, in.Node+"/"))
	}
	slices.Sort(out)
	return out
}

// A Consul server restored from an older Raft snapshot serves that
// snapshot's catalog until it learns what came after: the chaos suite saw
// a restarted server bring back instances removed a minute earlier, and
// one replica route to them until HAProxy's checks failed them. Here a
// real Consul is restored from a snapshot taken before web-3 was removed
// and web-4 added: behind the removal guard, seamless never passes web-3
// on while the server "catches up" (web-3 removed again, web-4 back), and
// keeps web-4 meanwhile; restored a second time and left so, web-3 is
// passed on once the hold period has confirmed it.
func TestInstancesBackFromAnOlderConsulSnapshotAreWithheld(t *testing.T) {
	const hold = 10 * time.Second
	agent := testenv.Consul(t)
	c := agent.Client()
	for _, id := range []string{"web-1", "web-2", "web-3"} {
		register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: id, Service: "web", Port: 80})
	}
	var g model.Source
	// Consul answers a blocking query whose index is ahead of a restored
	// catalog only when its wait ends: short here, to see the restore soon.
	r := startWrapped(t, agent.Addr(), Config{WaitTime: 2 * time.Second}, func(s model.Source, log *slog.Logger) model.Source {
		g = guard.Wrap(s, guard.Options{Percent: 50, Hold: hold, Log: log})
		return g
	}, model.LocalCatalog)
	status := func() model.SourceStatus { return g.(model.Reporter).Status() }
	r.waitFor("web-1..3", func(s model.Snapshot) bool { return len(instances(s, "web")) == 3 })

	rc, _, err := c.Snapshot().Save(nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	deregister(t, c, "n1", "web-3")
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "web-4", Service: "web", Port: 80})
	r.waitFor("web-3 removed, web-4 added", func(s model.Snapshot) bool {
		return slices.Equal(ids(s, "web"), []string{"web-1", "web-2", "web-4"})
	})
	sentBefore := len(r.history())

	if err := c.Snapshot().Restore(nil, bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, "the restore seen: the index went backwards, web-4 held", func() bool {
		return strings.Contains(r.logged(), "index went backwards") && status().Held == 1
	})
	if st := status(); st.Withheld != 1 || !strings.Contains(r.logged(), "reports again instances it removed") {
		t.Errorf("status %+v: web-3 is not withheld, or the log does not say so:\n%s", st, r.logged())
	}
	// What the restored server learns next, as a leader would tell it.
	deregister(t, c, "n1", "web-3")
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "web-4", Service: "web", Port: 80})
	testenv.Eventually(t, wait, "nothing withheld or held once Consul caught up", func() bool {
		st := status()
		return st.Withheld == 0 && st.Held == 0
	})
	for _, s := range r.history()[sentBefore:] {
		if got := ids(s, "web"); !slices.Equal(got, []string{"web-1", "web-2", "web-4"}) {
			t.Errorf("passed on %v after the restore, want web-1, web-2 and web-4 throughout", got)
		}
	}

	// Restored again and left so: the snapshot's catalog is Consul's now.
	sentBefore = len(r.history())
	if err := c.Snapshot().Restore(nil, bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	r.waitFor("web-3 passed on after the hold", func(s model.Snapshot) bool {
		return slices.Equal(ids(s, "web"), []string{"web-1", "web-2", "web-3"})
	})
	r.mu.Lock()
	i := sentBefore + slices.IndexFunc(r.snaps[sentBefore:], func(s model.Snapshot) bool { return slices.Contains(ids(s, "web"), "web-3") })
	first, reset := r.at[i], r.snaps[i].Reset
	r.mu.Unlock()
	if reset.IsZero() || first.Before(reset.Add(hold)) {
		t.Errorf("web-3 passed on at %s, before the hold after the reset at %s ended", first.Format(time.StampMilli), reset.Format(time.StampMilli))
	}
}
