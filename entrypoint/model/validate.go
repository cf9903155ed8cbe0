package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxName bounds a service name, instance ID or node name: a longer one
// could push a configuration line past what HAProxy reads.
const MaxName = 256

// CheckInstance reports why an instance must not reach any template, the
// built-in one or a user's: its service name, ID and node must be words
// (see CheckName) and its address a host a server line can take (see
// CheckAddress), as must its node's address when it has one. Every
// renderer calls it, so that the rule is one.
func CheckInstance(in Instance) error {
	if err := CheckName("service name", in.Name); err != nil {
		return err
	}
	if in.ID != "" {
		if err := CheckName("instance ID", in.ID); err != nil {
			return err
		}
	}
	if in.Node != "" {
		if err := CheckName("node name", in.Node); err != nil {
			return err
		}
	}
	if err := CheckAddress(in.Address); err != nil {
		return err
	}
	if in.NodeAddress != "" {
		if err := CheckAddress(in.NodeAddress); err != nil {
			return fmt.Errorf("node %w", err)
		}
	}
	return nil
}

// haproxySyntax are the characters HAProxy's tokenizer treats specially
// outside quotes: '#' starts a comment, quotes and '\' change words, '$'
// expands a variable; braces delimit an anonymous ACL.
const haproxySyntax = "#\"'\\${}"

// CheckName reports why s cannot be what names a service, an instance or a
// node: it must be 1 to MaxName bytes of UTF-8 without whitespace, control
// characters or haproxySyntax, so that printed raw it stays one word of
// one line (a name with '#' would cut a server line of a user's template,
// and HAProxy would refuse every configuration while it is registered).
func CheckName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("the %s is empty", what)
	case len(s) > MaxName:
		return fmt.Errorf("the %s is longer than %d bytes", what, MaxName)
	case !utf8.ValidString(s):
		return fmt.Errorf("the %s is not UTF-8", what)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return fmt.Errorf("the %s has %s: whitespace and control characters are not accepted", what, describeRune(r))
	}
	if i := strings.IndexAny(s, haproxySyntax); i >= 0 {
		return fmt.Errorf("the %s has %s (%q): HAProxy's configuration reads %s as syntax, not as part of a word", what, describeRune(rune(s[i])), s[i], haproxySyntax)
	}
	return nil
}

// CheckAddress reports why s is not an address a server line can take: an
// IPv4 or IPv6 address (no zone, not unspecified), or a DNS name of
// dot-separated labels of letters, digits, hyphens and underscores (1–63
// each, not starting or ending with a hyphen, at most 253 in all, the last
// not all digits so that "10.0.0" is no name), with an optional final dot.
func CheckAddress(s string) error {
	if s == "" {
		return fmt.Errorf("the instance has no address")
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		switch {
		case ip.Zone() != "":
			return fmt.Errorf("address %s has an IPv6 zone, which a server line cannot carry", strconv.Quote(s))
		case ip.Unmap().IsUnspecified():
			return fmt.Errorf("address %s is unspecified (it means every address, not one)", strconv.Quote(s))
		}
		return nil
	}
	if !IsDNSName(strings.TrimSuffix(s, "."), true) {
		return fmt.Errorf("address %s is neither an IP address nor a DNS name", strconv.Quote(s))
	}
	return nil
}

// IsDNSName reports whether s is a DNS name, in any case: 1–253
// characters, labels of 1–63 letters, digits and hyphens (and underscores
// if underscore), not starting or ending with a hyphen, and a last label
// that is not all digits.
func IsDNSName(s string, underscore bool) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || underscore && c == '_') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// describeRune names a character for a message without printing it raw.
func describeRune(r rune) string {
	if r < 0x80 {
		return fmt.Sprintf("the byte 0x%02x", r)
	}
	return fmt.Sprintf("the character %U", r)
}
