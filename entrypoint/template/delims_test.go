package template

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func delimState() model.State {
	st := testResults()
	st[keyQ("raw")] = model.Result{Pairs: []model.KVPair{kv("raw", "{{ not rendered }}")}}
	return model.NewState(st)
}

// consul-template's left_delimiter and right_delimiter reach the parser
// (SEAMLESS_TEMPLATE_DELIMITERS), and output that still holds a pair of
// delimiters is reported once per template: either a template written for
// other delimiters or data that looks like an action.
func TestDelimiters(t *testing.T) {
	tests := []struct {
		name, text  string
		left, right string
		want        string // rendered
		warn        string // in the log, "" for nothing
	}{
		{"custom delimiters render", "maxconn [[ key \"service/haproxy/maxconn\" ]] {{ kept }}\n", "[[", "]]",
			"maxconn 4096 {{ kept }}\n", ""},
		{"a [[ ]] template without the variable is suspicious", "line1\nmaxconn [[ key \"service/haproxy/maxconn\" ]]\n", "", "",
			"line1\nmaxconn [[ key \"service/haproxy/maxconn\" ]]\n", `line=2 text="[[ key \"service/haproxy/maxconn\" ]]" hint="a template written for other delimiters? SEAMLESS_TEMPLATE_DELIMITERS='[[ ]]'`},
		{"a value that looks like an action is suspicious", "x {{ key \"raw\" }}\n", "", "",
			"x {{ not rendered }}\n", `line=1 text="{{ not rendered }}"`},
		{"an ordinary configuration is not", "x {{ key \"service/haproxy/maxconn\" }} %[req.hdr(host)] [a] ]]\n", "", "",
			"x 4096 %[req.hdr(host)] [a] ]]\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			opts := testOptions()
			opts.LeftDelim, opts.RightDelim = tt.left, tt.right
			opts.Log = slog.New(slog.NewTextHandler(&logs, nil))
			tmpl, err := parseText("d.tmpl", tt.text, opts)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				r, err := tmpl.Render(delimState())
				if err != nil {
					t.Fatal(err)
				}
				if string(r.Config) != tt.want {
					t.Fatalf("rendered %q, want %q", r.Config, tt.want)
				}
			}
			got := logs.String()
			if tt.warn == "" {
				if got != "" {
					t.Errorf("unexpected log: %s", got)
				}
				return
			}
			if !strings.Contains(got, tt.warn) || !strings.Contains(got, "template=d.tmpl") {
				t.Errorf("log %q does not hold %q and the template's name", got, tt.warn)
			}
			if n := strings.Count(got, "level=WARN"); n != 1 {
				t.Errorf("%d warnings for the same template, want 1: %s", n, got)
			}
		})
	}
}
