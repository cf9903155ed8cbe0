package routes

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/certs"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// Golden configurations bind fixed high ports on 127.0.0.1, so that
// `haproxy -c` checks real addresses and the files do not change.
var goldenOpts = Options{HTTPBind: "127.0.0.1:18080", StatsBind: "127.0.0.1:18404"}

// goldenCrtList is the crt-list of the HTTPS golden: TestGoldenHAProxy
// writes it with a self-signed certificate.
const goldenCrtList = "/tmp/seamless-routes-golden/crt-list"

// goldenACMEMap is the ACME golden's challenge map, made empty like the crt-list.
const goldenACMEMap = "/tmp/seamless-routes-golden/acme-challenges.map"

func healthCatalog() model.State {
	tags := []string{"seamless.http.host=shop.example"}
	return catalog(
		with(inst("shop", "shop-1", "10.0.1.1", 8080, tags...), func(in *model.Instance) { in.Weight = 10; in.WarningWeight = 1 }),
		with(inst("shop", "shop-2", "10.0.1.2", 8080, tags...), func(in *model.Instance) {
			in.Status = model.StatusWarning
			in.Weight, in.WarningWeight = 10, 1
		}),
		with(inst("shop", "shop-3", "10.0.1.3", 8080, tags...), status(model.StatusCritical)),
		with(inst("shop", "shop-4", "10.0.1.4", 8080, tags...), status(model.StatusMaintenance)),
		// Every instance of search is critical: its host answers 503 with
		// the passing filter, instead of falling to the catch-all.
		with(inst("search", "search-1", "10.0.2.1", 8080, "seamless.http.host=search.example"), status(model.StatusCritical)),
		with(inst("search", "search-2", "10.0.2.2", 8080, "seamless.http.host=search.example"), status(model.StatusWarning)),
		inst("www", "www-1", "10.0.3.1", 8080, "seamless.http.path=/"),
	)
}

var goldens = []struct {
	name string // testdata/<name>.cfg, and <name>.skipped when anything is
	opts Options
	st   model.State
}{
	{name: "empty", opts: goldenOpts, st: catalog(
		// Not tagged: not routed.
		inst("consul", "consul", "10.0.0.1", 8300),
	)},
	{name: "classic", opts: Options{HTTPBind: "127.0.0.1:5001", StatsBind: "127.0.0.1:8404"}, st: catalog(
		inst("web", "web1", "127.0.0.1", 9001, "seamless.http.host=localhost", "seamless.http.host=127.0.0.1"),
		inst("web", "web2", "127.0.0.1", 9002, "seamless.http.host=localhost", "seamless.http.host=127.0.0.1"),
		inst("web", "web3", "127.0.0.1", 9003, "seamless.http.host=localhost", "seamless.http.host=127.0.0.1"),
	)},
	{name: "http", opts: goldenOpts, st: catalog(
		inst("api", "api-1", "10.0.0.1", 8080, "seamless.http.host=example.com", "seamless.http.path=/api"),
		inst("api", "api-2", "10.0.0.2", 8080, "seamless.http.host=example.com", "seamless.http.path=/api"),
		inst("api-v2", "api-v2-1", "10.0.0.3", 8080, "seamless.http.host=example.com", "seamless.http.path=/api/v2"),
		inst("web", "web-1", "10.0.0.4", 8080, "seamless.http.host=example.com", "seamless.http.host=WWW.example.com"),
		with(inst("web", "web-2", "2001:db8::4", 8080, "seamless.http.host=example.com", "seamless.http.host=www.example.com"),
			func(in *model.Instance) { in.Weight = 3 }),
		inst("apps", "apps-1", "apps.internal", 80, "seamless.http.host=*.apps.example.com"),
		inst("assets", "assets-1", "localhost", 8081, "seamless.http.path=/assets"),
		inst("landing", "landing-1", "10.0.0.9", 8080, "seamless.http.path=/"),
	)},
	{name: "tcp", opts: goldenOpts, st: catalog(
		inst("postgres", "pg-1", "10.0.0.1", 5432, "seamless.tcp.port=15432"),
		inst("postgres", "pg-2", "10.0.0.2", 5432, "seamless.tcp.port=15432"),
		inst("redis", "redis-1", "10.0.0.3", 6379, "seamless.tcp.port=16379"),
		// HTTP and TCP on one service: two backends, the same servers.
		inst("git", "git-1", "10.0.0.4", 22, "seamless.tcp.port=10022", "seamless.http.host=git.example"),
	)},
	{name: "health-passing", opts: goldenOpts, st: healthCatalog()},
	{name: "health-passing-warning", opts: Options{HTTPBind: goldenOpts.HTTPBind, StatsBind: goldenOpts.StatsBind,
		Health: model.ParseHealth("passing,warning")}, st: healthCatalog()},
	{name: "health-any", opts: Options{HTTPBind: goldenOpts.HTTPBind, StatsBind: goldenOpts.StatsBind,
		Health: model.ParseHealth("any")}, st: healthCatalog()},
	{name: "skipped", opts: goldenOpts, st: catalog(
		inst("good", "good-1", "10.0.0.1", 8080, "seamless.http.host=good.example", "seamless.tcp.port=18080"),
		// Any invalid seamless tag leaves its instance out whole.
		inst("good", "good-6", "10.0.0.16", 8080, "seamless.http.host=good.example", "seamless.http.host=bad_host.example",
			"seamless.http.path=no-slash", "seamless.tcp.port=99999", "seamless.htpp.host=typo.example"),
		inst("good", "good-2", "10.0.0.2", 0, "seamless.http.host=good.example"),
		inst("good", "good-3", "10.0.0.3 ; rm", 8080, "seamless.http.host=good.example"),
		with(inst("good", "good-4", "10.0.0.4", 8080), func(in *model.Instance) { in.Weight = 300 }),
		inst("good", "good-5", "fe80::1%eth0", 8080),
		inst("rival", "rival-1", "10.0.0.5", 8080, "seamless.http.host=good.example", "seamless.http.host=rival.example"),
		inst("bad name", "x", "10.0.0.6", 8080, "seamless.http.host=bad.example"),
		inst("only-bad", "o", "10.0.0.7", 8080, "seamless.http.host=-bad-.example"),
		// Resolution at start fails: the server starts disabled.
		inst("gone", "gone-1", "nothing.invalid", 8080, "seamless.http.host=gone.example"),
	)},
	{name: "https", opts: Options{HTTPBind: "127.0.0.1:18080", HTTPSBind: "127.0.0.1:18443", CrtList: goldenCrtList,
		StatsBind: "127.0.0.1:18404"}, st: catalog(
		// Both frontends route alike; shop's plain HTTP requests are redirected.
		inst("shop", "shop-1", "10.0.0.1", 8080, "seamless.http.host=shop.example", "seamless.http.tls=redirect"),
		inst("shop", "shop-2", "10.0.0.2", 8080, "seamless.http.host=shop.example"),
		inst("api", "api-1", "10.0.0.3", 8080, "seamless.http.host=shop.example", "seamless.http.path=/api"),
		// Refused: an unknown value, and the HTTPS port.
		inst("bad", "bad-1", "10.0.0.4", 8080, "seamless.http.host=bad.example", "seamless.http.tls=yes"),
		inst("pg", "pg-1", "10.0.0.5", 5432, "seamless.tcp.port=18443"),
	)},
	{name: "acme", opts: Options{HTTPBind: "127.0.0.1:18080", HTTPSBind: "127.0.0.1:18443", CrtList: goldenCrtList,
		ACMEMap: goldenACMEMap}, st: catalog(
		// The HTTP frontend answers ACME's HTTP-01 challenges first, even
		// for a host whose plain HTTP is redirected.
		inst("shop", "shop-1", "10.0.0.1", 8080, "seamless.http.host=shop.example", "seamless.http.tls=redirect"),
	)},
	{name: "stats-off", opts: Options{HTTPBind: "127.0.0.1:18080"}, st: catalog(
		inst("web", "web-1", "10.0.0.1", 8080, "seamless.http.path=/"),
		inst("web", "web-2", "10.0.0.2", 8080, "seamless.tcp.port=18404"),
	)},
}

func TestGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			out := render(t, mustNew(t, g.opts), g.st)
			checkGrammar(t, out.Config)
			var skipped []byte
			if len(out.Skipped) > 0 {
				skipped = []byte(strings.Join(out.Skipped, "\n") + "\n")
			}
			golden(t, g.name+".cfg", out.Config)
			golden(t, g.name+".skipped", skipped)
			again := render(t, mustNew(t, g.opts), g.st)
			if !bytes.Equal(again.Config, out.Config) {
				t.Fatal("a second render of the same state differs")
			}
		})
	}
}

// TestGoldenHAProxy runs `haproxy -c` on every golden configuration.
func TestGoldenHAProxy(t *testing.T) {
	if _, _, err := certs.EnsureDefault(filepath.Join(filepath.Dir(goldenCrtList), "default.pem"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goldenCrtList, []byte(filepath.Join(filepath.Dir(goldenCrtList), "default.pem")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goldenACMEMap, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			cfg, err := os.ReadFile(filepath.Join("testdata", g.name+".cfg"))
			if err != nil {
				t.Fatal(err)
			}
			haproxyCheck(t, cfg)
		})
	}
}

// golden compares got with testdata/name, or rewrites it with -update. An
// empty got means the file must not exist.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if len(got) == 0 {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			return
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if os.IsNotExist(err) && len(got) == 0 {
		return
	}
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the rendering (go test -update rewrites it):\n--- got:\n%s", path, got)
	}
}

func TestRenderWaitsForTheCatalog(t *testing.T) {
	r := mustNew(t, goldenOpts)
	out := render(t, r, model.NewState(nil))
	if out.Config != nil || len(out.Missing) != 1 || out.Missing[0] != model.LocalCatalog ||
		len(out.Queries) != 1 || out.Queries[0] != model.LocalCatalog {
		t.Fatalf("rendering without a catalog = %+v", out)
	}
	out = render(t, r, model.NewState(map[model.Query]model.Result{model.LocalCatalog: {}}))
	if out.Config == nil || len(out.Missing) != 0 {
		t.Fatalf("a present but nil catalog should render the empty configuration: %+v", out)
	}
}
