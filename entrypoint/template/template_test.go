package template

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func TestClassicConsulTemplateRendersUnchanged(t *testing.T) {
	tmpl, err := Parse("testdata/classic.tmpl", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	r, err := tmpl.Render(testState())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Missing) > 0 {
		t.Fatalf("missing %v", r.Missing)
	}
	wantQueries := []model.Query{
		model.LocalCatalog,
		keyQ("service/haproxy/maxconn"),
		keyQ("service/haproxy/mode"),
		prefixQ("service/haproxy/timeouts"),
	}
	if !slices.Equal(r.Queries, wantQueries) {
		t.Errorf("queries = %v, want %v", r.Queries, wantQueries)
	}
	golden(t, "classic", r.Config)
	haproxyCheck(t, r.Config)
}

// TestGoldenConfigs renders one HAProxy configuration per feature area
// into testdata/*.cfg and has the real HAProxy check it.
func TestGoldenConfigs(t *testing.T) {
	tests := []struct {
		name string
		opts func(*Options)
	}{
		{name: "health"},
		{name: "dc"},
		{name: "kv"},
		{name: "scratch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions()
			if tt.opts != nil {
				tt.opts(&opts)
			}
			tmpl, err := Parse(filepath.Join("testdata", tt.name+".tmpl"), opts)
			if err != nil {
				t.Fatal(err)
			}
			r, err := tmpl.Render(testState())
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Missing) > 0 {
				t.Fatalf("missing %v", r.Missing)
			}
			golden(t, tt.name, r.Config)
			haproxyCheck(t, r.Config)
		})
	}
}

func TestSameStateRendersSameBytes(t *testing.T) {
	tmpl, err := Parse("testdata/classic.tmpl", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	first, err := tmpl.Render(testState())
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		again, err := tmpl.Render(testState())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first.Config, again.Config) || !slices.Equal(first.Queries, again.Queries) {
			t.Fatal("two renders of the same state differ")
		}
	}
}

func TestMissingQueriesRenderZeroValuesAndAreReported(t *testing.T) {
	tmpl, err := Parse("testdata/classic.tmpl", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	// Only the catalog has arrived: the KV queries are missing, and the
	// functions reading them render their zero values.
	r, err := tmpl.Render(model.NewState(map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: localCatalog()},
	}))
	if err != nil {
		t.Fatal(err)
	}
	wantMissing := []model.Query{keyQ("service/haproxy/maxconn"), keyQ("service/haproxy/mode"), prefixQ("service/haproxy/timeouts")}
	if !slices.Equal(r.Missing, wantMissing) {
		t.Errorf("missing = %v, want %v", r.Missing, wantMissing)
	}
	if len(r.Queries) != 4 {
		t.Errorf("queries = %v, want the catalog and the three KV queries", r.Queries)
	}
	golden(t, "missing", r.Config)
}

func TestMissingHidesErrorsFromZeroValues(t *testing.T) {
	// index on the empty list of a missing catalog fails; the caller will
	// render again once the data is there, so it is no error yet.
	const text = `{{ (index (service "web@dc9") 0).Address }}`
	r, err := renderText(t, "idx.tmpl", text, testOptions(), testState())
	if err != nil {
		t.Fatalf("error with a query missing: %v", err)
	}
	if want := []model.Query{{Kind: model.QueryCatalog, Datacenter: "dc9"}}; !slices.Equal(r.Missing, want) {
		t.Errorf("missing = %v, want %v", r.Missing, want)
	}
}

func TestRender(t *testing.T) {
	tests := []struct {
		name string
		text string
		opts func(*Options)
		want string
	}{
		// Health filters.
		{name: "default filter is passing", text: `{{range service "web"}}{{.Node}} {{end}}`, want: "node1 node2 "},
		{name: "filter in the name", text: `{{range service "web|passing,warning"}}{{.Node}} {{end}}`, want: "node1 node2 node3 "},
		{name: "filter as second argument", text: `{{range service "web" "passing,warning"}}{{.Node}} {{end}}`, want: "node1 node2 node3 "},
		{name: "any", text: `{{range service "web" "any"}}{{.Node}}:{{.Status}} {{end}}`, want: "node1:passing node2:passing node3:warning node4:critical node5:maintenance "},
		{name: "critical only", text: `{{range service "web|critical"}}{{.Node}} {{end}}`, want: "node4 "},
		{name: "maintenance only", text: `{{range service "web|maintenance"}}{{.Node}} {{end}}`, want: "node5 "},
		{name: "default filter from options", text: `{{range service "web"}}{{.Node}} {{end}}`,
			opts: func(o *Options) { o.DefaultHealth = []string{"passing", "warning"} }, want: "node1 node2 node3 "},
		{name: "explicit filter beats options", text: `{{range service "web|passing"}}{{.Node}} {{end}}`,
			opts: func(o *Options) { o.DefaultHealth = []string{"any"} }, want: "node1 node2 "},
		{name: "tag", text: `{{range service "http.web"}}{{.Node}} {{end}}`, want: "node1 "},
		{name: "tag with dots", text: `{{range service "a.b.web"}}{{.Node}} {{end}}`, want: ""},
		{name: "near is accepted and keeps the order", text: `{{range service "web~_agent"}}{{.Node}} {{end}}`, want: "node1 node2 "},
		{name: "empty name", text: `{{range service ""}}x{{end}}`, want: ""},

		// Datacenters.
		{name: "service in another datacenter", text: `{{range service "web@dc2"}}{{.Node}} {{.Address}} {{.NodeDatacenter}}{{end}}`, want: "far1 192.0.2.1 dc2"},
		{name: "tag and datacenter", text: `{{range service "release.web@dc2|any"}}{{.Node}}{{end}}`, want: "far1"},
		{name: "services in another datacenter", text: `{{range services "@dc2"}}{{.Name}}{{end}}`, want: "web"},
		{name: "nodes in another datacenter", text: `{{range nodes "@dc2"}}{{.Node}}/{{.Datacenter}}{{end}}`, want: "far1/dc2"},
		{name: "node in another datacenter", text: `{{with node "far1@dc2"}}{{.Node.Address}}{{end}}`, want: "192.0.2.1"},
		{name: "datacenters sorted", text: `{{datacenters}}`, want: "[dc1 dc2]"},

		// Result fields.
		{name: "health service fields", text: `{{with index (service "web") 0}}{{.ID}} {{.Name}} {{.Node}} {{.NodeAddress}} {{.NodeDatacenter}} {{.Port}} {{.Weights.Passing}}/{{.Weights.Warning}} {{.ServiceMeta.version}} {{.Tags}} {{.Status}} {{.Source}}{{end}}`,
			want: "web-node1 web node1 10.0.0.1 dc1 8080 5/1 2 [http release] passing consul"},
		{name: "tags contain", text: `{{range service "web"}}{{if .Tags.Contains "http"}}{{.Node}}{{end}}{{end}}`, want: "node1"},
		{name: "services merge and sort tags", text: `{{range services}}{{.Name}}={{join "," .Tags}};{{end}}`, want: "api=canary,http;db=primary;web=http,release;"},
		{name: "nodes", text: `{{range nodes}}{{.Node}}@{{.Address}} {{end}}`, want: "node1@10.0.0.1 node2@10.0.0.2 node3@10.0.0.3 "},
		{name: "node without name is the local node", text: `{{with node}}{{.Node.Node}} {{.Node.Meta.rack}}:{{range .Services}} {{.Service}}{{end}}{{end}}`, want: "node1 r1: api web"},
		{name: "unknown node is nil", text: `{{with node "nope"}}found{{else}}none{{end}}`, want: "none"},
		{name: "byTag", text: `{{range $tag, $s := service "web|any" | byTag}}{{$tag}}={{len $s}} {{end}}`, want: "http=1 release=4 "},
		{name: "byPort", text: `{{range $p, $s := service "api" | byPort}}{{$p}}={{len $s}}{{end}}`, want: "9090=2"},

		// KV.
		{name: "key", text: `{{key "service/haproxy/maxconn"}}`, want: "4096"},
		{name: "key with leading slash", text: `{{key "/service/haproxy/maxconn"}}`, want: "4096"},
		{name: "keyExists", text: `{{keyExists "service/haproxy/mode"}} {{keyExists "absent"}}`, want: "true false"},
		{name: "keyOrDefault", text: `{{keyOrDefault "service/haproxy/mode" "tcp"}} {{keyOrDefault "absent" "d1"}} {{keyOrDefault "empty" "d2"}}`, want: "http d1 d2"},
		{name: "ls keeps direct children", text: `{{range ls "service/haproxy/timeouts"}}{{.Key}}={{.Value}} {{end}}`, want: "client=30s connect=5s server=30s "},
		{name: "tree keeps every key", text: `{{range tree "service/haproxy/timeouts"}}{{.Key}} {{end}}`, want: "client connect extra/ignored-by-ls server "},
		{name: "tree path is the full key", text: `{{range tree "config"}}{{.Path}} {{end}}`, want: "config/admin/port config/maxconns config/minconns config/weights/node1 "},
		{name: "ls on an empty prefix", text: `{{len (ls "nothing")}}`, want: "0"},
		{name: "explode", text: `{{with tree "config" | explode}}{{.admin.port}} {{.maxconns}}{{end}}`, want: "1234 5"},
		{name: "byKey", text: `{{range $k, $p := tree "config" | byKey}}{{$k}}:{{range $p}}{{.Key}}={{.Value}},{{end}} {{end}}`, want: "admin:port=1234, weights:node1=10, "},
		{name: "toJSON of exploded tree", text: `{{tree "config" | explode | toJSON}}`, want: `{"admin":{"port":"1234"},"maxconns":"5","minconns":"2","weights":{"node1":"10"}}`},
		{name: "toTOML of exploded tree", text: `{{tree "config" | explode | toTOML}}`, want: "maxconns = \"5\"\nminconns = \"2\"\n\n[admin]\n  port = \"1234\"\n\n[weights]\n  node1 = \"10\""},
		{name: "toYAML of exploded tree", text: `{{tree "config" | explode | toYAML}}`, want: "admin:\n  port: \"1234\"\nmaxconns: \"5\"\nminconns: \"2\"\nweights:\n  node1: \"10\""},

		// Scratch.
		{name: "scratch set and get", text: `{{scratch.Set "a" "1"}}{{scratch.SetX "a" "2"}}{{scratch.Get "a"}} {{scratch.Key "a"}} {{scratch.Key "b"}}`, want: "1 true false"},
		{name: "scratch maps", text: `{{scratch.MapSet "m" "b" 2}}{{scratch.MapSet "m" "a" 1}}{{scratch.MapSetX "m" "a" 9}}{{scratch.MapValues "m"}}`, want: "[1 2]"},
		{name: "scratch values", text: `{{scratch.Set "x" 1}}{{scratch.Set "y" 2}}{{range $k, $v := scratch.Values}}{{$k}}={{$v}} {{end}}`, want: "x=1 y=2 "},
		{name: "scratch explodeMap", text: `{{scratch.MapSet "e" "foo/bar" "a"}}{{scratch.MapSet "e" "foo/baz" "b"}}{{scratch.Get "e" | explodeMap | toJSON}}`, want: `{"foo":{"bar":"a","baz":"b"}}`},

		// Local reads.
		{name: "env", text: `{{env "CLUSTER"}} [{{env "UNSET"}}]`, want: "blue []"},
		{name: "envOrDefault keeps an empty value", text: `{{envOrDefault "EMPTY" "d"}}|{{envOrDefault "UNSET" "d"}}`, want: "|d"},
		{name: "sprig_env goes through LookupEnv", text: `{{sprig_env "CLUSTER"}} {{sprig_expandenv "x-$CLUSTER"}}`, want: "blue x-blue"},
		{name: "file is relative to Dir", text: `{{file "file.txt" | trimSpace}}`, want: "contents of a file"},
		{name: "timestamp is Options.Now", text: `{{timestamp}} {{timestamp "unix"}} {{timestamp "2006-01-02"}}`, want: "2024-05-06T07:08:09Z 1714979289 2024-05-06"},
		{name: "executeTemplate", text: `{{define "x"}}<{{.}}>{{end}}{{executeTemplate "x" 42}}`, want: "<42>"},
		{name: "sprig", text: `{{sprig_upper "a"}} {{sprig_trimAll "-" "-b-"}}`, want: "A b"},
		{name: "skip renders nothing", text: `a{{skip "why"}}b`, want: "ab"},
		{name: "custom delimiters", text: `[[key "service/haproxy/mode"]] {{x}}`,
			opts: func(o *Options) { o.LeftDelim, o.RightDelim = "[[", "]]" }, want: "http {{x}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions()
			if tt.opts != nil {
				tt.opts(&opts)
			}
			r, err := renderText(t, "t.tmpl", tt.text, opts, testState())
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Missing) > 0 {
				t.Fatalf("missing %v", r.Missing)
			}
			if got := string(r.Config); got != tt.want {
				t.Errorf("got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestQueriesAskedFor(t *testing.T) {
	tests := []struct {
		text string
		want []model.Query
	}{
		{`{{service "web"}}`, []model.Query{model.LocalCatalog}},
		{`{{service "web@dc2"}}`, []model.Query{{Kind: model.QueryCatalog, Datacenter: "dc2"}}},
		{`{{services}}{{nodes}}{{node}}`, []model.Query{model.LocalCatalog}},
		{`{{key "a/b@dc3"}}`, []model.Query{{Kind: model.QueryKey, Key: "a/b", Datacenter: "dc3"}}},
		{`{{ls "a"}}{{tree "a"}}`, []model.Query{prefixQ("a")}},
		{`{{datacenters}}`, []model.Query{{Kind: model.QueryDatacenters}}},
		{`{{datacenters true}}`, []model.Query{{Kind: model.QueryDatacenters, Key: DatacentersIgnoreInaccessible}}},
		{`{{env "X"}}{{file "file.txt"}}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			r, err := renderText(t, "q.tmpl", tt.text, testOptions(), model.NewState(nil))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.Queries, tt.want) {
				t.Errorf("queries = %v, want %v", r.Queries, tt.want)
			}
			if !slices.Equal(r.Missing, tt.want) {
				t.Errorf("missing = %v, want %v (the state is empty)", r.Missing, tt.want)
			}
		})
	}
}

func TestRenderErrorsNameFileAndLine(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"absent key", "a\n\n{{key \"absent\"}}", []string{"e.tmpl:3:", `key "absent" does not exist`}},
		{"safeLs on an empty prefix", "{{range safeLs \"nothing\"}}{{end}}", []string{"e.tmpl:1:", `safeLs "nothing": no keys`}},
		{"safeTree on an empty prefix", "\n{{range safeTree \"nothing\"}}{{end}}", []string{"e.tmpl:2:", `safeTree "nothing": no keys`}},
		{"computed bad filter", "\n\n\n{{$f := \"bogus\"}}{{service \"web\" $f}}", []string{"e.tmpl:4:", `invalid health filter "bogus"`}},
		{"computed bad service name", "{{$n := \"a b\"}}{{service $n}}", []string{"e.tmpl:1:", `invalid service "a b"`}},
		{"bad base64", "\n{{base64Decode \"%%%\"}}", []string{"e.tmpl:2:", "base64Decode"}},
		{"mustEnv of an empty variable", "{{mustEnv \"EMPTY\"}}", []string{"e.tmpl:1:", "required environment variable EMPTY is empty"}},
		{"missing file", "{{file \"nope.txt\"}}", []string{"e.tmpl:1:", "nope.txt"}},
		{"integer division by zero", "{{divide 0 1}}", []string{"e.tmpl:1:", "division by zero"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := renderText(t, "e.tmpl", tt.text, testOptions(), testState())
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestUnsupportedFunctionFailsAtParse(t *testing.T) {
	_, err := Parse("testdata/unsupported.tmpl", testOptions())
	var ue *UnsupportedError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v, want an *UnsupportedError", err)
	}
	if !errors.Is(err, ErrUnsupported) {
		t.Error("not errors.Is ErrUnsupported")
	}
	if ue.File != "testdata/unsupported.tmpl" || ue.Line != 4 || ue.Func != "secret" {
		t.Errorf("got %+v, want secret at testdata/unsupported.tmpl line 4", ue)
	}
	goldenFile(t, "unsupported.err", []byte(err.Error()+"\n"))
}

func TestUnsupportedFunctionsAreAllRefused(t *testing.T) {
	for name := range unsupported {
		t.Run(name, func(t *testing.T) {
			text := "x\n{{if true}}{{ " + name + " }}{{end}}"
			_, err := parseText("u.tmpl", text, testOptions())
			var ue *UnsupportedError
			if !errors.As(err, &ue) || ue.Func != name || ue.Line != 2 {
				t.Fatalf("err = %v, want an UnsupportedError for %s on line 2", err, name)
			}
		})
	}
}

func TestUnsupportedFunctionFoundEverywhere(t *testing.T) {
	tests := map[string]string{
		"in a define":          `{{define "x"}}{{plugin "p"}}{{end}}`,
		"in a pipeline":        `{{"a" | writeToFile "/tmp/x" "" "" "0644"}}`,
		"in a range else":      `{{range service "web"}}{{else}}{{caLeaf "web"}}{{end}}`,
		"as an argument":       `{{printf "%s" (sockaddr "GetPrivateIP")}}`,
		"in a with condition":  `{{with nomadService "x"}}{{end}}`,
		"impure sprig":         `{{sprig_randAlpha 5}}`,
		"in a template action": `{{define "y"}}{{.}}{{end}}{{template "y" (secrets "s")}}`,
	}
	for name, text := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := parseText("u.tmpl", text, testOptions())
			if !errors.Is(err, ErrUnsupported) {
				t.Fatalf("err = %v, want ErrUnsupported", err)
			}
		})
	}
}

func TestUnknownFunctionFailsAtParse(t *testing.T) {
	_, err := parseText("k.tmpl", "\n{{ nosuchfunc }}", testOptions())
	if err == nil || !strings.Contains(err.Error(), `k.tmpl:2: function "nosuchfunc" not defined`) {
		t.Fatalf("err = %v", err)
	}
}

func TestLiteralArgumentsAreCheckedAtParse(t *testing.T) {
	tests := []struct {
		text string
		want string
	}{
		{`{{service "web|bogus"}}`, `a.tmpl:1:2: service: service "web|bogus": invalid health filter "bogus"`},
		{"\n{{service \"web\" \"passing\" \"x\"}}", `a.tmpl:2:2: service: invalid service`},
		{`{{service "my service"}}`, `invalid service "my service"`},
		{`{{service "web?ns=team"}}`, `namespaces, partitions and peers are not supported`},
		{`{{key "a/b?ns=team"}}`, `namespaces, partitions and peers are not supported`},
		{`{{ls "a@dc 1"}}`, `invalid key "a@dc 1"`},
		{`{{nodes "dc2"}}`, `invalid nodes argument "dc2"`},
		{`{{services "dc2"}}`, `invalid services argument "dc2"`},
		{`{{node "a b"}}`, `invalid node "a b"`},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			_, err := parseText("a.tmpl", tt.text, testOptions())
			var ae *ArgError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want an *ArgError containing %q", err, tt.want)
			}
		})
	}
	// A piped argument is only known at render time.
	if _, err := parseText("a.tmpl", `{{"web|bogus" | service}}`, testOptions()); err != nil {
		t.Errorf("piped argument refused at parse: %v", err)
	}
}

func TestInvalidDefaultHealthFailsAtParse(t *testing.T) {
	opts := testOptions()
	opts.DefaultHealth = []string{"passing", "healthy"}
	if _, err := parseText("h.tmpl", "x", opts); err == nil || !strings.Contains(err.Error(), `"healthy"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestSkippedIsReported(t *testing.T) {
	r, err := renderText(t, "s.tmpl", `{{range service "web|any"}}{{if ne .Status "passing"}}{{skip "service web: node" .Node "is" .Status}}{{end}}{{end}}`, testOptions(), testState())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"service web: node node3 is warning", "service web: node node4 is critical", "service web: node node5 is maintenance"}
	if !slices.Equal(r.Skipped, want) {
		t.Errorf("skipped = %q, want %q", r.Skipped, want)
	}
}

func TestScratchIsPerRender(t *testing.T) {
	tmpl, err := parseText("s.tmpl", `{{scratch.Get "n"}}{{scratch.Set "n" "set"}}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r, err := tmpl.Render(testState())
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Config) != "<no value>" {
			t.Fatalf("second render saw the first one's scratch: %q", r.Config)
		}
	}
}

func TestFileIsReadAtEveryRender(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Dir = dir
	tmpl, err := parseText("f.tmpl", `{{file "f"}}`, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"one", "two"} {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := tmpl.Render(testState())
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Config) != want {
			t.Errorf("got %q, want %q", r.Config, want)
		}
	}
}

func BenchmarkRenderClassic(b *testing.B) {
	tmpl, err := Parse("testdata/classic.tmpl", testOptions())
	if err != nil {
		b.Fatal(err)
	}
	st := testState()
	for b.Loop() {
		if _, err := tmpl.Render(st); err != nil {
			b.Fatal(err)
		}
	}
}

func TestErrOnMissingKey(t *testing.T) {
	const text = `{{with index (service "web") 0}}[{{.ServiceMeta.nope}}]{{end}}`
	r, err := renderText(t, "m.tmpl", text, testOptions(), testState())
	if err != nil || string(r.Config) != "[]" {
		t.Fatalf("default: %q, %v; want the zero value", r.Config, err)
	}
	opts := testOptions()
	opts.ErrOnMissingKey = true
	if _, err := renderText(t, "m.tmpl", text, opts, testState()); err == nil || !strings.Contains(err.Error(), `map has no entry for key "nope"`) {
		t.Fatalf("with ErrOnMissingKey: %v", err)
	}
}

func TestConcurrentRendersShareNothing(t *testing.T) {
	tmpl, err := parseText("c.tmpl", `{{scratch.Set "x" (len (service "web"))}}{{scratch.Get "x"}}{{range ls "service/haproxy/timeouts"}}{{.Key}}{{end}}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	st := testState()
	done := make(chan string)
	for range 8 {
		go func() {
			r, err := tmpl.Render(st)
			if err != nil {
				done <- err.Error()
				return
			}
			done <- string(r.Config)
		}()
	}
	for range 8 {
		if got := <-done; got != "2clientconnectserver" {
			t.Errorf("got %q", got)
		}
	}
}

// Renders one at a time execute one clone of the parsed template, its
// functions calling the render at hand: a clone per render copied every
// function (two maps of them), 80 allocations and 84 KB per render of a
// one-line template, a fifth of what a change allocated at 100 × 10. A
// render while another holds that clone gets one of its own. The
// function that runs a cut fragment stays unknown to a template's text.
func TestRendersOneAtATimeShareOneClone(t *testing.T) {
	tmpl, err := parseText("a.tmpl", `{{ key "service/haproxy/maxconn" }}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	st := testState()
	render := func() string {
		r, err := tmpl.Render(st)
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Config)
	}
	want := render()
	if n := testing.AllocsPerRun(20, func() { render() }); n > 40 {
		t.Errorf("%.0f allocations per render of a one-line template, want at most 40", n)
	}
	tmpl.bound.mu.Lock() // another render holds the kept clone
	if got := render(); got != want {
		t.Errorf("a render beside another rendered %q, want %q", got, want)
	}
	tmpl.bound.mu.Unlock()
	if got := render(); got != want {
		t.Errorf("rendered %q after, want %q", got, want)
	}
	if _, err := parseText("f.tmpl", `{{ `+fragmentFunc+` "x" }}`, testOptions()); err == nil {
		t.Errorf("a template calling %s parsed", fragmentFunc)
	}
}
