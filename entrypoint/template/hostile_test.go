package template

import (
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The README's classic template prints .Node and .Address raw. A hostile
// registration (the field test's Consul accepted this ServiceAddress) is
// left out before the template sees it, with a reason naming it; the other
// instances render and HAProxy accepts the result (issue 10, item 3).
func TestClassicTemplateLeavesOutHostileRegistrations(t *testing.T) {
	hostile := []struct {
		id      string
		mutate  func(*model.Instance)
		because string
	}{
		{"redir", func(in *model.Instance) { in.Address = "10.0.0.1:80 redir http://evil.example #" }, "neither an IP address nor a DNS name"},
		{"spacenode", func(in *model.Instance) { in.Node = "node9 10.0.0.9:80 backup" }, "node name has the byte 0x20"},
		{"unspecified", func(in *model.Instance) { in.Address = "0.0.0.0" }, "unspecified"},
		{"nbsp", func(in *model.Instance) { in.ID = "web\u00a0x" }, "instance ID has the character U+00A0"},
		{"nodeaddr", func(in *model.Instance) { in.NodeAddress = "10.0.0.9 #" }, "node address"},
		// HAProxy 2.6 cuts the line at '#', fails on an unmatched quote,
		// joins words at '\' and expands '$'.
		{"hash", func(in *model.Instance) { in.Node = "node9#x" }, "node name has the byte 0x23"},
		{"dquote", func(in *model.Instance) { in.Node = `node9"` }, "node name has the byte 0x22"},
		{"squote", func(in *model.Instance) { in.Node = "node9'" }, "node name has the byte 0x27"},
		{"backslash", func(in *model.Instance) { in.Node = `node9\` }, "node name has the byte 0x5c"},
		{"dollar", func(in *model.Instance) { in.Node = "node9${HOME}" }, "node name has the byte 0x24"},
		{"brace", func(in *model.Instance) { in.Node = "node9}" }, "node name has the byte 0x7d"},
	}
	results := testResults()
	cat := *results[model.LocalCatalog].Catalog
	cat.Instances = slices.Clone(cat.Instances)
	for _, h := range hostile {
		in := model.Instance{Source: "consul", Name: "web", ID: h.id, Node: "node9", NodeAddress: "10.0.0.9",
			Address: "10.0.0.9", Port: 8080, Status: model.StatusPassing, Tags: []string{"release", "http"}}
		h.mutate(&in)
		cat.Instances = append(cat.Instances, in)
	}
	model.SortCatalog(&cat)
	results[model.LocalCatalog] = model.Result{Catalog: &cat}

	tmpl, err := Parse("testdata/classic.tmpl", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	r, err := tmpl.Render(model.NewState(results))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"evil", "redir", "10.0.0.9", "node9", "backup", "0.0.0.0"} {
		if strings.Contains(string(r.Config), bad) {
			t.Errorf("the hostile registration reached the configuration (%q):\n%s", bad, r.Config)
		}
	}
	for _, h := range hostile {
		if !slices.ContainsFunc(r.Skipped, func(s string) bool {
			return strings.HasPrefix(s, `service "web" instance "`) && strings.Contains(s, h.because) && strings.HasSuffix(s, "instance left out")
		}) {
			t.Errorf("instance %s: no report saying %q: %q", h.id, h.because, r.Skipped)
		}
	}
	// What the catalog had before renders as it did.
	golden(t, "classic", r.Config)
	haproxyCheck(t, r.Config)
}
