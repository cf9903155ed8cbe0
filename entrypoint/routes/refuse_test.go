package routes

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

func registered(n uint64) func(*model.Instance) {
	return func(in *model.Instance) { in.Registered = n }
}

func source(s string) func(*model.Instance) { return func(in *model.Instance) { in.Source = s } }

// hasSkip reports whether a skip of service mentions every one of words.
func hasSkip(sk []Skip, service string, words ...string) bool {
	return slices.ContainsFunc(sk, func(s Skip) bool {
		if s.Service != service {
			return false
		}
		for _, w := range words {
			if !strings.Contains(s.String(), w) {
				return false
			}
		}
		return true
	})
}

// An invalid seamless.* tag never leaves a wider rule behind: the instance
// that carries it gives no route at all (issue 10, item 1).
func TestInvalidTagNeverWidensARoute(t *testing.T) {
	holder := inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test")
	tests := []struct {
		name    string
		insts   []model.Instance
		rules   []string
		refused string // the service refused, with the tag named
		tag     string
	}{
		{name: "valid host, invalid path: no host-wide route",
			insts: []model.Instance{holder, inst("admin", "a1", "10.0.0.9", 80, "seamless.http.host=web.test", "seamless.http.path=/admin area")},
			rules: []string{"host web.test path / -> http-web"}, refused: "admin", tag: "seamless.http.path"},
		{name: "invalid host, valid path: no any-host route",
			insts: []model.Instance{holder, inst("admin", "a1", "10.0.0.9", 80, "seamless.http.host=web test", "seamless.http.path=/admin")},
			rules: []string{"host web.test path / -> http-web"}, refused: "admin", tag: "seamless.http.host"},
		{name: "a typo of a seamless tag is invalid too",
			insts: []model.Instance{holder, inst("admin", "a1", "10.0.0.9", 80, "seamless.http.host=web.test", "seamless.http.paht=/admin")},
			rules: []string{"host web.test path / -> http-web"}, refused: "admin", tag: "seamless.http.paht"},
		{name: "a tag without a value is invalid",
			insts: []model.Instance{holder, inst("admin", "a1", "10.0.0.9", 80, "seamless.http.host=web.test", "seamless.http.path")},
			rules: []string{"host web.test path / -> http-web"}, refused: "admin", tag: "seamless.http.path"},
		{name: "an invalid TCP port takes the HTTP route with it",
			insts:   []model.Instance{inst("db", "d1", "10.0.0.9", 5432, "seamless.http.host=db.test", "seamless.tcp.port=99999")},
			refused: "db", tag: "seamless.tcp.port"},
		{name: "one instance's invalid tag does not widen its service; the valid instances still route",
			insts: []model.Instance{
				inst("api", "a1", "10.0.0.1", 80, "seamless.http.host=web.test", "seamless.http.path=/api"),
				inst("api", "a2", "10.0.0.2", 80, "seamless.http.host=web.test", "seamless.http.path=/api v2"),
			},
			rules: []string{"host web.test path /api -> http-api"}, refused: "api", tag: "seamless.http.path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, sk := build(tt.insts...)
			if got := ruleStrings(rt); !reflect.DeepEqual(got, tt.rules) {
				t.Errorf("rules:\n got %q\nwant %q", got, tt.rules)
			}
			if !hasSkip(sk, tt.refused, tt.tag) {
				t.Errorf("no skip of service %s naming %s: %q", tt.refused, tt.tag, skipStrings(sk))
			}
			for _, s := range rt.Services {
				for _, srv := range s.Servers {
					if srv.Address.Host == "10.0.0.9" || srv.Instance == "a2" {
						t.Errorf("the instance with the invalid tag is a server of %s", s.Name)
					}
				}
			}
		})
	}
}

// The holder of a route keeps it: the earliest registration wins, not the
// first name (issue 10, item 2).
func TestEarliestRegistrationKeepsTheRoute(t *testing.T) {
	tests := []struct {
		name      string
		sources   []string
		insts     []model.Instance
		rules     []string
		listeners []string
		loser     string // refused, naming the winner
		winner    string
	}{
		{name: "an intruder whose name sorts first does not take the host",
			insts: []model.Instance{
				with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test"), registered(10)),
				with(inst("aaa", "x1", "10.0.0.9", 80, "seamless.http.host=web.test"), registered(42)),
			},
			rules: []string{"host web.test path / -> http-web"}, loser: "aaa", winner: "web"},
		{name: "nor the TCP port",
			insts: []model.Instance{
				with(inst("pg", "p1", "10.0.0.1", 5432, "seamless.tcp.port=15432"), registered(10)),
				with(inst("aaa", "x1", "10.0.0.9", 5432, "seamless.tcp.port=15432"), registered(42)),
			},
			listeners: []string{"15432 -> tcp-pg"}, loser: "aaa", winner: "pg"},
		{name: "a service is as old as its earliest instance",
			insts: []model.Instance{
				with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test"), registered(50)),
				with(inst("web", "w2", "10.0.0.2", 80, "seamless.http.host=web.test"), registered(5)),
				with(inst("aaa", "x1", "10.0.0.9", 80, "seamless.http.host=web.test"), registered(20)),
			},
			rules: []string{"host web.test path / -> http-web"}, loser: "aaa", winner: "web"},
		{name: "a known registration wins over an unknown one",
			insts: []model.Instance{
				with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test"), registered(99)),
				inst("aaa", "x1", "10.0.0.9", 80, "seamless.http.host=web.test"),
			},
			rules: []string{"host web.test path / -> http-web"}, loser: "aaa", winner: "web"},
		{name: "between sources, their precedence decides",
			sources: []string{"consul", "file"},
			insts: []model.Instance{
				with(with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test"), registered(1000)), source("consul")),
				with(with(inst("aaa", "x1", "10.0.0.9", 80, "seamless.http.host=web.test"), registered(1)), source("file")),
			},
			rules: []string{"host web.test path / -> http-web"}, loser: "aaa", winner: "web"},
		{name: "a tie goes to the first name",
			insts: []model.Instance{
				with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test"), registered(7)),
				with(inst("aaa", "x1", "10.0.0.9", 80, "seamless.http.host=web.test"), registered(7)),
			},
			rules: []string{"host web.test path / -> http-aaa"}, loser: "web", winner: "aaa"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, sk := Build(model.Catalog{Instances: tt.insts}, Policy{Sources: tt.sources})
			if got := ruleStrings(rt); !reflect.DeepEqual(got, tt.rules) {
				t.Errorf("rules:\n got %q\nwant %q", got, tt.rules)
			}
			var ls []string
			for _, l := range rt.Listeners {
				ls = append(ls, strings.Join([]string{itoa(l.Port), "->", l.Backend}, " "))
			}
			if !reflect.DeepEqual(ls, tt.listeners) {
				t.Errorf("listeners:\n got %q\nwant %q", ls, tt.listeners)
			}
			if !hasSkip(sk, tt.loser, "service "+tt.winner+" ") {
				t.Errorf("no skip of %s naming %s: %q", tt.loser, tt.winner, skipStrings(sk))
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// A refusal reaches Rendering.Skipped and seamless_routes_refused_total,
// counted once however often the same state renders.
func TestRefusalsAreReportedAndCountedOnce(t *testing.T) {
	refused := NewRefusals()
	opts := goldenOpts
	opts.Refusals = refused
	r := mustNew(t, opts)
	holder := with(inst("web", "w1", "10.0.0.1", 80, "seamless.http.host=web.test"), registered(10))
	intruder := with(inst("aaa", "x1", "10.0.0.9", 80, "seamless.http.host=web.test"), registered(42))
	typo := inst("admin", "a1", "10.0.0.8", 80, "seamless.http.host=web.test", "seamless.http.paht=/admin")
	count := func(reason string) float64 { return testutil.ToFloat64(refused.counter.WithLabelValues(reason)) }

	for range 3 {
		out := render(t, r, catalog(holder, intruder, typo))
		if !slices.ContainsFunc(out.Skipped, func(s string) bool {
			return strings.HasPrefix(s, "service aaa: ") && strings.Contains(s, "service web has it too")
		}) {
			t.Fatalf("the conflict is not reported naming both services: %q", out.Skipped)
		}
		if !strings.Contains(string(out.Config), "use_backend http-web if") || strings.Contains(string(out.Config), "http-aaa") ||
			strings.Contains(string(out.Config), "http-admin") {
			t.Fatalf("the holder does not have the host alone:\n%s", out.Config)
		}
	}
	if c, tg := count(RefusedConflict), count(RefusedTag); c != 1 || tg != 1 {
		t.Fatalf("conflict = %v, invalid_tag = %v after three renders of one state; want 1 each", c, tg)
	}
	render(t, r, catalog(holder))
	render(t, r, catalog(holder, intruder))
	if c := count(RefusedConflict); c != 2 {
		t.Fatalf("conflict = %v after the intruder came back; want 2", c)
	}
}
