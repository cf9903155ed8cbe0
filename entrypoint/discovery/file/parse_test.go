package file

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func inst(name, id, addr string, port int) model.Instance {
	return model.Instance{Source: "file", Status: model.StatusPassing, Name: name, ID: id, Address: addr, Port: port}
}

// web is what the example in the package documentation declares.
var web = []model.Instance{
	func() model.Instance {
		in := inst("web", "web-1", "10.0.0.11", 8080)
		in.Weight = 10
		in.Tags = []string{"seamless.http.host=web.example.com", "canary"}
		in.Meta = map[string]string{"team": "shop", "zone": "a"}
		return in
	}(),
	func() model.Instance {
		in := inst("web", "10.0.0.12:8080", "10.0.0.12", 8080)
		in.Tags = []string{"seamless.http.host=web.example.com"}
		in.Meta = map[string]string{"team": "shop"}
		return in
	}(),
}

const webYAML = `# the example of the package documentation
name: web
tags: ["seamless.http.host=web.example.com"]
meta: {team: shop}
instances:
  - address: 10.0.0.11
    port: 8080
    weight: 10
    id: web-1
    tags: [canary]
    meta: {zone: a}
  - address: 10.0.0.12
    port: 8080
`

const webJSON = `{
	"name": "web",
	"tags": ["seamless.http.host=web.example.com"],
	"meta": {"team": "shop"},
	"instances": [
		{"address": "10.0.0.11", "port": 8080, "weight": 10, "id": "web-1",
		 "tags": ["canary"], "meta": {"zone": "a"}},
		{"address": "10.0.0.12", "port": 8080}
	]
}
`

func TestParseGood(t *testing.T) {
	for _, tc := range []struct {
		name, file, data string
		want             []model.Instance
	}{
		{"yaml example", "web.yaml", webYAML, web},
		{"json example, tab-indented", "web.json", webJSON, web},
		{"json read as YAML when named .yml", "web.yml", webJSON, web},
		{"upper-case extension", "web.JSON", webJSON, web},
		{"byte order mark", "web.yaml", "\ufeff" + webYAML, web},
		{"json escapes yaml.v3 rejects: \\/ and a surrogate pair", "web.json",
			`{"name": "a\/b", "meta": {"e": "\ud83d\ude00"}, "instances": [{"address": "h", "port": 1}]}`,
			[]model.Instance{func() model.Instance {
				in := inst("a/b", "h:1", "h", 1)
				in.Meta = map[string]string{"e": "😀"}
				return in
			}()}},
		{"json key with its colon on the next line", "web.json",
			"{\"name\"\n:\n\"web\"}", nil},
		{"no instances", "web.yaml", "name: web\n", nil},
		{"empty instances", "web.yaml", "name: web\ninstances: []\n", nil},
		{"null optional fields are left out", "web.yaml",
			"name: web\ntags:\nmeta: ~\ninstances:\n  - {address: h, port: 80, id: null, weight: ~, tags: null, meta: null}\n",
			[]model.Instance{inst("web", "h:80", "h", 80)}},
		{"ipv6 default id", "web.yaml", "name: web\ninstances: [{address: '::1', port: 80}]\n",
			[]model.Instance{inst("web", "[::1]:80", "::1", 80)}},
		{"scalars are strings as written", "web.yaml",
			"name: 8080\ntags: [1.10, true, 2024-01-02]\ninstances: [{address: h, port: +80}]\n",
			[]model.Instance{func() model.Instance {
				in := inst("8080", "h:80", "h", 80)
				in.Tags = []string{"1.10", "true", "2024-01-02"}
				return in
			}()}},
		{"instance tags repeating the service's are not repeated", "web.yaml",
			"name: web\ntags: [a, b]\ninstances: [{address: h, port: 80, tags: [b, c, c]}]\n",
			[]model.Instance{func() model.Instance {
				in := inst("web", "h:80", "h", 80)
				in.Tags = []string{"a", "b", "c"}
				return in
			}()}},
		{"instance meta wins over the service's", "web.yaml",
			"name: web\nmeta: {a: '1', b: '2'}\ninstances: [{address: h, port: 80, meta: {b: x}}]\n",
			[]model.Instance{func() model.Instance {
				in := inst("web", "h:80", "h", 80)
				in.Meta = map[string]string{"a": "1", "b": "x"}
				return in
			}()}},
		{"anchors and aliases", "web.yaml",
			"name: web\ninstances:\n  - &i {address: h, port: 80, tags: &t [x]}\n  - {address: h, port: 81, tags: *t}\n",
			[]model.Instance{
				func() model.Instance { in := inst("web", "h:80", "h", 80); in.Tags = []string{"x"}; return in }(),
				func() model.Instance { in := inst("web", "h:81", "h", 81); in.Tags = []string{"x"}; return in }(),
			}},
		{"odd characters are carried as they are", "web.yaml",
			"name: \"we b\\n\"\ntags: ['a b', '#x']\ninstances: [{address: 'h h', port: 80}]\n",
			[]model.Instance{func() model.Instance {
				in := inst("we b\n", "h h:80", "h h", 80)
				in.Tags = []string{"a b", "#x"}
				return in
			}()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, err := parse(tc.file, []byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(svc.instances, tc.want) {
				t.Errorf("instances:\n got %+v\nwant %+v", svc.instances, tc.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file, data string
		line             int
		msg              string // a part of the message
	}{
		// The schema, in YAML.
		{"unknown field", "web.yaml", "name: web\nport: 80\n", 2, `unknown field "port"`},
		{"unknown instance field", "web.yaml", "name: web\ninstances:\n  - address: h\n    port: 80\n    wieght: 3\n", 5, `unknown field "wieght"`},
		{"missing name", "web.yaml", "\n\ninstances: []\n", 3, "no name"},
		{"empty name", "web.yaml", "name: ''\n", 1, "name is empty"},
		{"null name", "web.yaml", "tags: []\nname:\n", 2, "name must be a string, not null"},
		{"name is a list", "web.yaml", "name: [a]\n", 1, "name must be a string, not a list"},
		{"tags is a string", "web.yaml", "name: web\ntags: a\n", 2, "tags must be a list of strings, not a string"},
		{"a tag is a mapping", "web.yaml", "name: web\ntags:\n  - a\n  - {b: c}\n", 4, "each of tags must be a string, not a mapping"},
		{"meta value is a list", "web.yaml", "name: web\nmeta:\n  a: [1]\n", 3, `meta "a" must be a string, not a list`},
		{"instances is a mapping", "web.yaml", "name: web\ninstances: {address: h}\n", 2, "instances must be a list, not a mapping"},
		{"instance is a string", "web.yaml", "name: web\ninstances:\n  - h:80\n", 3, "instance 1 must be a mapping, not a string"},
		{"missing address", "web.yaml", "name: web\ninstances:\n  - address: a\n    port: 80\n  - port: 80\n", 5, "instance 2 has no address"},
		{"empty address", "web.yaml", "name: web\ninstances:\n  - {address: '', port: 80}\n", 3, "address is empty"},
		{"missing port", "web.yaml", "name: web\ninstances:\n  -\n    address: h\n", 4, "instance 1 has no port"},
		{"port 0", "web.yaml", "name: web\ninstances:\n  - address: h\n    port: 0\n", 4, "port 0 is outside 1-65535"},
		{"port 65536", "web.yaml", "name: web\ninstances:\n  - address: h\n    port: 65536\n", 4, "port 65536 is outside 1-65535"},
		{"port beyond int64", "web.yaml", "name: web\ninstances:\n  - {address: h, port: 99999999999999999999}\n", 3, "is outside 1-65535"},
		{"negative port", "web.yaml", "name: web\ninstances:\n  - {address: h, port: -80}\n", 3, "port -80 is outside 1-65535"},
		{"port is a string", "web.yaml", "name: web\ninstances:\n  - {address: h, port: '80'}\n", 3, "port must be an integer, not a string"},
		{"port is null", "web.yaml", "name: web\ninstances:\n  - {address: h, port: }\n", 3, "port must be an integer, not null"},
		{"port is a fraction", "web.yaml", "name: web\ninstances:\n  - {address: h, port: 80.5}\n", 3, "port must be a decimal integer, not 80.5"},
		{"port in octal", "web.yaml", "name: web\ninstances:\n  - {address: h, port: 010}\n", 3, "port must be a decimal integer, not 010"},
		{"port in hex", "web.yaml", "name: web\ninstances:\n  - {address: h, port: 0x50}\n", 3, "decimal integer, not 0x50"},
		{"negative weight", "web.yaml", "name: web\ninstances:\n  - address: h\n    port: 80\n    weight: -1\n", 5, "weight -1 is outside 1-"},
		{"zero weight", "web.yaml", "name: web\ninstances:\n  - address: h\n    port: 80\n    weight: 0\n", 5, "weight 0 is outside 1-"},
		{"duplicate id", "web.yaml", "name: web\ninstances:\n  - {address: a, port: 80, id: x}\n  - {address: b, port: 80, id: x}\n", 4, `instance id "x" is already used on line 3`},
		{"duplicate default id", "web.yaml", "name: web\ninstances:\n  - {address: a, port: 80}\n  - {address: a, port: 80}\n", 4, `instance id "a:80" is already used on line 3`},
		{"duplicate address and port", "web.yaml", "name: web\ninstances:\n  - {address: a, port: 80, id: x}\n  - {address: a, port: 80, id: y}\n", 4, "instance a:80 is already listed on line 3"},
		{"empty id", "web.yaml", "name: web\ninstances:\n  - {address: a, port: 80, id: ''}\n", 3, "id is empty"},
		{"field twice", "web.yaml", "name: web\ntags: []\nname: api\n", 3, `"name" appears twice in the file (first on line 1)`},
		{"meta key twice", "web.yaml", "name: web\nmeta:\n  a: x\n  a: y\n", 4, `"a" appears twice in meta`},
		{"merge key", "web.yaml", "name: web\ninstances:\n  - <<: {port: 80}\n    address: h\n", 3, "merge keys (<<) are not supported"},
		{"custom tag", "web.yaml", "name: !secret web\n", 1, "the tag !secret is not supported"},
		{"top level is a list", "web.yaml", "- name: web\n", 1, "the file must be a mapping, not a list"},

		// The file.
		{"empty file", "web.yaml", "", 1, "the file is empty"},
		{"only comments", "web.yaml", "# nothing yet\n", 1, "the file is empty"},
		{"only a document marker", "web.yaml", "---\n", 1, "the file is empty"},
		{"two documents", "web.yaml", "name: web\n---\nname: api\n", 2, "a second YAML document"},
		{"invalid UTF-8", "web.yaml", "name: web\ntags:\n  - \xff\n", 3, "not valid UTF-8"},

		// YAML syntax: the line of the problem, not of the block around it.
		{"mis-indented field", "web.yaml", "name: web\ninstances:\n  - address: a\n    port: 1\n   weight: 2\n", 5, "YAML: did not find expected '-' indicator"},
		{"tab indentation", "web.yaml", "name: web\ninstances:\n  - address: a\n\tport: 1\n", 4, "YAML: found a tab character"},
		{"unclosed quote", "web.yaml", "name: \"web\ninstances: []\n", 3, "YAML: found unexpected end of stream"},
		{"unclosed flow sequence: the line of its bracket", "web.yaml", "name: web\ntags: [a, b\nmeta: {}\n", 2, "YAML: did not find expected ',' or ']'"},
		{"mapping on the first line", "web.yaml", "name: web: x\n", 1, "YAML: mapping values are not allowed"},
		{"less indented key", "web.yaml", "name: web\nmeta:\n  a: 1\n b: 2\n", 4, "YAML: did not find expected key"},
		{"bad character", "web.yaml", "name: web\ntags:\n  - @x\n", 3, "YAML: found character that cannot start any token"},

		// JSON.
		{"json missing comma", "web.json", "{\n  \"name\": \"web\"\n  \"instances\": []\n}\n", 3, "JSON: invalid character '\"' after object key:value pair"},
		{"json trailing comma", "web.json", "{\n  \"name\": \"web\",\n}\n", 3, "JSON: invalid character '}'"},
		{"json data after the value", "web.json", "{\"name\": \"web\"}\n{}\n", 2, "after top-level value"},
		{"json cut short", "web.json", "{\"name\": \"web\",\n\"instances\": [\n", 2, "JSON: unexpected end of JSON input"},
		{"json unknown field", "web.json", "{\n  \"name\": \"web\",\n  \"instances\": [\n    {\"address\": \"h\", \"port\": 80, \"wieght\": 1}\n  ]\n}\n", 4, `unknown field "wieght"`},
		{"json port out of range", "web.json", "{\"name\": \"web\",\n\"instances\": [\n{\"address\": \"h\",\n \"port\": 70000}]}\n", 4, "port 70000 is outside 1-65535"},
		{"json port as a string", "web.json", "{\"name\": \"web\",\n\"instances\": [{\"address\": \"h\", \"port\": \"80\"}]}\n", 2, "port must be an integer, not a string"},
		{"json port with an exponent", "web.json", "{\"name\": \"web\",\n\"instances\": [{\"address\": \"h\", \"port\": 8e1}]}\n", 2, "port must be a decimal integer, not 8e1"},
		{"json key twice", "web.json", "{\"name\": \"web\",\n\"name\": \"api\"}\n", 2, `"name" appears twice in the file (first on line 1)`},
		{"json null", "web.json", "null\n", 1, "the file must be a mapping, not null"},
		{"json empty", "web.json", " \n", 1, "the file is empty"},
		{"json nested too deep", "web.json", "{\"name\": \"web\", \"meta\": " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "}", 1, "nested more than 32 levels"},
		{"json is not YAML in a .json file", "web.json", "name: web\n", 1, "JSON: invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := "/srv/services/" + tc.file
			_, err := parse(file, []byte(tc.data))
			if err == nil {
				t.Fatal("no error")
			}
			fe, ok := errors.AsType[*fileError](err)
			if !ok {
				t.Fatalf("%T, not a *fileError: %v", err, err)
			}
			prefix := fmt.Sprintf("%s:%d: ", file, tc.line)
			if fe.File != file || fe.Line != tc.line || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error\n got %q\nwant %q...%q", err, prefix, tc.msg)
			}
		})
	}
}

// A file that aliases a large list many times is refused rather than
// expanded.
func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: web\ntags: &t [" + strings.Repeat("x, ", 2000) + "x]\ninstances:\n")
	for i := range 1000 {
		fmt.Fprintf(&b, "  - {address: h, port: %d, tags: *t}\n", i+1)
	}
	_, err := parse("web.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "too many values once YAML aliases are expanded") {
		t.Fatalf("got %v", err)
	}
}
