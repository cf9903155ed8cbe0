package template

import (
	"strings"
	"testing"
)

// Origin maps each line of the rendered file back to the template line
// that wrote it, through ranges, trimmed actions, multi-line values and
// defined templates, so that an error HAProxy reports in the rendered
// file names the template line to fix.
func TestOriginMapsRenderedLinesToTemplateLines(t *testing.T) {
	text := `{{- /* line 1 */ -}}
global
    maxconn {{ key "service/haproxy/maxconn" }}
{{ range service "web" }}
    server {{ .Node }} {{ .Address }}:{{ .Port }}
{{- end }}
{{ template "tail" . }}
{{ define "tail" }}defaults
    mode {{ key "service/haproxy/mode" }}
{{ end }}`
	tmpl, err := parseText("o.tmpl", text, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	r, err := tmpl.Render(testState())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{ // the first words of a rendered line: its template line
		"global": 2, "maxconn 4096": 3, "server node1": 5, "server node2": 5, "defaults": 8, "mode http": 9,
	}
	matched := 0
	for i, line := range strings.Split(strings.TrimSuffix(string(r.Config), "\n"), "\n") {
		got, ok := tmpl.Origin(r.Config, i+1)
		if !ok {
			t.Fatalf("no origin for line %d %q", i+1, line)
		}
		for prefix, w := range want {
			if !strings.HasPrefix(strings.TrimSpace(line), prefix) {
				continue
			}
			matched++
			if got != w {
				t.Errorf("line %d %q: template line %d, want %d", i+1, line, got, w)
			}
		}
	}
	if matched < len(want) {
		t.Errorf("only %d lines checked in:\n%s", matched, r.Config)
	}
	if _, ok := tmpl.Origin([]byte("something else\n"), 1); ok {
		t.Error("an origin for bytes the template did not render last")
	}
}
