package consul

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/hashicorp/consul/api"
)

// One service's answer converts to instances that keep no spare room: a
// per-service catalog holds a thousand of them for as long as it runs,
// and appending one at a time left up to twice the room needed (16 for 10).
func TestConvertedInstancesKeepNoSpareRoom(t *testing.T) {
	for _, n := range []int{1, 3, 10, 17} {
		var entries []*api.ServiceEntry
		for i := range n {
			node := fmt.Sprintf("node-%d", i)
			entries = append(entries, &api.ServiceEntry{
				Node:    &api.Node{Node: node, Address: "10.0.0.1"},
				Service: &api.AgentService{ID: "web", Service: "web", Port: 8080 + i},
				Checks:  api.HealthChecks{{Node: node, CheckID: "web-http", Status: api.HealthPassing, ServiceID: "web"}},
			})
		}
		got := convertEntries(entries, "dc1", "")
		if len(got) != n || cap(got) != n {
			t.Errorf("%d entries: %d instances with room for %d, want %d and no more", n, len(got), cap(got), n)
		}
	}
}

// The connections that hold blocking queries keep small buffers: one per
// watched service, each waiting for minutes.
func TestHeldConnectionsKeepSmallBuffers(t *testing.T) {
	rt := holdingTransport(http.DefaultTransport.(*http.Transport), 1016)
	if rt.ReadBufferSize == 0 || rt.ReadBufferSize > 1024 || rt.WriteBufferSize == 0 || rt.WriteBufferSize > 1024 {
		t.Errorf("buffers of %d bytes to read and %d to write per connection; want at most 1 KiB each",
			rt.ReadBufferSize, rt.WriteBufferSize)
	}
	if rt.MaxIdleConnsPerHost < 1016 {
		t.Errorf("%d idle connections kept, want one per watch", rt.MaxIdleConnsPerHost)
	}
}
