package template

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"reflect"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// HAProxy helpers. The escaping ones never fail: whatever the input, their
// output is harmless where the documentation says it may go. The checks
// return a bool, so a template can leave an instance out (and say so with
// `skip`).
var haproxyFuncs = map[string]any{
	"haproxyName":     HAProxyName,
	"haproxyQuote":    HAProxyQuote,
	"haproxyQuotable": HAProxyQuotable,
	"haproxyComment":  HAProxyComment,
	"haproxyAddr":     HAProxyAddr,
	"haproxyWeight":   HAProxyWeight,
	"isIP":            IsIP,
	"validHost":       ValidHost,
	"validPort":       ValidPort,
	"validAddr":       ValidAddr,
}

// maxNameLen bounds the readable part of a name from HAProxyName.
const maxNameLen = 128

func nameByte(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
}

// HAProxyName turns s into a name HAProxy accepts for a proxy (frontend,
// backend, listen) or a server: letters, digits, ".", "-" and "_" (HAProxy
// also allows ":", left out here because the runtime API and logs use it
// as a separator). A name made only of these, not empty, not longer than
// 128 bytes and without "__" comes out unchanged. Any other has every
// other character replaced by "_", is cut to 128 characters and gets "__"
// and 16 hex digits of its SHA-256 appended: two different inputs never
// share a name (short of a 64-bit hash collision), and an unchanged name,
// having no "__", never equals a changed one.
func HAProxyName(s string) string {
	var b strings.Builder
	changed := s == "" || len(s) > maxNameLen || strings.Contains(s, "__")
	n := 0
	for _, r := range s {
		if n == maxNameLen {
			changed = true
			break
		}
		if nameByte(r) {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
			changed = true
		}
		n++
	}
	if !changed {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return b.String() + "__" + hex.EncodeToString(sum[:8])
}

// HAProxyQuotable reports whether HAProxyQuote can represent s exactly: s
// has no control character (NUL, newline, tab... and DEL).
func HAProxyQuotable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

func bareByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("._:/@+,=-", c) >= 0
}

// HAProxyQuote returns one word of an HAProxy configuration line that
// HAProxy's parser reads back as exactly s: s itself when made only of
// letters, digits and "._:/@+,=-", else s in single quotes, inside which
// HAProxy expands nothing (no "$VAR", no backslash escape, no "#"
// comment), with each "'" written as '\” (close the quote, an escaped
// quote, reopen; HAProxy joins adjacent pieces into one word).
//
// A string with a control character cannot be written so that it stays on
// one line and means the same; for such input (see HAProxyQuotable) the
// result is ”, an empty word. HAProxy drops an empty word at the end of a
// line, so a directive missing its argument fails `haproxy -c` and the
// running configuration stays. The output never holds a control
// character, an unquoted space, "#", "$" or "\".
//
// Quoting guards the configuration's syntax only: a word starting with
// "-" is still read as a flag by `acl` (put "--" before patterns), and
// arguments that HAProxy parses further (log formats with "%", sample
// expressions) need their own care.
func HAProxyQuote(s string) string {
	if !HAProxyQuotable(s) {
		return "''"
	}
	bare := s != ""
	for i := 0; bare && i < len(s); i++ {
		bare = bareByte(s[i])
	}
	if bare {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// HAProxyComment makes s safe to follow "#" on a configuration line: every
// control character (newline included) becomes "?", so the comment cannot
// end early and start a directive.
func HAProxyComment(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c == 0x7f {
			b[i] = '?'
		}
	}
	return string(b)
}

// IsIP reports whether s is an IPv4 or IPv6 address (without a zone).
func IsIP(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Zone() == ""
}

// ValidHost reports whether s is an address a server line can take, by
// the rule every instance passes before a template sees it
// (model.CheckAddress): an IP address (no zone, not unspecified) or a DNS
// name of dot-separated labels of letters, digits, "-" and "_", each 1 to
// 63 long and not starting or ending with "-", 253 at most in all, the
// last one not all digits, with an optional final dot.
func ValidHost(s string) bool { return model.CheckAddress(s) == nil }

// port reads a port given as any integer or a decimal string.
func port(p any) (int, bool) {
	v := reflect.ValueOf(p)
	var n int64
	switch {
	case isInt(v):
		n = v.Int()
	case isUint(v):
		if v.Uint() > 65535 {
			return 0, false
		}
		n = int64(v.Uint())
	case v.Kind() == reflect.String:
		var err error
		if n, err = strconv.ParseInt(v.String(), 10, 32); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return int(n), true
}

// ValidPort reports whether p (a number or a decimal string) is a TCP port,
// 1 to 65535.
func ValidPort(p any) bool {
	_, ok := port(p)
	return ok
}

// ValidAddr reports whether host and port make a server address.
func ValidAddr(host string, p any) bool { return ValidHost(host) && ValidPort(p) }

// HAProxyAddr writes host and port as a server address: "10.0.0.1:80",
// "[2001:db8::1]:80", "web.example:80"; "" when either is invalid (see
// ValidAddr), which a server line then fails `haproxy -c` with.
func HAProxyAddr(host string, p any) string {
	n, ok := port(p)
	if !ok || !ValidHost(host) {
		return ""
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]:" + strconv.Itoa(n)
	}
	return host + ":" + strconv.Itoa(n)
}

// HAProxyWeight clamps a weight (a number or a decimal string) to HAProxy's
// range, 0 to 256; anything else is 1, HAProxy's default.
func HAProxyWeight(w any) int {
	v := reflect.ValueOf(w)
	var n int64
	switch {
	case isInt(v):
		n = v.Int()
	case isUint(v):
		n = int64(min(v.Uint(), 1<<20))
	case isFloat(v):
		f := v.Float()
		if f != f {
			return 1
		}
		n = int64(max(min(f, 1<<20), -1))
	case v.Kind() == reflect.String:
		var err error
		if n, err = strconv.ParseInt(strings.TrimSpace(v.String()), 10, 64); err != nil {
			return 1
		}
	default:
		return 1
	}
	return int(max(0, min(n, 256)))
}
