package routes

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseTags(t *testing.T) {
	tests := []struct {
		name     string
		tags     []string
		want     Tags
		problems []string // substrings, one per problem
	}{
		{name: "no tags ask for nothing", tags: nil},
		{name: "other tags are someone else's", tags: []string{"primary", "traefik.enable=true", "seamlessly"}},
		{name: "a host", tags: []string{"seamless.http.host=web.example.com"},
			want: Tags{Hosts: []string{"web.example.com"}}},
		{name: "hosts repeat and are lower-cased once each",
			tags: []string{"seamless.http.host=A.example", "seamless.http.host=b.example", "seamless.http.host=a.EXAMPLE"},
			want: Tags{Hosts: []string{"a.example", "b.example"}}},
		{name: "a wildcard host", tags: []string{"seamless.http.host=*.apps.example"},
			want: Tags{Hosts: []string{"*.apps.example"}}},
		{name: "an IPv4 host", tags: []string{"seamless.http.host=127.0.0.1"},
			want: Tags{Hosts: []string{"127.0.0.1"}}},
		{name: "a path loses its trailing slash", tags: []string{"seamless.http.path=/api/"},
			want: Tags{Paths: []string{"/api"}}},
		{name: "a TCP port", tags: []string{"seamless.tcp.port=5432", "seamless.tcp.port=5432"},
			want: Tags{Ports: []int{5432}}},
		{name: "a bad value is a problem; the caller must not use the rest",
			tags:     []string{"seamless.http.host=a b", "seamless.http.host=ok.example"},
			want:     Tags{Hosts: []string{"ok.example"}},
			problems: []string{`tag seamless.http.host="a b" is invalid: not a host name`}},
		{name: "HTTPS only", tags: []string{"seamless.http.host=a.example", "seamless.http.tls=redirect"},
			want: Tags{Hosts: []string{"a.example"}, Redirect: true}},
		{name: "tls takes redirect alone", tags: []string{"seamless.http.tls=Redirect"},
			problems: []string{`tag seamless.http.tls=Redirect is invalid: the only value is "redirect"`}},
		{name: "a tag without a value", tags: []string{"seamless.http.host"},
			problems: []string{"tag seamless.http.host has no value"}},
		{name: "an empty value", tags: []string{"seamless.tcp.port="},
			problems: []string{`seamless.tcp.port="" is invalid: not a port number`}},
		{name: "an unknown seamless tag is a typo worth reporting", tags: []string{"seamless.http.hots=a.example"},
			problems: []string{"unknown tag seamless.http.hots"}},
		{name: "there is no weight tag", tags: []string{"seamless.weight=5"},
			problems: []string{"unknown tag seamless.weight"}},
		{name: "the prefix in capitals is still ours, and still wrong", tags: []string{"Seamless.HTTP.Host=a.example"},
			problems: []string{"unknown tag Seamless.HTTP.Host"}},
		{name: "an injected directive is one bad host",
			tags:     []string{"seamless.http.host=x\n    server evil 203.0.113.9:80"},
			problems: []string{`"x\n    server evil 203.0.113.9:80" is invalid: not a host name`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := ParseTags(tt.tags)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("tags = %+v, want %+v", got, tt.want)
			}
			if len(problems) != len(tt.problems) {
				t.Fatalf("problems = %q, want %d like %q", problems, len(tt.problems), tt.problems)
			}
			for i, p := range problems {
				if !strings.Contains(p, tt.problems[i]) {
					t.Errorf("problem %q does not say %q", p, tt.problems[i])
				}
			}
		})
	}
}

func TestParseHost(t *testing.T) {
	tests := []struct {
		name, in, want string // want "" means rejected
	}{
		{"a name", "example.com", "example.com"},
		{"one label", "localhost", "localhost"},
		{"upper case is lowered", "WWW.Example.COM", "www.example.com"},
		{"hyphens inside labels", "my-app.example", "my-app.example"},
		{"digits in labels", "a1.2b.example", "a1.2b.example"},
		{"wildcard", "*.example.com", "*.example.com"},
		{"IPv4", "192.0.2.10", "192.0.2.10"},
		{"empty", "", ""},
		{"a label starting with a hyphen", "-a.example", ""},
		{"a label ending with a hyphen", "a-.example", ""},
		{"an empty label", "a..example", ""},
		{"a trailing dot", "example.com.", ""},
		{"an underscore", "my_app.example", ""},
		{"a port", "example.com:80", ""},
		{"a space", "a b", ""},
		{"a wildcard in the middle", "a.*.example", ""},
		{"a bare wildcard", "*", ""},
		{"a double wildcard", "*.*.example", ""},
		{"a wildcard over an IP", "*.192.0.2.1", ""},
		{"all-digit last label (an IP that is not one)", "10.0.0", ""},
		{"an IPv6 address", "2001:db8::1", ""},
		{"a label of 64 characters", strings.Repeat("a", 64) + ".example", ""},
		{"a label of 63 characters", strings.Repeat("a", 63) + ".example", strings.Repeat("a", 63) + ".example"},
		{"longer than 253", strings.Repeat("abcdefghi.", 26) + "example", ""},
		{"non-ASCII", "bücher.example", ""},
		{"a quote", `a"b.example`, ""},
		{"a newline", "a\nb", ""},
		{"a percent", "%[src]", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHost(tt.in)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ParseHost(%q) = %q, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseHost(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParsePath(t *testing.T) {
	tests := []struct {
		name, in, want string // want "" means rejected
	}{
		{"root", "/", "/"},
		{"a prefix", "/api", "/api"},
		{"a trailing slash is dropped", "/api/", "/api"},
		{"several segments", "/api/v1", "/api/v1"},
		{"the accepted punctuation", "/a-b.c_d~e/f:g@h+i,j;k=l", "/a-b.c_d~e/f:g@h+i,j;k=l"},
		{"no leading slash", "api", ""},
		{"empty", "", ""},
		{"an empty segment", "/a//b", ""},
		{"a dot segment", "/a/./b", ""},
		{"a dot-dot segment", "/a/..", ""},
		{"a space", "/a b", ""},
		{"a query", "/a?b=1", ""},
		{"a fragment or comment", "/a#b", ""},
		{"percent-encoding", "/caf%C3%A9", ""},
		{"a quote", `/a"b`, ""},
		{"a backslash", `/a\b`, ""},
		{"a dollar", "/$HOME", ""},
		{"a newline", "/a\n", ""},
		{"too long", "/" + strings.Repeat("a", maxPath), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePath(tt.in)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ParsePath(%q) = %q, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParsePath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParsePort(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int // 0 means rejected
	}{
		{"the lowest", "1", 1},
		{"the highest", "65535", 65535},
		{"leading zeros are digits", "080", 80},
		{"zero", "0", 0},
		{"above the range", "65536", 0},
		{"far above", "99999999999999999999", 0},
		{"negative", "-1", 0},
		{"a sign", "+80", 0},
		{"a space", " 80", 0},
		{"a name", "http", 0},
		{"empty", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePort(tt.in)
			if (err == nil) != (tt.want != 0) || got != tt.want {
				t.Fatalf("ParsePort(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseAddress(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // host:8080 as a server line takes it; "" means rejected
	}{
		{"IPv4", "192.0.2.1", "192.0.2.1:8080"},
		{"IPv6 goes in brackets", "2001:db8::1", "[2001:db8::1]:8080"},
		{"IPv6 is written canonically", "2001:DB8:0:0::1", "[2001:db8::1]:8080"},
		{"IPv4-mapped IPv6 becomes IPv4", "::ffff:192.0.2.1", "192.0.2.1:8080"},
		{"a DNS name", "web-1.service.consul", "web-1.service.consul:8080"},
		{"a DNS name in capitals", "DB.Example", "db.example:8080"},
		{"a fully qualified name", "db.example.", "db.example.:8080"},
		{"underscores, as Docker names have", "proj_web_1", "proj_web_1:8080"},
		{"empty", "", ""},
		{"unspecified IPv4", "0.0.0.0", ""},
		{"unspecified IPv6", "::", ""},
		{"an IPv6 zone", "fe80::1%eth0", ""},
		{"an IPv4-mapped address with a zone", "::ffff:192.0.2.1%eth0", ""},
		{"brackets", "[2001:db8::1]", ""},
		{"with a port", "192.0.2.1:80", ""},
		{"an IPv4 address that is not one", "192.0.2.256", ""},
		{"a space", "a b", ""},
		{"a newline and a directive", "a\n    server evil 203.0.113.9:80", ""},
		{"a hash", "a#b", ""},
		{"a variable", "$HOST", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ParseAddress(tt.in)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ParseAddress(%q) = %+v, want an error", tt.in, a)
				}
				return
			}
			if err != nil || a.HostPort(8080) != tt.want {
				t.Fatalf("ParseAddress(%q) = %q, %v; want %q", tt.in, a.HostPort(8080), err, tt.want)
			}
		})
	}
}

func TestIdent(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"a safe name is kept", "web-1.eu_west", "web-1.eu_west"},
		{"case is kept", "Web", "Web"},
		{"other characters become underscores and a hash", "a b", "a_b-" + hash8Of("a b")},
		{"so a_b stays itself", "a_b", "a_b"},
		{"a Consul registrator ID", "host:web:8080", "host_web_8080-" + hash8Of("host:web:8080")},
		{"a long name is cut", strings.Repeat("x", 65), strings.Repeat("x", identPrefix) + "-" + hash8Of(strings.Repeat("x", 65))},
		{"empty", "", "_-" + hash8Of("")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Ident(tt.in); got != tt.want {
				t.Fatalf("Ident(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// hash8Of is what Ident appends: the first 4 bytes of SHA-256, in hex.
func hash8Of(s string) string { return hash8(s) }

func TestUniqueNames(t *testing.T) {
	got := uniqueNames([]string{"a", "a", "a-2", "b", "a"})
	want := []string{"a", "a-3", "a-2", "b", "a-4"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("uniqueNames = %q, want %q", got, want)
	}
}
