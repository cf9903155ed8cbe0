package template

import (
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// multiLineState has one "web" instance whose meta holds a two-line value
// (a PEM block, as templates insert with indent) and a tag with a newline,
// beside an ordinary instance.
func multiLineState() model.State {
	cat := &model.Catalog{
		Nodes: []model.Node{{Name: "node1", Address: "10.0.0.1", Meta: map[string]string{"rack": "r1", "bad\nkey": "x"}}},
		Instances: []model.Instance{
			{Source: "consul", Name: "web", ID: "web1", Node: "node1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing,
				Tags: []string{"prod", "x\n    server evil 203.0.113.9:80"},
				Meta: map[string]string{"version": "2", "cert": "-----BEGIN-----\nAAAA\n-----END-----"}},
			{Source: "consul", Name: "web", ID: "web2", Node: "node2", Address: "10.0.0.2", Port: 80, Status: model.StatusPassing,
				Tags: []string{"prod"}, Meta: map[string]string{"version": "3"}},
		},
	}
	return model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: cat}})
}

const multiLineTemplate = `{{ range service "web" }}server {{ .Node }} {{ .Address }}:{{ .Port }} # {{ .Tags | join "," }} v{{ .ServiceMeta.version }}
{{ end }}{{ range nodes }}{{ .Node }} {{ .Meta | len }}
{{ end }}`

// A control character in one meta value or tag used to drop the whole
// instance, even from templates that never print that field. Only the
// offending key or tag is left out now, with a line naming the service,
// the instance and the key.
func TestControlCharacterLeavesOutOnlyTheKey(t *testing.T) {
	r, err := renderText(t, "multi.tmpl", multiLineTemplate, testOptions(), multiLineState())
	if err != nil {
		t.Fatal(err)
	}
	want := "server node1 10.0.0.1:80 # prod v2\nserver node2 10.0.0.2:80 # prod v3\nnode1 1\n"
	if string(r.Config) != want {
		t.Errorf("config:\n%s\nwant:\n%s", r.Config, want)
	}
	for _, s := range []string{
		`service "web" instance "web1": meta "cert" has a control character; key left out`,
		`service "web" instance "web1": tag "x\n    server evil 203.0.113.9:80" has a control character; tag left out`,
		`node "node1": meta "bad\nkey" has a control character; key left out`,
	} {
		if !slices.Contains(r.Skipped, s) {
			t.Errorf("no report %q in %q", s, r.Skipped)
		}
	}
}

// With Options.RawMeta (SEAMLESS_TEMPLATE_RAW_META), meta values keep their
// control characters, so that a template can insert a multi-line value
// with indent; tags and meta keys are still filtered.
func TestRawMetaKeepsMultiLineValues(t *testing.T) {
	opts := testOptions()
	opts.RawMeta = true
	text := `{{ range service "web" }}{{ with .ServiceMeta.cert }}  cert:
{{ . | indent 4 }}
{{ end }}{{ .Tags | join "," }}
{{ end }}`
	r, err := renderText(t, "raw.tmpl", text, opts, multiLineState())
	if err != nil {
		t.Fatal(err)
	}
	want := "  cert:\n    -----BEGIN-----\n    AAAA\n    -----END-----\nprod\nprod\n"
	if string(r.Config) != want {
		t.Errorf("config:\n%q\nwant:\n%q", r.Config, want)
	}
	if len(r.Skipped) != 2 || !strings.Contains(r.Skipped[0]+r.Skipped[1], "tag left out") {
		t.Errorf("skipped = %q, want the tag and the node meta key left out", r.Skipped)
	}
}
