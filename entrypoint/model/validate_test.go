package model

import (
	"strings"
	"testing"
	"unicode"
)

func TestCheckName(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"a plain name", "web", true},
		{"punctuation is for the renderers to map, not refused", "team/web:v2", true},
		{"non-ASCII letters", "café", true},
		{"empty", "", false},
		{"a space", "my web", false},
		{"a newline", "web\nserver evil", false},
		{"a carriage return", "web\r", false},
		{"a tab", "web\t", false},
		{"NUL", "web\x00", false},
		{"DEL", "web\x7f", false},
		{"a C1 control", "web\u0085x", false},
		{"a no-break space", "web\u00a0x", false},
		{"a line separator", "web\u2028x", false},
		{"not UTF-8", "web\xff", false},
		// What HAProxy's tokenizer reads outside quotes: a comment, quotes,
		// an escape, a variable, an anonymous ACL's braces.
		{"a hash starts a comment", "web#x", false},
		{"a double quote", `web"`, false},
		{"a single quote", "web'", false},
		{"a backslash", `web\`, false},
		{"a dollar", "web$HOME", false},
		{"an opening brace", "web{", false},
		{"a closing brace", "web}", false},
		{"256 bytes", strings.Repeat("a", MaxName), true},
		{"257 bytes", strings.Repeat("a", MaxName+1), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckName("service name", tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("CheckName(%q) = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "service name") {
				t.Errorf("error %q does not name what it checked", err)
			}
		})
	}
}

func TestCheckAddress(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"IPv4", "192.0.2.1", true},
		{"IPv6", "2001:db8::1", true},
		{"IPv4-mapped IPv6", "::ffff:192.0.2.1", true},
		{"a DNS name", "web-1.service.consul", true},
		{"a DNS name in capitals", "DB.Example", true},
		{"a fully qualified name", "db.example.", true},
		{"underscores, as Docker names have", "proj_web_1", true},
		{"empty", "", false},
		{"unspecified IPv4", "0.0.0.0", false},
		{"unspecified IPv6", "::", false},
		{"an IPv6 zone", "fe80::1%eth0", false},
		{"brackets", "[2001:db8::1]", false},
		{"with a port", "192.0.2.1:80", false},
		{"an IPv4 address that is not one", "192.0.2.256", false},
		{"all-digit last label", "10.0.0", false},
		{"a space", "a b", false},
		{"the field test's registration", "10.0.0.1:80 redir http://evil.example #", false},
		{"a newline and a directive", "a\n    server evil 203.0.113.9:80", false},
		{"a hash", "a#b", false},
		{"a variable", "$HOST", false},
		{"a label too long", strings.Repeat("a", 64) + ".example", false},
		{"a leading hyphen", "-a.example", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := CheckAddress(tt.in); (err == nil) != tt.ok {
				t.Fatalf("CheckAddress(%q) = %v, want ok=%v", tt.in, err, tt.ok)
			}
		})
	}
}

// FuzzCheckInstance: whatever passes prints as one word of one line, and
// an address that passes is made only of the characters of IP addresses
// and DNS names.
func FuzzCheckInstance(f *testing.F) {
	for _, s := range []string{"web", "10.0.0.1", "2001:db8::1", "a b", "x\n server evil", "10.0.0.1:80 redir http://evil.example #",
		"café", "\u2028", "\xff", "db.example.", "fe80::1%eth0", "#", "'", "$X"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, name, addr string) {
		in := Instance{Name: name, ID: name, Node: name, Address: addr}
		if CheckInstance(in) != nil {
			return
		}
		for _, r := range name {
			if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar && !strings.Contains(name, "\uFFFD") {
				t.Fatalf("name %q passed with %U", name, r)
			}
		}
		if strings.Trim(addr, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:") != "" {
			t.Fatalf("address %q passed with other characters", addr)
		}
	})
}
