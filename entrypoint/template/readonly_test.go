package template

import (
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// A template that calls only functions that cannot write into what they
// are handed gets the instances the render keeps: two `service` calls
// hand it the same HealthServices. One that calls a function that could
// (a sprig function, scratch, a deep merge) gets copies of its own, as
// TestAMergeWritesNothingTheNextRenderReads requires.
func TestOnlyAReadOnlyTemplateIsHandedTheKeptInstances(t *testing.T) {
	const same = `{{range service "web"}}{{printf "%p" .}} {{end}}|{{range service "web"}}{{printf "%p" .}} {{end}}`
	st := perService([]model.Instance{instanceOf("web", 1, 8080), instanceOf("web", 2, 9090)})
	for _, c := range []struct {
		name, extra string
		readOnly    bool
	}{
		{"reads only", `{{with service "web"}}{{(index . 0).Tags.Contains "x"}}{{end}}{{key "k" | toLower}}{{haproxyName "x"}}`, true},
		{"a sprig function", `{{sprig_upper "x"}}`, false},
		{"scratch", `{{scratch.Set "x" 1}}`, false},
		{"a deep merge", `{{$_ := mergeMap (parseJSON "{}") (parseJSON "{}")}}`, false},
		{"call", `{{if false}}{{call .}}{{end}}`, false},
	} {
		tmpl, err := parseText("r.tmpl", same+c.extra, testOptions())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if tmpl.readOnly != c.readOnly {
			t.Errorf("%s: readOnly %v, want %v", c.name, tmpl.readOnly, c.readOnly)
		}
		r, err := tmpl.Render(st)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		first, rest, _ := strings.Cut(string(r.Config), "|")
		second := rest[:min(len(first), len(rest))]
		if (first == second) != c.readOnly {
			t.Errorf("%s: the two service calls handed %q and %q; the same instances: %v, want %v",
				c.name, first, second, first == second, c.readOnly)
		}
	}
}
