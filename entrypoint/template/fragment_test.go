package template

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// peerTemplate is the classic template of the peer benchmark.
const peerTemplate = `global
    maxconn {{ keyOrDefault "service/haproxy/maxconn" "4096" }}
frontend http-in
    bind :80{{ range services }}
    use_backend {{ .Name }} if { hdr(host) -i {{ .Name }}.example }{{ end }}
{{ range services }}
backend {{ .Name }}
    balance roundrobin{{ range service .Name }}
    server {{ .ID }} {{ .Address }}:{{ .Port }}{{ end }}
{{ end }}`

// fragmentTemplates are templates with ranges over `services` that are cut
// into fragments, each with what its body reads.
var fragmentTemplates = map[string]string{
	"classic": peerTemplate,
	"index and tags": `{{ range $i, $s := services }}{{ $i }} {{ $s.Name }}{{ if $s.Tags.Contains "http" }} http{{ end }}:{{ range service (printf "http.%s|any" $s.Name) }} {{ .ID }}/{{ .Status }}{{ end }}
{{ else }}no services
{{ end }}`,
	"skip, with, locals and break": `{{ range services }}{{ $n := len (service .Name) }}{{ with service .Name }}{{ len . }}{{ else }}{{ skip "service" .Name "has no passing instance" }}{{ end }}{{ range $j, $e := service (printf "%s|passing,warning" .Name) }}{{ if ge $j 2 }}{{ break }}{{ end }} {{ $e.Node }}{{ end }} {{ $n }}
{{ end }}`,
	"defined twice": `{{ define "backends" }}{{ range services }}{{ .Name }}={{ len (service .Name) }} {{ end }}{{ end }}a: {{ template "backends" }}
b: {{ template "backends" }}
local in dc2: {{ range services }}{{ .Name }}={{ len (service (printf "%s@dc2" .Name)) }} {{ end }}
dc2: {{ range services "@dc2" }}{{ .Name }}:{{ range service (printf "%s@dc2" .Name) }} {{ .Port }}{{ end }} {{ end }}`,
	"names shadowed and reused": `{{ ($x := parseJSON "{\"k\":\"v\"}").k }}{{ range services }}[{{ $x := .Name }}{{ $x }}]{{ if true }}{{ $x := 1 }}{{ $x }}{{ end }}{{ $x }}
{{ end }}{{ range $i, $s := services }}{{ $x := $s.Name }}{{ $x }}={{ len (service $x) }} {{ end }}{{ $x }}`,
	"tags alone": `{{ range $s := services }}{{ $s.Name }} {{ .Tags }}
{{ end }}`,
	"index without else": `{{ range $i, $s := services }}{{ $i }}:{{ $s.Name }}={{ len (service $s.Name) }} {{ end }}`,
	"through executeTemplate": `{{ define "b" }}{{ range services }}{{ .Name }}={{ len (service .Name) }} {{ end }}{{ end }}[{{ executeTemplate "b" | toUpper }}]
{{ range services }}<{{ executeTemplate "b" | toUpper }}>{{ .Name }} {{ end }}`,
	"missing key": `{{ range services }}{{ range service .Name }}{{ .ServiceMeta.weight }} {{ end }}{{ end }}`,
}

// The fragments of a cut template, kept from render to render, render what
// the template does uncut, whatever changes between renders: lists moved,
// added, removed, tags and health changed, a datacenter's catalog missing,
// a body that fails.
func TestFragmentsRenderAsTheUncutTemplate(t *testing.T) {
	for name, text := range fragmentTemplates {
		t.Run(name, func(t *testing.T) {
			opts := testOptions()
			opts.ErrOnMissingKey = name == "missing key"
			cut, err := parseText("f.tmpl", text, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(cut.frags) == 0 {
				t.Fatalf("nothing was cut out of %s", name)
			}
			opts.uncut = true
			uncut, err := parseText("f.tmpl", text, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(uncut.frags) != 0 {
				t.Fatal("the reference template was cut too")
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(text))))
			statuses := []string{model.StatusPassing, model.StatusWarning, model.StatusCritical}
			newList := func(name string) []model.Instance {
				var l []model.Instance
				for node := range 1 + rng.IntN(4) {
					var tags []string
					if rng.IntN(2) == 0 {
						tags = append(tags, "http")
					}
					in := instanceOf(name, node+1, 8000+rng.IntN(3), tags...)
					in.Status = statuses[rng.IntN(len(statuses))]
					if rng.IntN(3) > 0 {
						in.Meta = map[string]string{"weight": fmt.Sprint(rng.IntN(3))}
					}
					if rng.IntN(10) == 0 {
						in.Tags = append(in.Tags, "bad\ntag")
					}
					l = append(l, in)
				}
				return l
			}
			lists := map[string][]model.Instance{}
			for step := range 300 {
				name := fmt.Sprintf("svc%d", rng.IntN(8))
				if rng.IntN(5) == 0 {
					delete(lists, name)
				} else {
					lists[name] = newList(name)
				}
				var ls [][]model.Instance
				for _, n := range slices.Sorted(maps.Keys(lists)) {
					ls = append(ls, lists[n])
				}
				res := map[model.Query]model.Result{model.LocalCatalog: {Catalog: model.PerService("dc1", nil, ls, 1)}}
				if rng.IntN(6) > 0 {
					res[model.Query{Kind: model.QueryCatalog, Datacenter: "dc2"}] = model.Result{Catalog: model.PerService("dc2", nil, ls, 1)}
				}
				st := model.NewState(res)
				got, gotErr := cut.Render(st)
				want, wantErr := uncut.Render(st)
				if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
					t.Fatalf("step %d: cut: %v\nuncut: %v", step, gotErr, wantErr)
				}
				if string(got.Config) != string(want.Config) || !slices.Equal(got.Skipped, want.Skipped) ||
					!slices.Equal(got.Queries, want.Queries) || !slices.Equal(got.Missing, want.Missing) {
					t.Fatalf("step %d: cut rendered\n%s\n%q %v %v\nuncut\n%s\n%q %v %v", step,
						got.Config, got.Skipped, got.Queries, got.Missing, want.Config, want.Skipped, want.Queries, want.Missing)
				}
			}
			if runs := cut.fragmentRuns.Load(); runs == 0 {
				t.Fatal("no fragment was executed")
			}
		})
	}
}

// One change among 1,000 services executes the bodies of that service
// alone: the others' outputs are the previous render's.
func TestOnlyTheChangedServiceIsRenderedAgain(t *testing.T) {
	tmpl, err := parseText("c.tmpl", fragmentTemplates["classic"], testOptions())
	if err != nil {
		t.Fatal(err)
	}
	lists := make([][]model.Instance, 1000)
	for s := range lists {
		lists[s] = []model.Instance{instanceOf(fmt.Sprintf("svc%04d", s), 1, 8080), instanceOf(fmt.Sprintf("svc%04d", s), 2, 8080)}
	}
	if _, err := tmpl.Render(perService(lists...)); err != nil {
		t.Fatal(err)
	}
	if n := tmpl.fragmentRuns.Load(); n != 2000 {
		t.Fatalf("the first render executed %d bodies, want 2 ranges × 1,000 services", n)
	}
	moved := slices.Clone(lists[500])
	moved[1].Port = 9090
	lists[500] = moved
	r, err := tmpl.Render(perService(lists...))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(r.Config), "server svc0500-2 10.0.0.2:9090") {
		t.Fatalf("the change is not rendered:\n%s", r.Config)
	}
	// The backend's body reads `service svc0500` again; the frontend's
	// reads nothing that changed.
	if n := tmpl.fragmentRuns.Load() - 2000; n != 1 {
		t.Fatalf("one change executed %d bodies, want 1", n)
	}
}

// The outputs kept are those of the services the last render read: a
// catalog whose names churn holds no more than its live services.
func TestTheOutputsOfGoneServicesAreForgotten(t *testing.T) {
	tmpl, err := parseText("c.tmpl", fragmentTemplates["classic"], testOptions())
	if err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		lists := make([][]model.Instance, 100)
		for s := range lists {
			lists[s] = []model.Instance{instanceOf(fmt.Sprintf("r%d-svc%03d", round, s), 1, 8080)}
		}
		if _, err := tmpl.Render(perService(lists[:100-round*10]...)); err != nil {
			t.Fatal(err)
		}
		if n, want := len(tmpl.runs.frags.m), 2*(100-round*10); n != want {
			t.Fatalf("round %d: %d outputs kept, want %d: two ranges × the live services", round, n, want)
		}
	}
}

// A body is cut only when its output can depend on nothing but the item,
// its index and `service` answers; anything else stays in the template.
func TestWhatIsNotCut(t *testing.T) {
	for _, c := range []struct{ name, text string }{
		{"outer variable", `{{ $p := "x" }}{{ range services }}{{ $p }}{{ end }}`},
		{"outer variable assigned", `{{ $p := "x" }}{{ range services }}{{ $p = .Name }}{{ end }}{{ $p }}`},
		{"assigning range", `{{ $i := 0 }}{{ $s := 0 }}{{ range $i, $s = services }}{{ $s.Name }}{{ end }}{{ $i }}`},
		{"the data", `{{ range services }}{{ $ }}{{ end }}`},
		{"a local shadowing an outer one", `{{ $n := 1 }}{{ range services }}{{ $n }}{{ if true }}{{ $n := 2 }}{{ $n }}{{ end }}{{ end }}`},
		{"a key", `{{ range services }}{{ key "x" }}{{ end }}`},
		{"ls", `{{ range services }}{{ range ls "x" }}{{ .Key }}{{ end }}{{ end }}`},
		{"services", `{{ range services }}{{ len services }}{{ end }}`},
		{"nodes", `{{ range services }}{{ len nodes }}{{ end }}`},
		{"env", `{{ range services }}{{ env "HOME" }}{{ end }}`},
		{"a file", `{{ range services }}{{ file "/etc/hostname" }}{{ end }}`},
		{"scratch", `{{ range services }}{{ scratch.Set "n" .Name }}{{ end }}`},
		{"sprig", `{{ range services }}{{ sprig_upper .Name }}{{ end }}`},
		{"a merge", `{{ range services }}{{ mergeMap (parseJSON "{}") (parseJSON "{}") }}{{ end }}`},
		{"another template", `{{ define "x" }}x{{ end }}{{ range services }}{{ template "x" }}{{ end }}`},
		{"executeTemplate", `{{ define "x" }}x{{ end }}{{ range services }}{{ executeTemplate "x" }}{{ end }}`},
		{"a break of its own loop", `{{ range services }}{{ break }}{{ end }}`},
		{"a range over something else", `{{ range service "web" }}{{ .Name }}{{ end }}`},
		{"an outer variable declared in a chain, read before the body's own", `{{ ($x := parseJSON "{\"k\":\"v\"}").k }}{{ range services }}[{{ $x }}]{{ if true }}{{ $x := 1 }}{{ $x }}{{ end }}{{ end }}`},
		{"an inner declaration out of scope", `{{ $n := 0 }}{{ range services }}{{ if true }}{{ $n := 1 }}{{ end }}{{ $n }}{{ end }}`},
		{"a break in an inner range's else", `{{ range services }}{{ range service .Name }}{{ else }}{{ break }}{{ end }}{{ end }}`},
	} {
		tmpl, err := parseText("n.tmpl", c.text, testOptions())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(tmpl.frags) != 0 {
			t.Errorf("%s: cut into %d fragments; want none", c.name, len(tmpl.frags))
		}
	}
	for _, c := range []struct {
		name, text string
		frags      int
	}{
		{"locals of its own and a break of an inner loop", `{{ $x := 1 }}{{ range services }}{{ $y := 2 }}{{ $y = 3 }}{{ $y }}{{ range $k, $v := service .Name }}{{ if eq $k 1 }}{{ break }}{{ end }}{{ $v.ID }}{{ end }}{{ end }}{{ $x }}`, 1},
		{"the same local name in two ranges", `{{ range services }}{{ $n := .Name }}{{ $n }}{{ end }}{{ range services }}{{ $n := .Name }}{{ $n }}{{ end }}`, 2},
		{"a local declared in parentheses", `{{ range services }}{{ ($t := .Tags).Contains "x" }}{{ $t }}{{ end }}`, 1},
		{"a local shadowing an outer one, read after it", `{{ $n := 1 }}{{ range services }}{{ $n := 2 }}{{ $n }}{{ end }}{{ $n }}`, 1},
	} {
		tmpl, err := parseText("y.tmpl", c.text, testOptions())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(tmpl.frags) != c.frags {
			t.Errorf("%s: cut into %d fragments; want %d", c.name, len(tmpl.frags), c.frags)
		}
	}
}

// A body that does not read its index is not executed again when a
// service added before it moves it.
func TestAnUnreadIndexIsNoPartOfAnItem(t *testing.T) {
	tmpl, err := parseText("i.tmpl", `{{ range $i, $s := services }}{{ $s.Name }}:{{ len (service $s.Name) }} {{ end }}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	web, api := []model.Instance{instanceOf("web", 1, 80)}, []model.Instance{instanceOf("api", 1, 80)}
	if _, err := tmpl.Render(perService(web)); err != nil {
		t.Fatal(err)
	}
	r, err := tmpl.Render(perService(api, web))
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Config) != "api:1 web:1 " {
		t.Fatalf("rendered %q", r.Config)
	}
	if n := tmpl.fragmentRuns.Load(); n != 2 {
		t.Fatalf("%d bodies executed for web then api added before it, want 2", n)
	}
}

// An error in a body reads as it would without the cut: the template's
// file, line and column, and the template's name.
func TestAFragmentsErrorNamesTheTemplateLine(t *testing.T) {
	opts := testOptions()
	opts.ErrOnMissingKey = true
	tmpl, err := parseText("e.tmpl", "global\n{{ range services }}\n  {{ range service .Name }}{{ .ServiceMeta.nope }}{{ end }}\n{{ end }}", opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.frags) != 1 {
		t.Fatalf("%d fragments, want 1", len(tmpl.frags))
	}
	st := perService([]model.Instance{instanceOf("web", 1, 80)})
	_, err = tmpl.Render(st)
	opts.uncut = true
	uncut, perr := parseText("e.tmpl", "global\n{{ range services }}\n  {{ range service .Name }}{{ .ServiceMeta.nope }}{{ end }}\n{{ end }}", opts)
	if perr != nil {
		t.Fatal(perr)
	}
	_, want := uncut.Render(st)
	if err == nil || want == nil || err.Error() != want.Error() || !strings.Contains(err.Error(), `e.tmpl:3:`) {
		t.Fatalf("error %v\nwant %v", err, want)
	}

	// Through executeTemplate, the message keeps the call's own context.
	const viaExecute = `{{ define "x" }}{{ range services }}{{ index .Tags 5 }}{{ end }}{{ end }}{{ executeTemplate "x" }}`
	opts.uncut = false
	cut, err := parseText("x.tmpl", viaExecute, opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.uncut = true
	uncut, err = parseText("x.tmpl", viaExecute, opts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cut.Render(st)
	_, want = uncut.Render(st)
	if len(cut.frags) != 1 || err == nil || want == nil || err.Error() != want.Error() {
		t.Fatalf("through executeTemplate (%d fragments): %v\nwant %v", len(cut.frags), err, want)
	}
}
