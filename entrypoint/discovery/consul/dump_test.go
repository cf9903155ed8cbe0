package consul

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// synthDump is a node dump of nodes nodes with perNode services each, with
// a node check and a check per service, as Consul writes one.
func synthDump(nodes, perNode int) string {
	var b strings.Builder
	b.WriteString("[")
	for n := range nodes {
		if n > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"ID":"%08d-0000-0000-0000-000000000000","Node":"node-%d","Address":"10.0.%d.%d","Datacenter":"dc1",`+
			`"TaggedAddresses":{"lan":"10.0.%d.%d"},"Meta":{"consul-network-segment":""},"Services":[`, n, n, n/250, n%250, n/250, n%250)
		for s := range perNode {
			if s > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"ID":"svc-%d-%d","Service":"svc-%d","Tags":["v1","http"],"Address":"","Port":%d,`+
				`"Meta":{"version":"1.2.3"},"Weights":{"Passing":1,"Warning":1},"EnableTagOverride":false,"CreateIndex":%d,"ModifyIndex":%d}`,
				n, s, s, 20000+n, 100+n, 100+n)
		}
		b.WriteString(`],"Checks":[{"Node":"node-` + fmt.Sprint(n) + `","CheckID":"serfHealth","Name":"Serf Health Status","Status":"passing",` +
			`"Notes":"","Output":"Agent alive and reachable","ServiceID":"","ServiceName":"","Type":"","CreateIndex":10,"ModifyIndex":10}`)
		for s := range perNode {
			fmt.Fprintf(&b, `,{"Node":"node-%d","CheckID":"service:svc-%d-%d","Name":"Service 'svc-%d' check","Status":"passing",`+
				`"Notes":"","Output":"HTTP GET http://10.0.0.1:%d/health: 200 OK","ServiceID":"svc-%d-%d","ServiceName":"svc-%d","Type":"http","CreateIndex":12,"ModifyIndex":12}`,
				n, n, s, s, 20000+n, n, s, s)
		}
		b.WriteString(`]}`)
	}
	b.WriteString("]")
	return b.String()
}

// The node dump of a large catalog is decoded as it arrives. The API
// client's decoder read it whole into a buffer it kept doubling: about
// twice the text in buffers, the last of them as large as the text or up
// to twice that. Both decode the same nodes, so reading as it arrives
// must save at least the text's size.
func TestTheNodeDumpIsDecodedAsItArrives(t *testing.T) {
	body := synthDump(2000, 10)
	var encodings []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != nodeDumpPath {
			http.NotFound(w, r)
			return
		}
		encodings = append(encodings, r.Header.Get("Accept-Encoding"))
		w.Header().Set("X-Consul-Index", "42")
		w.Header().Set("X-Consul-LastContact", "0")
		w.Header().Set("X-Consul-KnownLeader", "true")
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	s, err := New(Config{API: &api.Config{Address: srv.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	allocated := func(read func() ([]*nodeInfo, *api.QueryMeta)) ([]*nodeInfo, *api.QueryMeta, uint64) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		dump, meta := read()
		runtime.ReadMemStats(&after)
		return dump, meta, after.TotalAlloc - before.TotalAlloc
	}
	opts := (&api.QueryOptions{}).WithContext(context.Background())
	dump, meta, streamed := allocated(func() ([]*nodeInfo, *api.QueryMeta) {
		dump, meta, err := s.readDump(opts)
		if err != nil {
			t.Fatal(err)
		}
		return dump, meta
	})
	want, wantMeta, whole := allocated(func() ([]*nodeInfo, *api.QueryMeta) {
		var dump []*nodeInfo
		meta, err := s.client.Raw().Query(nodeDumpPath, &dump, opts)
		if err != nil {
			t.Fatal(err)
		}
		return dump, meta
	})
	t.Logf("a dump of %.1f MiB: %.1f MiB allocated to read it as it arrives, %.1f MiB through the API client",
		float64(len(body))/(1<<20), float64(streamed)/(1<<20), float64(whole)/(1<<20))
	if !reflect.DeepEqual(dump, want) {
		t.Errorf("decoded as it arrives, the dump differs from the API client's decoding")
	}
	if meta.LastIndex != wantMeta.LastIndex || meta.ResultsFilteredByACLs != wantMeta.ResultsFilteredByACLs {
		t.Errorf("meta %+v, the API client's %+v", *meta, *wantMeta)
	}
	// The agent is on this machine: the dump is not compressed.
	if len(encodings) == 0 || encodings[0] != "identity" {
		t.Errorf("the dump from an agent on 127.0.0.1 was asked for with Accept-Encoding %q", encodings)
	}
	if streamed+uint64(len(body)) > whole {
		t.Errorf("reading a dump of %d bytes as it arrives allocated %d bytes, through the API client %d", len(body), streamed, whole)
	}
}

func TestDecodeDumpRefusesWhatIsNoList(t *testing.T) {
	for _, tt := range []struct{ body, err string }{
		{`null`, ""},
		{`[]`, ""},
		{`[null,{"Node":"n1"}]`, ""},
		{`{"Node":"n1"}`, "the node dump is not a list: it begins with {"},
		{`[{"Node":"n1"}`, "EOF"},
		{`[{"Node":1}]`, "cannot unmarshal number"},
		{``, "EOF"},
	} {
		dump, err := decodeDump(strings.NewReader(tt.body))
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%s: %v", tt.body, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%s: error %v, want one with %q", tt.body, err, tt.err)
		case tt.body == `[null,{"Node":"n1"}]` && (len(dump) != 2 || dump[0] != nil || dump[1].Node != "n1"):
			t.Errorf("%s: %+v", tt.body, dump)
		}
	}
}

func TestTheDumpIsCompressedOnlyFromAnotherMachine(t *testing.T) {
	for _, tt := range []struct {
		hosts []string
		local bool
	}{
		{[]string{"127.0.0.1:8500"}, true},
		{[]string{"127.0.0.53:8500"}, true},
		{[]string{"[::1]:8500"}, true},
		{[]string{"localhost:8500"}, true},
		{[]string{"LOCALHOST"}, true},
		{[]string{"/run/consul/http.sock"}, true},
		{[]string{"unix:///run/consul/http.sock"}, true},
		{[]string{"127.0.0.1:8500", "127.0.0.1:8501"}, true},
		{[]string{"10.0.0.7:8500"}, false},
		{[]string{"consul.service.consul:8500"}, false},
		{[]string{"127.0.0.1:8500", "10.0.0.7:8500"}, false},
		{nil, false},
	} {
		if got := onThisMachine(tt.hosts); got != tt.local {
			t.Errorf("onThisMachine(%q) = %v, want %v", tt.hosts, got, tt.local)
		}
	}
}
