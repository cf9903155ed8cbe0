package template

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestFunctionsDocumented holds FUNCTIONS.md to the code: every function a
// template can call has one row, unsupported ones say so, and no row names
// a function that does not exist.
func TestFunctionsDocumented(t *testing.T) {
	b, err := os.ReadFile("FUNCTIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([^`]+)` \\| (supported|supported \\(differs\\)|unsupported|seamless) \\|")
	documented := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			if _, dup := documented[m[1]]; dup {
				t.Errorf("%s documented twice", m[1])
			}
			documented[m[1]] = m[2]
		}
	}

	code := map[string]bool{"sprig_*": true, "scratch.Values": true}
	all := maps.Clone(staticFuncs())
	maps.Copy(all, boundFuncs(func() *render { return &render{t: &Template{}} }))
	for name := range all {
		if strings.HasPrefix(name, "sprig_") {
			if _, refused := unsupported[name]; !refused {
				continue
			}
		}
		code[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(code)) {
		status, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("%s is missing from FUNCTIONS.md", name)
		case unsupported[name] != "" && status != "unsupported":
			t.Errorf("%s is unsupported but documented as %s", name, status)
		case unsupported[name] == "" && status == "unsupported":
			t.Errorf("%s works but is documented as unsupported", name)
		case status == "unsupported":
			// The Notes column is the reason the error gives, word for word.
			want := "| `" + name + "` | unsupported | " + strings.ReplaceAll(unsupported[name], "|", `\|`) + " |"
			if !strings.Contains(string(b), want+"\n") {
				t.Errorf("FUNCTIONS.md does not give %s's message; want the row %s", name, want)
			}
		}
	}
	for name := range documented {
		if !code[name] {
			t.Errorf("FUNCTIONS.md documents %s, which the code does not have", name)
		}
	}
}

// TestFunctionsExampleRenders keeps the example of FUNCTIONS.md working.
func TestFunctionsExampleRenders(t *testing.T) {
	b, err := os.ReadFile("FUNCTIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), "```\n")
	example, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("no example in FUNCTIONS.md")
	}
	r, err := renderText(t, "FUNCTIONS.md", example, testOptions(), untrustedState())
	if err != nil {
		t.Fatal(err)
	}
	// Five hostile instances and a tag are left out before the template
	// runs, one bad address by the example itself.
	if !strings.Contains(string(r.Config), "backend web\n    server") || len(r.Skipped) != 7 {
		t.Errorf("rendered %q, skipped %q", r.Config, r.Skipped)
	}
}
