package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// /status and seamless_consul_index name the Consul index the running
// configuration was rendered from, and it follows each change: a fleet
// sees which replica lags.
func TestStatusNamesTheConsulIndexItRendered(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	r.ports["web1"] = namedBackend(t, "web1")
	registerExternal(t, c, "web1", "web", r.ports["web1"], api.HealthPassing, r.hostTag)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "web1")

	dc := func() string {
		self, err := c.Agent().Self()
		if err != nil {
			t.Fatal(err)
		}
		return self["Config"]["Datacenter"].(string)
	}()
	// consulIndex is the index in /status and in the metric, once they
	// agree and are at least min.
	consulIndex := func(step string, min uint64) uint64 {
		t.Helper()
		var got uint64
		defer func() {
			if t.Failed() {
				_, body := testenv.Get("http://" + in.status + "/status")
				var st status.Report
				_ = json.Unmarshal([]byte(body), &st)
				_, m := testenv.Get("http://" + in.status + "/metrics")
				t.Logf("/status consul_index %v; want %s at least %d; metrics:\n%s", st.ConsulIndex, dc, min, m)
			}
		}()
		testenv.Eventually(t, 10*time.Second, step+": /status and the metric name the same index, at least the change's", func() bool {
			_, body := testenv.Get("http://" + in.status + "/status")
			var st status.Report
			if json.Unmarshal([]byte(body), &st) != nil {
				return false
			}
			got = st.ConsulIndex[dc]
			return got >= min && in.metric(`seamless_consul_index{datacenter="`+dc+`"}`) == float64(got)
		})
		return got
	}
	healthIndex := func() uint64 {
		_, meta, err := c.Health().Service("web", "", false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return meta.LastIndex
	}
	first := consulIndex("start", healthIndex())

	r.ports["web2"] = namedBackend(t, "web2")
	registerExternal(t, c, "web2", "web", r.ports["web2"], api.HealthPassing, r.hostTag)
	change := healthIndex()
	if change <= first {
		t.Fatalf("the registration's index %d is not above the first %d: the scenario did not happen", change, first)
	}
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	second := consulIndex("web2 added", change)
	t.Logf("consul index %d at start, %d after web2's registration at %d", first, second, change)
}
