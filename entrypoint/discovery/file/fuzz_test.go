package file

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse checks that the parser never panics, that every error names
// the file and a line, and that what it accepts is valid.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		webYAML, webJSON, "", "name: web\n", "name: web\n---\n", "name: web: x\n",
		"name: web\ninstances:\n  - &i {address: h, port: 80}\n  - *i\n",
		"name: web\ninstances:\n  - <<: {port: 80}\n",
		`{"name": "a\/b", "instances": [{"address": "\ud83d\ude00", "port": 1}]}`,
		"{\"name\": \"web\",\n\"instances\": [{\"address\": \"h\", \"port\": 8e1}]}",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, json bool) {
		file := "/srv/services/web.yaml"
		if json {
			file = "/srv/services/web.json"
		}
		svc, err := parse(file, data)
		if err != nil {
			fe, ok := errors.AsType[*fileError](err)
			if !ok || fe.File != file || fe.Line < 1 || !strings.HasPrefix(err.Error(), file+":") {
				t.Fatalf("error without the file and a line: %#v", err)
			}
			return
		}
		if svc.name == "" {
			t.Fatal("a service without a name")
		}
		ids := map[string]bool{}
		for _, in := range svc.instances {
			if in.Name != svc.name || in.Source != "file" || in.Address == "" || in.ID == "" ||
				in.Port < 1 || in.Port > 65535 || in.Weight < 0 || ids[in.ID] {
				t.Fatalf("invalid instance accepted: %+v", in)
			}
			ids[in.ID] = true
		}
	})
}
