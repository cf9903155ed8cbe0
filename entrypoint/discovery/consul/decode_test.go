package consul

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"testing"
	"unsafe"

	"github.com/hashicorp/consul/api"
)

// consulHealth is /v1/health/service/<name> as Consul 1.14 answers it for
// n instances of a service on n nodes: every field the API has, set as
// an agent sets them (tagged addresses, segment meta, weights, the
// serfHealth check and a service check with its definition).
func consulHealth(name string, n int) []byte {
	var entries []*api.ServiceEntry
	for i := range n {
		node := fmt.Sprintf("node-%03d", i)
		addr := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		entries = append(entries, &api.ServiceEntry{
			Node: &api.Node{ID: fmt.Sprintf("2b2c3c64-0a5e-4f4a-9d0c-%012d", i), Node: node, Address: addr, Datacenter: "dc1",
				TaggedAddresses: map[string]string{"lan": addr, "lan_ipv4": addr, "wan": addr, "wan_ipv4": addr},
				Meta:            map[string]string{"consul-network-segment": ""}, CreateIndex: 12, ModifyIndex: 14},
			Service: &api.AgentService{Kind: "", ID: fmt.Sprintf("%s-%d", name, i), Service: name,
				Tags: []string{"seamless.http.host=" + name + ".example.com", "v1"}, Meta: map[string]string{"version": "1.2.3"},
				Port: 20000 + i, Address: "127.0.0.1", Weights: api.AgentWeights{Passing: 1, Warning: 1},
				TaggedAddresses: map[string]api.ServiceAddress{"lan_ipv4": {Address: "127.0.0.1", Port: 20000 + i}},
				Proxy:           &api.AgentServiceConnectProxyConfig{MeshGateway: api.MeshGatewayConfig{}, Expose: api.ExposeConfig{}},
				Connect:         &api.AgentServiceConnect{}, CreateIndex: uint64(100 + i), ModifyIndex: uint64(200 + i), Datacenter: "dc1"},
			Checks: api.HealthChecks{
				{Node: node, CheckID: "serfHealth", Name: "Serf Health Status", Status: api.HealthPassing,
					Output: "Agent alive and reachable", Type: "", CreateIndex: 12, ModifyIndex: 12},
				{Node: node, CheckID: "service:" + name + "-" + fmt.Sprint(i), Name: "Service '" + name + "' check",
					Status: api.HealthPassing, Output: "HTTP GET http://127.0.0.1:20000/health: 200 OK Output: ok",
					ServiceID: fmt.Sprintf("%s-%d", name, i), ServiceName: name, Type: "http",
					ServiceTags: []string{"seamless.http.host=" + name + ".example.com", "v1"},
					Definition:  api.HealthCheckDefinition{HTTP: "http://127.0.0.1:20000/health", Method: "GET", IntervalDuration: 10e9, TimeoutDuration: 1e9}, CreateIndex: 300, ModifyIndex: 301},
			},
		})
	}
	b, err := json.Marshal(entries)
	if err != nil {
		panic(err)
	}
	return b
}

// healthReader is a per-service catalog's reader of one service, against
// a stub Consul that answers body to every health query.
func healthReader(t testing.TB, body []byte, tag string) (*splitCatalog, *sub) {
	t.Helper()
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Consul-Index", "42")
		w.Header().Set("X-Consul-KnownLeader", "true")
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	t.Setenv("CONSUL_HTTP_ADDR", addr)
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	src, err := New(Config{TagFilter: tag}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return &splitCatalog{s: src}, &sub{kind: partHealth, name: "web"}
}

// An answer whose index did not move (a wait that ran out: about 25 per
// change of a thousand held queries at 1.5 s apart) is not decoded: it
// cost about 140 KiB through api.ServiceEntry, decoded whole every time.
func TestAnIdleHealthAnswerIsNotDecoded(t *testing.T) {
	body := consulHealth("web", 10)
	c, sb := healthReader(t, body, "")
	ctx := context.Background()
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, index, err := c.read(ctx, sb, 42, 0, nil, 0); err != nil || index != 42 {
				b.Fatalf("read: %d %v", index, err)
			}
		}
	})
	t.Logf("an idle answer of %d bytes: %d bytes in %d allocations", len(body), res.AllocedBytesPerOp(), res.AllocsPerOp())
	// What is left: the API's JSON decoder holds the body whole (it grows
	// its buffer to twice the body), and a copy of the body.
	if n := res.AllocedBytesPerOp(); n > int64(6*len(body)) {
		t.Errorf("an idle answer of %d bytes allocated %d bytes; want at most %d", len(body), n, 6*len(body))
	}
}

// A seeded query's first answer at or below the seed's index (quietTo)
// is its wait running out: not decoded. Above it, or with no seed, it is.
func TestAQuietSeededAnswerIsNotDecoded(t *testing.T) {
	c, sb := healthReader(t, consulHealth("web", 10), "") // answers at 42
	ctx := context.Background()
	for _, tc := range []struct {
		quietTo uint64
		decoded bool
	}{{50, false}, {42, false}, {41, true}, {0, true}} {
		before := c.decoded.Load()
		ev, index, err := c.read(ctx, sb, 50, 0, nil, tc.quietTo)
		if err != nil || index != 42 {
			t.Fatalf("read: %d %v", index, err)
		}
		if got := ev.entries != nil; got != tc.decoded || c.decoded.Load()-before != map[bool]uint64{true: 1}[tc.decoded] {
			t.Errorf("an answer at 42, quiet to %d: decoded %v (%d entries, counted %d), want %v",
				tc.quietTo, got, len(ev.entries), c.decoded.Load()-before, tc.decoded)
		}
	}
}

// Decoded straight into healthEntry, an answer converts to the instances
// the API's types gave, every field; with a tag filter (which the raw
// query cannot send) it goes through the API as before.
func TestHealthDecodedLeanEqualsTheAPIs(t *testing.T) {
	body := consulHealth("web", 10)
	var viaAPI []*api.ServiceEntry
	if err := json.Unmarshal(body, &viaAPI); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"", "v1"} {
		want := convertEntries(entriesFromAPI(viaAPI), "dc1", tag)
		c, sb := healthReader(t, body, tag)
		ev, _, err := c.read(context.Background(), sb, 41, 0, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := convertEntries(ev.entries, "dc1", tag)
		if len(got) != 10 || !reflect.DeepEqual(got, want) {
			t.Errorf("tag %q: decoded lean:\n%+v\nthrough the API:\n%+v", tag, got, want)
		}
		if got[0].Weight != 1 || got[0].Registered != 100 || got[0].NodeTaggedAddresses["wan"] == "" ||
			got[0].TaggedAddresses["lan_ipv4"] != "127.0.0.1:20000" || len(got[0].Checks) != 1 || len(got[0].NodeChecks) != 1 || got[0].Meta["version"] != "1.2.3" {
			t.Errorf("tag %q: fields lost: %+v", tag, got[0])
		}
	}
}

// A moved answer's cost: read and converted, for a service of 10
// instances (go test -run - -bench ReadingAMovedHealthAnswer -benchmem).
func BenchmarkReadingAMovedHealthAnswer(b *testing.B) {
	body := consulHealth("web", 10)
	c, sb := healthReader(b, body, "")
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		ev, _, err := c.read(ctx, sb, 41, 0, nil, 0)
		if err != nil {
			b.Fatal(err)
		}
		if got := convertEntries(ev.entries, "dc1", ""); len(got) != 10 {
			b.Fatalf("%d instances converted; want 10", len(got))
		}
	}
}

// The instances of one answer share the strings they repeat (the
// service's name and tags, the names, outputs and statuses of their
// checks) rather than each keep the copy that decoding made.
func TestAnAnswersInstancesShareTheStringsTheyRepeat(t *testing.T) {
	var entries []healthEntry
	if err := json.Unmarshal(consulHealth("web", 10), &entries); err != nil {
		t.Fatal(err)
	}
	insts := convertEntries(entries, "dc1", "")
	if len(insts) != 10 {
		t.Fatalf("%d instances, want 10", len(insts))
	}
	first := insts[0]
	for _, in := range insts[1:] {
		for what, pair := range map[string][2]string{
			"name":              {first.Name, in.Name},
			"tag":               {first.Tags[0], in.Tags[0]},
			"check's name":      {first.Checks[0].Name, in.Checks[0].Name},
			"check's status":    {first.Checks[0].Status, in.Checks[0].Status},
			"serf check output": {first.NodeChecks[0].Output, in.NodeChecks[0].Output},
			"check's service":   {first.Checks[0].ServiceName, in.Checks[0].ServiceName},
		} {
			if pair[0] != pair[1] {
				t.Fatalf("%s: %q and %q differ", what, pair[0], pair[1])
			}
			if unsafe.StringData(pair[0]) != unsafe.StringData(pair[1]) {
				t.Errorf("instance %s keeps a copy of the %s %q", in.ID, what, pair[1])
			}
		}
	}
}

// The service list's index moves at every registration anywhere; a list
// whose bytes are those passed on last is not decoded again (10,000
// services' tags: 4 MB at every change).
func TestAnUnchangedServiceListIsNotDecoded(t *testing.T) {
	list := map[string][]string{}
	for i := range 2000 {
		list[fmt.Sprintf("svc-%d", i)] = []string{fmt.Sprintf("seamless.http.host=svc-%d.example", i)}
	}
	body, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := healthReader(t, body, "")
	sb := &sub{kind: partServices}
	ctx := context.Background()
	first, _, err := c.read(ctx, sb, 41, 0, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first.services, list) {
		t.Fatalf("first list: %d services, want %d", len(first.services), len(list))
	}
	again, _, err := c.read(ctx, sb, 41, 0, &first.listed, 0)
	if err != nil {
		t.Fatal(err)
	}
	if again.services != nil || again.listed != first.listed {
		t.Errorf("the same list: decoded %d services (digest equal: %v); want none decoded", len(again.services), again.listed == first.listed)
	}
	other, _, err := c.read(ctx, sb, 41, 0, &[32]byte{1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(other.services, list) {
		t.Errorf("a list other than the one passed on: %d services decoded, want %d", len(other.services), len(list))
	}
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, _, err := c.read(ctx, sb, 41, 0, &first.listed, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What is left: the API's decoder's buffer, twice the body.
	if n := res.AllocedBytesPerOp(); n > int64(4*len(body)) {
		t.Errorf("reading the same list of %d bytes allocated %d bytes; want at most %d", len(body), n, 4*len(body))
	}
}
