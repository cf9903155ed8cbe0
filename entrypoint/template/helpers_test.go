package template

import (
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func TestHelpers(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		// Math: the piped value comes last.
		{"add", `{{add 1 2}} {{1 | add 2}} {{add 1.5 2}}`, "3 3 3.5"},
		{"subtract", `{{subtract 2 5}} {{5 | subtract 2}}`, "3 3"},
		{"multiply", `{{multiply 2 3}}`, "6"},
		{"divide", `{{divide 2 10}} {{10 | divide 4.0}}`, "5 2.5"},
		{"modulo", `{{modulo 2 5}}`, "1"},
		{"minimum maximum", `{{minimum 2 5}} {{maximum 2 5}} {{5 | minimum 2}}`, "2 5 2"},
		{"math on parsed values", `{{add (parseInt "40") (parseUint "2")}}`, "42"},

		// Lists and membership.
		{"contains", `{{if split "," "a,b" | contains "b"}}yes{{end}}`, "yes"},
		{"in", `{{in (split "," "a,b") "a"}} {{in "haystack" "st"}} {{in (split "," "a,b") "z"}}`, "true true false"},
		{"containsAll", `{{containsAll (split "," "a,b") (split "," "a,b,c")}} {{containsAll (split "," "a,z") (split "," "a,b,c")}}`, "true false"},
		{"containsAny", `{{containsAny (split "," "z,b") (split "," "a,b,c")}} {{containsAny (split "," "") (split "," "a")}}`, "true false"},
		{"containsNone", `{{containsNone (split "," "x,y") (split "," "a,b")}} {{containsNone (split "," "x,a") (split "," "a,b")}}`, "true false"},
		{"containsNotAll", `{{containsNotAll (split "," "a,z") (split "," "a,b")}} {{containsNotAll (split "," "a,b") (split "," "a,b")}}`, "true false"},
		{"join any list", `{{join "+" (sprig_list 1 "a" 2.5)}}`, "1+a+2.5"},
		{"loop", `{{range loop 3}}{{.}}{{end}} {{range $i := loop 5 8}}{{$i}}{{end}} {{range loop "2"}}x{{end}}`, "012 567 xx"},
		{"split trims and drops empty", `{{len (split "," "  ")}} {{split "\n" "a\nb\n"}}`, "0 [a b]"},
		{"splitToMap", `{{with splitToMap "," "=" "a=1,b=2=3,c"}}{{.a}} {{.b}} {{len .}}{{end}}`, "1 2=3 2"},

		// Strings.
		{"indent", `{{indent 2 "a\n\nb"}}`, "  a\n\n  b"},
		{"trim family", `{{trim "!" "!!hi!!"}} {{trimPrefix "he" "hello"}} {{trimSuffix "lo" "hello"}} [{{trimSpace "  x \n"}}]`, "hi llo hel [x]"},
		{"case", `{{toLower "AbC"}} {{toUpper "AbC"}} {{toTitle "hello wORLD o'neil"}}`, "abc ABC Hello WORLD O'neil"},
		{"replace", `{{"foo.bar" | replaceAll "." "_"}} {{"foo.bar" | regexReplaceAll "foo([.a-z]+)" "$1"}} {{"foo.bar" | regexMatch "^f"}}`, "foo_bar .bar true"},
		{"encodings", `{{base64Encode "hello"}} {{base64Decode "aGVsbG8="}} {{base64URLEncode "?>"}} {{base64URLDecode "Pz4="}}`, "aGVsbG8= hello Pz4= ?>"},
		{"hashes", `{{sha256Hex "x"}} {{md5sum "x"}} {{hmacSHA256Hex "message" "key"}}`,
			"2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 9dd4e461268c8034f5c8564e155c67a6 6e9ef29b75fffc5b7abae527d58fdadb2fe42e7219011976917343065f58ed4a"},

		// Parsing.
		{"parseBool", `{{parseBool "true"}} {{parseBool ""}}`, "true false"},
		{"parseFloat", `{{parseFloat "1.5"}} {{parseFloat ""}}`, "1.5 0"},
		{"parseJSON", `{{with parseJSON "{\"a\":{\"b\":[1,2]}}"}}{{index .a.b 1}}{{end}} {{len (parseJSON "")}}`, "2 0"},
		{"parseYAML gives string keys", `{{parseYAML "a:\n  b: 1\n" | toJSON}}`, `{"a":{"b":1}}`},

		// Encoding.
		{"toJSONPretty", `{{parseJSON "{\"b\":1,\"a\":[1]}" | toJSONPretty}}`, "{\n  \"a\": [\n    1\n  ],\n  \"b\": 1\n}"},
		{"toJSON escapes HTML, toUnescapedJSON does not", `{{toJSON "a&b<c>"}} {{toUnescapedJSON "a&b<c>"}}`, `"a\u0026b\u003cc\u003e" "a&b<c>"`},
		{"toUnescapedJSONPretty", `{{parseJSON "{\"q\":\"a?b=c&d\"}" | toUnescapedJSONPretty}}`, "{\n  \"q\": \"a?b=c&d\"\n}"},
		{"toYAML lists", `{{parseJSON "{\"l\":[1,\"x\"],\"m\":{\"k\":true}}" | toYAML}}`, "l:\n- 1\n- x\nm:\n  k: true"},
		{"toTOML nesting and quoting", `{{parseJSON "{\"a\":{\"b\":{\"c\":\"d\"},\"n\":1.5},\"key with space\":\"q\\\"uote\",\"l\":[1,2],\"t\":[{\"x\":1},{\"x\":2}]}" | toTOML}}`,
			"\"key with space\" = \"q\\\"uote\"\nl = [1.0, 2.0]\n\n[a]\n  n = 1.5\n  [a.b]\n    c = \"d\"\n\n[[t]]\n  x = 1.0\n\n[[t]]\n  x = 2.0"},

		// Grouping.
		{"byMeta", `{{range $k, $v := service "web|any" | byMeta "zone,shard|int"}}{{$k}}={{len $v}} {{end}}`, "_no_zone__00000=1 eu_00002=1 us_1_00010=1 "},
		{"mergeMap keeps the base", `{{$base := parseJSON "{\"a\":1,\"n\":{\"x\":1}}"}}{{parseJSON "{\"a\":2,\"b\":3,\"n\":{\"y\":2}}" | mergeMap $base | toJSON}}`, `{"a":1,"b":3,"n":{"x":1,"y":2}}`},
		{"mergeMapWithOverride", `{{$base := parseJSON "{\"a\":1}"}}{{parseJSON "{\"a\":2,\"b\":3}" | mergeMapWithOverride $base | toJSON}}`, `{"a":2,"b":3}`},
	}
	st := model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: []model.Instance{
		{Name: "web", ID: "1", Node: "n1", Address: "10.0.0.1", Status: "passing", Meta: map[string]string{"zone": "eu", "shard": "2"}},
		{Name: "web", ID: "2", Node: "n2", Address: "10.0.0.2", Status: "passing", Meta: map[string]string{"zone": "us.1", "shard": "10"}},
		{Name: "web", ID: "3", Node: "n3", Address: "10.0.0.3", Status: "passing"},
	}}}})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions()
			tmpl, err := parseText("h.tmpl", tt.text, opts)
			if err != nil {
				t.Fatal(err)
			}
			r, err := tmpl.Render(st)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(r.Config); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestInOnServiceTagsAndMixedLists(t *testing.T) {
	if !in(ServiceTags{"a", "b"}, "b") || in(ServiceTags{"a"}, 1) {
		t.Error("in on ServiceTags")
	}
	if !in([]any{1, "x"}, 1) || !in([]any{1.5}, 1.5) || in([]any{"1"}, 1) {
		t.Error("in on mixed lists")
	}
}

func TestHelperErrors(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"explode conflict", `{{parseJSON "x" }}`, "parseJSON"},
		{"indent negative", `{{indent -1 "x"}}`, "positive"},
		{"modulo on floats", `{{modulo 2.0 5}}`, "modulo"},
		{"add a string", `{{add "1" 2}}`, "add: unknown type"},
		{"loop arguments", `{{loop 1 2 3}}`, "wrong number of arguments"},
		{"parseInt", `{{parseInt "x"}}`, "parseInt"},
		{"byTag wrong type", `{{byTag "x"}}`, "byTag: wrong argument type"},
		{"toTOML of a list", `{{toTOML (split "," "a")}}`, "top-level value must be a map"},
		{"scratch MapSet on a value", `{{scratch.Set "k" 1}}{{scratch.MapSet "k" "a" 1}}`, `"k" is not a map`},
		{"timestamp arguments", `{{timestamp "a" "b"}}`, "wrong number of arguments"},
		{"datacenters arguments", `{{datacenters true false}}`, "wrong number of arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := renderText(t, "h.tmpl", tt.text, testOptions(), testState())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := explode([]*KeyPair{{Key: "a", Value: "1"}, {Key: "a/b", Value: "2"}}); err == nil || !strings.Contains(err.Error(), "not a map") {
		t.Errorf("explode conflict: %v", err)
	}
}
