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

// findPair finds what looking at each line in turn finds: the first line
// whose first left is followed by right with something between them.
func FuzzFindPairAsLineByLine(f *testing.F) {
	for _, s := range []string{
		"a\nb {{ x }}\nc", "{{ }}\n{{ y }}", "{{\n}}", "x {{ a {{ b }}\n", "{{{{}}}}", "\n\n{{ z }}", "[[a]] {{b}}", "{{ x }}",
		"{{ " + strings.Repeat("a", maxActionLen) + " }}\n{{ b }}",
	} {
		f.Add(s, "{{", "}}")
	}
	f.Add("a\n[[ b ]]", "[[", "]]")
	f.Add("a\nb", "a\nb", "}}")
	f.Fuzz(func(t *testing.T, out, left, right string) {
		line, text, ok := findPair([]byte(out), left, right)
		wline, wtext, wok := 0, "", false
		for n, l := range strings.Split(out, "\n") {
			i := strings.Index(l, left)
			if left == "" || i < 0 {
				continue
			}
			rest := l[i+len(left):]
			j := strings.Index(rest, right)
			if j < 0 || j > maxActionLen || len(strings.TrimSpace(rest[:j])) == 0 {
				continue
			}
			wline, wtext, wok = n+1, l[i:i+len(left)+j+len(right)], true
			break
		}
		if line != wline || text != wtext || ok != wok {
			t.Fatalf("findPair(%q, %q, %q) = %d %q %v, want %d %q %v", out, left, right, line, text, ok, wline, wtext, wok)
		}
	})
}
