package routes

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func build(insts ...model.Instance) (Routes, []Skip) {
	return Build(model.Catalog{Instances: insts}, Policy{Reserved: map[int]string{80: "SEAMLESS_HTTP_BIND"}})
}

func ruleStrings(rt Routes) []string {
	var out []string
	for _, r := range rt.Rules {
		out = append(out, r.String()+" -> "+r.Backend)
	}
	return out
}

func skipStrings(sk []Skip) []string {
	var out []string
	for _, s := range sk {
		out = append(out, s.String())
	}
	return out
}

func TestBuildRules(t *testing.T) {
	tests := []struct {
		name  string
		insts []model.Instance
		rules []string
	}{
		{name: "untagged services are not routed",
			insts: []model.Instance{inst("consul", "consul", "10.0.0.1", 8300)}},
		{name: "a host routes every path",
			insts: []model.Instance{inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.example")},
			rules: []string{"host web.example path / -> http-web"}},
		{name: "hosts and paths of one instance combine",
			insts: []model.Instance{inst("api", "a1", "10.0.0.1", 80,
				"seamless.http.host=a.example", "seamless.http.host=b.example", "seamless.http.path=/v1", "seamless.http.path=/v2")},
			rules: []string{
				"host a.example path /v1 -> http-api", "host a.example path /v2 -> http-api",
				"host b.example path /v1 -> http-api", "host b.example path /v2 -> http-api"}},
		{name: "routes are the union over instances, not their product",
			insts: []model.Instance{
				inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=a.example"),
				inst("web", "w2", "10.0.0.2", 80, "seamless.http.host=b.example", "seamless.http.path=/x")},
			rules: []string{"host a.example path / -> http-web", "host b.example path /x -> http-web"}},
		{name: "a path without a host applies to any host",
			insts: []model.Instance{inst("static", "s1", "10.0.0.1", 80, "seamless.http.path=/static")},
			rules: []string{"any host path /static -> http-static"}},
		{name: "specific before general: exact hosts, wildcards by length, any host; longest path first",
			insts: []model.Instance{
				inst("all", "1", "10.0.0.1", 80, "seamless.http.path=/"),
				inst("apps", "1", "10.0.0.1", 80, "seamless.http.host=*.example"),
				inst("deep", "1", "10.0.0.1", 80, "seamless.http.host=*.eu.example"),
				inst("root", "1", "10.0.0.1", 80, "seamless.http.host=a.example"),
				inst("v1", "1", "10.0.0.1", 80, "seamless.http.host=a.example", "seamless.http.path=/api/v1"),
				inst("api", "1", "10.0.0.1", 80, "seamless.http.host=a.example", "seamless.http.path=/api"),
				inst("static", "1", "10.0.0.1", 80, "seamless.http.path=/static"),
			},
			rules: []string{
				"host a.example path /api/v1 -> http-v1", "host a.example path /api -> http-api",
				"host a.example path / -> http-root", "host *.eu.example path / -> http-deep",
				"host *.example path / -> http-apps", "any host path /static -> http-static",
				"any host path / -> http-all"}},
		{name: "a service's routes survive when no instance is healthy",
			insts: []model.Instance{with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.example"), status(model.StatusCritical))},
			rules: []string{"host web.example path / -> http-web"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, sk := build(tt.insts...)
			if len(sk) > 0 {
				t.Errorf("skips: %q", skipStrings(sk))
			}
			if got := ruleStrings(rt); !reflect.DeepEqual(got, tt.rules) {
				t.Errorf("rules:\n got %q\nwant %q", got, tt.rules)
			}
		})
	}
}

func TestBuildSkips(t *testing.T) {
	tests := []struct {
		name  string
		insts []model.Instance
		skips []string
		rules []string
	}{
		{name: "two services on one host and path registered at once: the first by name keeps it",
			insts: []model.Instance{
				inst("beta", "b1", "10.0.0.2", 80, "seamless.http.host=x.example"),
				inst("alpha", "a1", "10.0.0.1", 80, "seamless.http.host=X.example", "seamless.http.host=y.example"),
			},
			skips: []string{`service beta: route for host x.example path / refused: service alpha has it too and keeps it: both were registered at once and its name sorts first`},
			rules: []string{"host x.example path / -> http-alpha", "host y.example path / -> http-alpha"}},
		{name: "two catch-alls registered at once: the first by name keeps it",
			insts: []model.Instance{
				inst("b", "1", "10.0.0.2", 80, "seamless.http.path=/"),
				inst("a", "1", "10.0.0.1", 80, "seamless.http.path=/"),
			},
			skips: []string{`service b: route for any host path / refused: service a has it too and keeps it: both were registered at once and its name sorts first`},
			rules: []string{"any host path / -> http-a"}},
		{name: "two services on one TCP port",
			insts: []model.Instance{
				inst("pg-old", "1", "10.0.0.2", 5432, "seamless.tcp.port=15432"),
				inst("pg", "1", "10.0.0.1", 5432, "seamless.tcp.port=15432"),
			},
			skips: []string{`service pg-old: tag seamless.tcp.port=15432 refused: service pg has that port too and keeps it: both were registered at once and its name sorts first`}},
		{name: "a TCP port on the HTTP frontend's",
			insts: []model.Instance{inst("web", "1", "10.0.0.1", 80, "seamless.tcp.port=80")},
			skips: []string{`service web: tag seamless.tcp.port=80 left out: port 80 is SEAMLESS_HTTP_BIND's`}},
		{name: "a bad tag is reported once for all replicas, and takes their other tags with it",
			insts: []model.Instance{
				inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=a b", "seamless.http.host=ok.example"),
				inst("web", "w2", "10.0.0.2", 80, "seamless.http.host=a b", "seamless.http.host=ok.example"),
			},
			skips: []string{
				`service web: service not routed: none of its instances with seamless tags can be used`,
				`service web: tag seamless.http.host="a b" is invalid: not a host name: use letters, digits and hyphens in dot-separated labels, an IPv4 address, or "*." and a name for every name under it; every instance with it is left out (an instance is routed with all of its seamless tags or not at all)`}},
		{name: "a service with only bad tags is left out",
			insts: []model.Instance{inst("web", "w1", "10.0.0.1", 80, "seamless.http.path=api")},
			skips: []string{
				`service web: service not routed: none of its instances with seamless tags can be used`,
				`service web: tag seamless.http.path=api is invalid: not a path prefix: it must start with "/"; every instance with it is left out (an instance is routed with all of its seamless tags or not at all)`}},
		{name: "a service name with a newline is left out whole",
			insts: []model.Instance{inst("web\nbackend evil", "w1", "10.0.0.1", 80, "seamless.http.host=evil.example")},
			skips: []string{`service "web\nbackend evil": service left out: the service name has the byte 0x0a: whitespace and control characters are not accepted`}},
		{name: "a bad name without seamless tags is nobody's business",
			insts: []model.Instance{inst("my service", "1", "10.0.0.1", 80)}},
		{name: "bad instances are left out, the rest serves",
			insts: []model.Instance{
				inst("web", "ok", "10.0.0.1", 80, "seamless.http.host=web.example"),
				inst("web", "noaddr", "", 80, "seamless.http.host=web.example"),
				inst("web", "noport", "10.0.0.3", 0, "seamless.http.host=web.example"),
				inst("web", "badaddr", "10.0.0.4 # x", 80, "seamless.http.host=web.example"),
				with(inst("web", "heavy", "10.0.0.5", 80, "seamless.http.host=web.example"), func(in *model.Instance) { in.Weight = 1000 }),
			},
			skips: []string{
				`service web instance badaddr: address "10.0.0.4 # x" is neither an IP address nor a DNS name; instance left out`,
				`service web instance heavy: weight 1000 is outside HAProxy's range 1–256; instance left out`,
				`service web instance noaddr: the instance has no address; instance left out`,
				`service web instance noport: the instance has no port; instance left out`,
			},
			rules: []string{"host web.example path / -> http-web"}},
		{name: "an unhealthy instance with a bad address is left out too: no template sees it",
			insts: []model.Instance{
				inst("web", "ok", "10.0.0.1", 80, "seamless.http.host=web.example"),
				with(inst("web", "down", "not an address", 80, "seamless.http.host=web.example"), status(model.StatusCritical)),
			},
			skips: []string{`service web instance down: address "not an address" is neither an IP address nor a DNS name; instance left out`},
			rules: []string{"host web.example path / -> http-web"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, sk := build(tt.insts...)
			if got := skipStrings(sk); !reflect.DeepEqual(got, tt.skips) {
				t.Errorf("skips:\n got %q\nwant %q", got, tt.skips)
			}
			if got := ruleStrings(rt); !reflect.DeepEqual(got, tt.rules) {
				t.Errorf("rules:\n got %q\nwant %q", got, tt.rules)
			}
		})
	}
}

func TestBuildHealthAndWeights(t *testing.T) {
	insts := []model.Instance{
		with(inst("web", "p", "10.0.0.1", 80, "seamless.http.host=w.example"), func(in *model.Instance) { in.Weight = 10; in.WarningWeight = 2 }),
		with(inst("web", "w", "10.0.0.2", 80), func(in *model.Instance) { in.Status = model.StatusWarning; in.Weight = 10; in.WarningWeight = 2 }),
		with(inst("web", "w0", "10.0.0.3", 80), func(in *model.Instance) { in.Status = model.StatusWarning; in.Weight = 7 }),
		with(inst("web", "c", "10.0.0.4", 80), status(model.StatusCritical)),
		with(inst("web", "m", "10.0.0.5", 80), status(model.StatusMaintenance)),
	}
	tests := []struct {
		name   string
		health []string
		want   []string // name=weight
	}{
		{name: "passing by default", want: []string{"p=10"}},
		{name: "passing and warning; a warning instance takes its warning weight, or its weight when that is unset",
			health: []string{"passing", "warning"}, want: []string{"p=10", "w=2", "w0=7"}},
		{name: "any", health: []string{"any"}, want: []string{"c=1", "m=1", "p=10", "w=2", "w0=7"}},
		{name: "critical only", health: []string{"critical"}, want: []string{"c=1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, sk := Build(model.Catalog{Instances: insts}, Policy{Health: tt.health})
			if len(sk) > 0 {
				t.Fatalf("skips: %q", skipStrings(sk))
			}
			var got []string
			for _, s := range rt.Services[0].Servers {
				got = append(got, s.Name+"="+strconv.Itoa(s.Weight))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("servers = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestServerNames(t *testing.T) {
	t.Run("the same ID on two nodes gets a hash each, depending only on the instance", func(t *testing.T) {
		a := with(inst("web", "web", "10.0.0.1", 80, "seamless.http.host=w.example"), func(in *model.Instance) { in.Node = "n1" })
		b := with(inst("web", "web", "10.0.0.2", 80, "seamless.http.host=w.example"), func(in *model.Instance) { in.Node = "n2" })
		c := with(inst("web", "web", "10.0.0.3", 80, "seamless.http.host=w.example"), func(in *model.Instance) { in.Node = "n3" })
		rt2, _ := build(a, b)
		rt3, _ := build(a, b, c)
		names := func(rt Routes) map[string]string {
			m := map[string]string{}
			for _, s := range rt.Services[0].Servers {
				m[s.Address.Host] = s.Name
			}
			return m
		}
		n2, n3 := names(rt2), names(rt3)
		if n2["10.0.0.1"] == n2["10.0.0.2"] || !strings.HasPrefix(n2["10.0.0.1"], "web-") {
			t.Fatalf("names %v", n2)
		}
		for addr, n := range n2 {
			if n3[addr] != n {
				t.Errorf("server at %s was %s, became %s when another instance came", addr, n, n3[addr])
			}
		}
	})
	t.Run("unsafe IDs are mapped, and kept apart from their look-alikes", func(t *testing.T) {
		rt, _ := build(
			inst("web", "host:web:80", "10.0.0.1", 80, "seamless.http.host=w.example"),
			inst("web", "host_web_80", "10.0.0.2", 80),
			inst("web", "", "10.0.0.3", 8080),
		)
		var got []string
		for _, s := range rt.Services[0].Servers {
			got = append(got, s.Name)
		}
		want := []string{"10.0.0.3_8080-" + hash8("10.0.0.3:8080"), "host_web_80", "host_web_80-" + hash8("host:web:80")}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("names = %q, want %q", got, want)
		}
	})
	t.Run("backend names of look-alike services differ", func(t *testing.T) {
		rt, _ := build(
			inst("team/web", "1", "10.0.0.1", 80, "seamless.http.host=a.example"),
			inst("team_web", "1", "10.0.0.2", 80, "seamless.http.host=b.example"),
		)
		if rt.Services[0].HTTPBackend == rt.Services[1].HTTPBackend {
			t.Fatalf("both services are %s", rt.Services[0].HTTPBackend)
		}
	})
}

func TestBuildIgnoresInstanceOrder(t *testing.T) {
	insts := []model.Instance{
		inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=w.example", "seamless.http.path=/a"),
		inst("web", "w2", "10.0.0.2", 80, "seamless.http.host=w.example", "seamless.http.path=/b"),
		inst("web", "web", "10.0.0.3", 80, "seamless.http.host=w.example"),
		with(inst("web", "web", "10.0.0.4", 80), func(in *model.Instance) { in.Node = "n2" }),
		inst("api", "a", "10.0.0.5", 80, "seamless.http.host=w.example", "seamless.http.path=/a"),
		inst("db", "d", "10.0.0.6", 5432, "seamless.tcp.port=15432"),
		inst("db2", "d", "10.0.0.7", 5432, "seamless.tcp.port=15432", "seamless.http.host=bad host"),
	}
	want, wantSk := build(insts...)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		shuffled := slices.Clone(insts)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got, gotSk := build(shuffled...)
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotSk, wantSk) {
			t.Fatalf("order changed the result:\n%+v\n%+v", got, want)
		}
	}
}

// The service cache holds the instances of the catalog it last rendered,
// not a copy of them, and moves to each new catalog: it pins no older one.
func TestTheServiceCacheHoldsTheNewestCatalog(t *testing.T) {
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", Slots: 4})
	mk := func() []model.Instance {
		return []model.Instance{inst("api", "api-1", "10.0.0.1", 80, "seamless.http.host=api.example"),
			inst("web", "web-1", "10.0.0.2", 80, "seamless.http.host=web.example")}
	}
	for range 2 {
		insts := mk()
		render(t, r, catalog(insts...))
		for i, name := range []string{"api", "web"} {
			if got := r.services.byName[name].insts; len(got) != 1 || &got[0] != &insts[i] {
				t.Errorf("service %s: the cache holds a copy of its instances, or an older catalog's", name)
			}
		}
	}
}

// The memo of checked strings forgets what renderings no longer check:
// a churn of service names does not grow it.
func TestCheckedStringsAreForgotten(t *testing.T) {
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", Slots: 4})
	most := 0
	for i := range 50 {
		var insts []model.Instance
		for j := range 5 {
			name := fmt.Sprintf("svc%d-%d", i, j)
			insts = append(insts, inst(name, name+"-1", "10.0.0.1", 80, "seamless.http.host="+name+".example"))
		}
		render(t, r, catalog(insts...))
		if i == 0 {
			most = 3 * len(r.checked.seen)
		}
		if n := len(r.checked.seen); n > most {
			t.Fatalf("rendering %d: %d checked strings kept, want at most %d", i, n, most)
		}
	}
}
