package template

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata/*.cfg from the current output")

// fixedNow keeps timestamp stable in goldens.
var fixedNow = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

func testOptions() Options {
	return Options{
		LookupEnv: func(k string) (string, bool) {
			v, ok := map[string]string{"CLUSTER": "blue", "EMPTY": ""}[k]
			return v, ok
		},
		NodeName: "node1",
		Now:      fixedNow,
		Dir:      "testdata",
	}
}

func kv(key, value string) model.KVPair { return model.KVPair{Key: key, Value: value} }

func keyQ(k string) model.Query    { return model.Query{Kind: model.QueryKey, Key: k} }
func prefixQ(k string) model.Query { return model.Query{Kind: model.QueryPrefix, Key: k} }

// localCatalog is a merged local catalog: two "web" instances tagged
// release, one warning, one critical, one in maintenance, an "api"
// service tagged http, a "db" service without it.
func localCatalog() *model.Catalog {
	inst := func(name, node, addr string, port int, status string, tags ...string) model.Instance {
		return model.Instance{
			Source: "consul", Name: name, ID: name + "-" + node, Node: node, NodeAddress: addr,
			Address: addr, Port: port, Status: status, Tags: tags, Datacenter: "dc1",
		}
	}
	web1 := inst("web", "node1", "10.0.0.1", 8080, model.StatusPassing, "release", "http")
	web1.Meta = map[string]string{"version": "2"}
	web1.Weight = 5
	return &model.Catalog{
		Datacenter: "dc1",
		Nodes: []model.Node{
			{Name: "node1", Address: "10.0.0.1", Datacenter: "dc1", Meta: map[string]string{"rack": "r1"}},
			{Name: "node2", Address: "10.0.0.2", Datacenter: "dc1"},
			{Name: "node3", Address: "10.0.0.3", Datacenter: "dc1"},
		},
		Instances: []model.Instance{
			inst("api", "node1", "10.0.0.1", 9090, model.StatusPassing, "http"),
			inst("api", "node3", "10.0.0.3", 9090, model.StatusPassing, "http", "canary"),
			inst("db", "node2", "10.0.0.2", 5432, model.StatusPassing, "primary"),
			web1,
			inst("web", "node2", "10.0.0.2", 8080, model.StatusPassing, "release"),
			inst("web", "node3", "10.0.0.3", 8080, model.StatusWarning, "release"),
			inst("web", "node4", "10.0.0.4", 8080, model.StatusCritical, "release"),
			inst("web", "node5", "10.0.0.5", 8080, model.StatusMaintenance),
		},
	}
}

func remoteCatalog() *model.Catalog {
	return &model.Catalog{
		Datacenter: "dc2",
		Nodes:      []model.Node{{Name: "far1", Address: "192.0.2.1"}},
		Instances: []model.Instance{
			{Source: "consul", Name: "web", ID: "web-far1", Node: "far1", Address: "192.0.2.1", Port: 80, Status: model.StatusPassing, Tags: []string{"release"}},
		},
	}
}

func testResults() map[model.Query]model.Result {
	return map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: localCatalog()},
		{Kind: model.QueryCatalog, Datacenter: "dc2"}: {Catalog: remoteCatalog()},
		{Kind: model.QueryDatacenters}:                {Datacenters: []string{"dc2", "dc1"}},
		keyQ("service/haproxy/maxconn"):               {Pairs: []model.KVPair{kv("service/haproxy/maxconn", "4096")}},
		keyQ("service/haproxy/mode"):                  {Pairs: []model.KVPair{kv("service/haproxy/mode", "http")}},
		keyQ("absent"):                                {},
		keyQ("empty"):                                 {Pairs: []model.KVPair{kv("empty", "")}},
		prefixQ("service/haproxy/timeouts"): {Pairs: []model.KVPair{
			kv("service/haproxy/timeouts/", ""),
			kv("service/haproxy/timeouts/client", "30s"),
			kv("service/haproxy/timeouts/connect", "5s"),
			kv("service/haproxy/timeouts/server", "30s"),
			kv("service/haproxy/timeouts/extra/ignored-by-ls", "1"),
		}},
		prefixQ("config"): {Pairs: []model.KVPair{
			kv("config/admin/port", "1234"),
			kv("config/maxconns", "5"),
			kv("config/minconns", "2"),
			kv("config/weights/node1", "10"),
		}},
		prefixQ("nothing"): {},
	}
}

func testState() model.State { return model.NewState(testResults()) }

// renderText parses text as a template named name and renders st.
func renderText(t *testing.T, name, text string, opts Options, st model.State) (model.Rendering, error) {
	t.Helper()
	tmpl, err := parseText(name, text, opts)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return tmpl.Render(st)
}

// golden compares got with testdata/name.cfg, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenFile(t, name+".cfg", got)
}

// goldenFile compares got with testdata/file, or rewrites it with -update.
func goldenFile(t *testing.T, file string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the rendering (go test -update rewrites it)\n--- got ---\n%s\n--- want ---\n%s", path, got, want)
	}
}

// haproxyCheck runs the real `haproxy -c` on cfg; skipped without HAProxy
// unless CI is set.
func haproxyCheck(t *testing.T, cfg []byte) {
	t.Helper()
	bin := testenv.HAProxy(t)
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", "-f", path)
	cmd.Env = haproxy.CleanEnv(os.Environ())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("haproxy -c refused the rendering: %v\n%s\n--- config ---\n%s", err, out, numbered(cfg))
	}
}

func numbered(b []byte) string {
	var s strings.Builder
	for i, l := range strings.Split(string(b), "\n") {
		s.WriteString(strings.Repeat(" ", 4-len(itoa(i+1))) + itoa(i+1) + "  " + l + "\n")
	}
	return s.String()
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// With the services watched named (SEAMLESS_CONSUL_SERVICES), reading
// another is an error, not an empty list: its instances are missing, not
// absent, and a backend rendered without them must not be applied.
func TestServiceOutsideTheWatchedOnesIsAnError(t *testing.T) {
	opts := testOptions()
	opts.Watched = func(name string) bool { return name == "web" || name == "api" }
	r, err := renderText(t, "w.tmpl", `{{range service "web"}}{{.Port}} {{end}}{{range service "http.api"}}{{.Port}}{{end}}`, opts, testState())
	if err != nil || len(r.Config) == 0 {
		t.Fatalf("watched services: %q, %v", r.Config, err)
	}
	_, err = renderText(t, "w.tmpl", `{{range service "web"}}{{.Port}}{{end}}{{range service "db|any"}}{{.Port}}{{end}}`, opts, testState())
	if err == nil || !strings.Contains(err.Error(), `service "db" is not watched`) || !strings.Contains(err.Error(), "SEAMLESS_CONSUL_SERVICES") {
		t.Errorf("a service not watched: error %v, want one naming db and SEAMLESS_CONSUL_SERVICES", err)
	}
}

// A service's .Checks are its node's checks, then its own, as
// consul-template lists them: the model keeps the node's apart, in one
// list its instances share.
func TestServiceChecksHoldTheNodesFirst(t *testing.T) {
	web := model.Instance{Source: "consul", Name: "web", ID: "node1/web-1", Node: "node1", Address: "10.0.0.1", Port: 80,
		Status:     model.StatusCritical,
		NodeChecks: []model.Check{{Node: "node1", CheckID: "serfHealth", Status: model.StatusPassing}},
		Checks:     []model.Check{{Node: "node1", CheckID: "service:web-1", Status: model.StatusCritical, ServiceID: "web-1", ServiceName: "web"}}}
	st := model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Datacenter: "dc1", Instances: []model.Instance{web}}}})
	r, err := renderText(t, "checks", `{{range service "web|any"}}{{.Status}}:{{range .Checks}} {{.CheckID}}={{.Status}}{{end}}{{end}}`, testOptions(), st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(r.Config), "critical: serfHealth=passing service:web-1=critical"; got != want {
		t.Errorf("rendered %q, want %q", got, want)
	}
}
