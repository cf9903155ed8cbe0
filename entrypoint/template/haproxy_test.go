package template

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

var nameRe = regexp.MustCompile(`\A[A-Za-z0-9._-]+\z`)

func TestHAProxyName(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"web", "web"},
		{"web-1.prod_eu", "web-1.prod_eu"},
		{"a b", "a_b__"},
		{"a_b", "a_b"},
		{"a__b", "a__b__"},
		{"web\n    server evil 203.0.113.9:80", "web_____server_evil_203.0.113.9_80__"},
		{"", "__"},
		{"café", "caf___"},
		{strings.Repeat("x", 129), strings.Repeat("x", 128) + "__"},
	}
	for _, tt := range tests {
		got := HAProxyName(tt.in)
		if !nameRe.MatchString(got) {
			t.Errorf("HAProxyName(%q) = %q: not a valid HAProxy name", tt.in, got)
		}
		if strings.HasSuffix(tt.want, "__") {
			// Changed: the readable part, "__" and 16 hex digits.
			if !strings.HasPrefix(got, tt.want) || len(got) != len(tt.want)+16 {
				t.Errorf("HAProxyName(%q) = %q, want %q followed by a 16-digit hash", tt.in, got, tt.want)
			}
		} else if got != tt.want {
			t.Errorf("HAProxyName(%q) = %q, want it unchanged", tt.in, got)
		}
	}
	// Inputs that sanitise alike still get different names.
	if HAProxyName("a b") == HAProxyName("a\tb") || HAProxyName("a b") == HAProxyName("a_b") {
		t.Error("names collide")
	}
	// An unchanged name can never equal a changed one.
	if changed := HAProxyName("a b"); HAProxyName(changed) == changed {
		t.Error("a name containing __ came out unchanged")
	}
}

func TestHAProxyQuote(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"web", "web"},
		{"example.com", "example.com"},
		{"/path?q=1", `'/path?q=1'`},
		{"a b", `'a b'`},
		{"it's", `'it'\''s'`},
		{"#x", `'#x'`},
		{"$HOME", `'$HOME'`},
		{`a\b`, `'a\b'`},
		{"", `''`},
		{"a\nb", `''`},
		{"nul\x00", `''`},
		{"tab\t", `''`},
		{"del\x7f", `''`},
	}
	for _, tt := range tests {
		if got := HAProxyQuote(tt.in); got != tt.want {
			t.Errorf("HAProxyQuote(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestHAProxyChecks(t *testing.T) {
	hosts := map[string]bool{
		"10.0.0.1": true, "2001:db8::1": true, "::ffff:10.0.0.1": true, "web-1.example.com": true, "my_host": true,
		"localhost": true, "": false, "a b": false, "10.0.0.1\nserver": false, "-bad.example": false, "bad-.example": false,
		"a..b": false, "fe80::1%eth0": false, "1.2.3": false, "10.0.0.1:80": false, "[::1]": false,
		strings.Repeat("a", 64) + ".example": false, "x.example.": true, "0.0.0.0": false, "::": false,
	}
	for h, want := range hosts {
		if got := ValidHost(h); got != want {
			t.Errorf("ValidHost(%q) = %v, want %v", h, got, want)
		}
	}
	ports := map[any]bool{80: true, int64(65535): true, uint16(1): true, "8080": true, 0: false, 65536: false, -1: false, "80a": false, "": false, 1.5: false, nil: false}
	for p, want := range ports {
		if got := ValidPort(p); got != want {
			t.Errorf("ValidPort(%v) = %v, want %v", p, got, want)
		}
	}
	addrs := []struct {
		host string
		port any
		want string
	}{
		{"10.0.0.1", 80, "10.0.0.1:80"},
		{"2001:db8::1", 443, "[2001:db8::1]:443"},
		{"::ffff:10.0.0.1", 443, "[::ffff:10.0.0.1]:443"},
		{"web.example", "8080", "web.example:8080"},
		{"10.0.0.1\n server evil 1.2.3.4", 80, ""},
		{"10.0.0.1", 0, ""},
	}
	for _, a := range addrs {
		if got := HAProxyAddr(a.host, a.port); got != a.want {
			t.Errorf("HAProxyAddr(%q, %v) = %q, want %q", a.host, a.port, got, a.want)
		}
	}
	weights := map[any]int{5: 5, 0: 0, -3: 0, 1000: 256, uint64(1 << 63): 256, "12": 12, "x": 1, 2.7: 2, nil: 1}
	for w, want := range weights {
		if got := HAProxyWeight(w); got != want {
			t.Errorf("HAProxyWeight(%v) = %d, want %d", w, got, want)
		}
	}
	if got := HAProxyComment("a\nserver evil\r\x00"); got != "a?server evil??" {
		t.Errorf("HAProxyComment = %q", got)
	}
}

// untrustedState holds hostile names, tags, meta and addresses, as any
// source may report them.
func untrustedState() model.State {
	inst := func(name, node, addr string, port int) model.Instance {
		return model.Instance{Source: "consul", Name: name, ID: name + "/" + node, Node: node, Address: addr, Port: port, Status: model.StatusPassing}
	}
	web := []model.Instance{
		inst("web", "node1", "10.0.0.1", 80),
		inst("web", "evil\n    server evil2 203.0.113.10:80", "10.0.0.2", 8080),
		inst("web", `quote'"#;$HOME`, "10.0.0.3", 81), // no whitespace: a name, for haproxyName to map
		inst("web", "a b", "10.0.0.4\n    server evil3 203.0.113.11:80", 80),
		inst("web", "v6", "2001:db8::1", 443),
		inst("web", "big", "10.0.0.6", 70000),
	}
	web[0].Tags = []string{"x\n    server evil 203.0.113.9:80", "prod"}
	// "a b" sorts first: its meta is the one the template reads.
	web[3].Meta = map[string]string{"host": "example.com\n    use_backend evil if TRUE"}
	web[4].Weight = 1000
	shop := inst("shop_v2", "node1", "10.0.0.7", 80)
	shop.Meta = map[string]string{"host": `shop.example' server evil 203.0.113.12:80 #`}
	cache := inst("cache__x", "node1", "10.0.0.8", 6379)
	cache.Meta = map[string]string{"host": "-i"}
	cat := &model.Catalog{Instances: append(web,
		shop, cache,
		inst("api#x", "node1", "10.0.0.9", 80),
		inst("evil\nbackend evil", "node1", "10.0.0.10", 80),
	)}
	model.SortCatalog(cat)
	return model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: cat}})
}

func TestUntrustedInputCannotAddDirectives(t *testing.T) {
	tmpl, err := Parse("testdata/untrusted.tmpl", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	r, err := tmpl.Render(untrustedState())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "untrusted", r.Config)

	// Every line, read as HAProxy reads it, is one of the directives the
	// template writes, with the number of words it writes.
	wordCount := map[string]int{
		"global": 1, "maxconn": 2, "defaults": 1, "mode": 2, "timeout": 3, "frontend": 2, "bind": 2,
		"acl": 6, "use_backend": 4, "backend": 2, "server": 5,
	}
	var servers, backends []string
	for i, line := range strings.Split(string(r.Config), "\n") {
		words, err := splitWords(line, nil)
		if err != nil {
			t.Fatalf("line %d %q: %v", i+1, line, err)
		}
		if len(words) == 0 {
			continue
		}
		if n, ok := wordCount[words[0]]; !ok || n != len(words) {
			t.Errorf("line %d %q reads as %q: not a directive of the template", i+1, line, words)
		}
		for _, w := range words {
			if strings.HasPrefix(w, "203.0.113.") {
				t.Errorf("line %d: hostile address as a word of its own: %q", i+1, words)
			}
		}
		switch words[0] {
		case "server":
			servers = append(servers, words[2])
			if !nameRe.MatchString(words[1]) {
				t.Errorf("server name %q", words[1])
			}
		case "backend":
			backends = append(backends, words[1])
		}
	}
	// Instances with whitespace, a control character or HAProxy syntax in
	// a name, or a bad address, are left out before the template sees
	// them, a tag or meta key with a control character alone (catalog.go);
	// the helpers handle the rest.
	wantServers := []string{"10.0.0.8:6379", "10.0.0.7:80", "10.0.0.1:80", "[2001:db8::1]:443"}
	if !slices.Equal(servers, wantServers) {
		t.Errorf("servers = %q, want %q", servers, wantServers)
	}
	if len(backends) != 3 {
		t.Errorf("backends = %q, want cache__x, shop_v2 and web", backends)
	}
	leftOut, tags := 0, 0
	for _, s := range r.Skipped {
		if strings.HasSuffix(s, "; instance left out") {
			leftOut++
		}
		if strings.HasSuffix(s, "; tag left out") {
			tags++
		}
	}
	if leftOut != 5 || tags != 1 || len(r.Skipped) != 7 {
		t.Errorf("skipped = %q, want five hostile instances and a tag left out and a bad address", r.Skipped)
	}
	haproxyCheck(t, r.Config)
}

var fuzzSeeds = []string{
	"", "web", "a b", "it's", "''", `\`, "#", "$HOME", "${X}", `"`, "\n", "\r\n", "\x00", "\t", "\x7f",
	"x\n    server evil 203.0.113.9:80", `quote'"#; $HOME`, "é", "\xff\xfe", "__", "a__b", strings.Repeat("z", 200),
}

func FuzzHAProxyQuote(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := HAProxyQuote(s)
		if !HAProxyQuotable(q) {
			t.Fatalf("HAProxyQuote(%q) = %q holds a control character", s, q)
		}
		words, err := splitWords("x "+q+" y", nil)
		if err != nil {
			t.Fatalf("HAProxyQuote(%q) = %q does not parse: %v", s, q, err)
		}
		want := []string{"x", s, "y"}
		if !HAProxyQuotable(s) {
			want[1] = ""
		}
		if fmt.Sprintf("%q", words) != fmt.Sprintf("%q", want) {
			t.Fatalf("HAProxyQuote(%q) = %q reads back as %q, want %q", s, q, words, want)
		}
	})
}

func FuzzHAProxyName(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		na, nb := HAProxyName(a), HAProxyName(b)
		if !nameRe.MatchString(na) {
			t.Fatalf("HAProxyName(%q) = %q: not a valid name", a, na)
		}
		if na != HAProxyName(a) {
			t.Fatalf("HAProxyName(%q) is not deterministic", a)
		}
		if (a == b) != (na == nb) {
			t.Fatalf("HAProxyName(%q) = %q, HAProxyName(%q) = %q", a, na, b, nb)
		}
		if words, _ := splitWords("backend "+na, nil); len(words) != 2 || words[1] != na {
			t.Fatalf("backend %s reads as %q", na, words)
		}
	})
}

func FuzzHAProxyComment(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := HAProxyComment(s)
		if !HAProxyQuotable(c) {
			t.Fatalf("HAProxyComment(%q) = %q holds a control character", s, c)
		}
		if words, err := splitWords("x # "+c, nil); err != nil || len(words) != 1 {
			t.Fatalf("comment %q reads as %q, %v", c, words, err)
		}
	})
}

func FuzzHAProxyAddr(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, 80)
	}
	f.Add("10.0.0.1", 443)
	f.Add("2001:db8::1", 8080)
	f.Add("web.example", 0)
	f.Fuzz(func(t *testing.T, host string, port int) {
		a := HAProxyAddr(host, port)
		if (a != "") != ValidAddr(host, port) {
			t.Fatalf("HAProxyAddr(%q, %d) = %q but ValidAddr says %v", host, port, a, ValidAddr(host, port))
		}
		if a == "" {
			return
		}
		if words, err := splitWords("server s "+a, nil); err != nil || len(words) != 3 || words[2] != a {
			t.Fatalf("server s %s reads as %q, %v", a, words, err)
		}
	})
}

func FuzzServiceQuery(f *testing.F) {
	for _, s := range []string{"web", "tag.web@dc1~near|passing,warning", "a.b.c", "web|", "@dc", "web?ns=x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := parseServiceQuery(s, nil)
		if err != nil {
			return
		}
		if !ValidServiceName(q.name) {
			t.Fatalf("parseServiceQuery(%q) accepted name %q", s, q.name)
		}
	})
}
