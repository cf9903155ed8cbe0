package apply

import (
	"bytes"
	"net/netip"
	"strings"
)

// movedOnly reports whether next differs from taken, a configuration
// HAProxy runs, only in the address of server lines, each an IP literal
// with a port on both sides, of the same family. The text of next then
// says nothing to haproxy -c that taken did not: HAProxy parses such an
// address without resolving it. So next needs no check before its
// reload: at 1000 backends of 10 servers the check is some 250 ms of
// CPU, most of a template's time from a moved instance to the file.
// What the check would also have read again, files the configuration
// names (a certificate replaced on disk since), is read by the reload,
// whose refusal puts taken back.
//
// Deliberately narrow: an added or removed line, a renamed server, a
// host name (resolved by the check), a quote or an escape before the
// address (which could make it part of the name), a control character
// (HAProxy splits words on \v, \f and \r too), a wildcard or multicast
// address, or a zero port needs the check.
func movedOnly(taken, next []byte) bool {
	if len(taken) == 0 {
		return false
	}
	moved := false
	for len(taken) > 0 && len(next) > 0 {
		a, restA, endA := bytes.Cut(taken, []byte{'\n'})
		b, restB, endB := bytes.Cut(next, []byte{'\n'})
		if endA != endB {
			return false
		}
		if !bytes.Equal(a, b) {
			if controls(a) || controls(b) || !movedServer(string(a), string(b)) {
				return false
			}
			moved = true
		}
		taken, next = restA, restB
	}
	return moved && len(taken) == 0 && len(next) == 0
}

// movedServer: a and b are the same server line but for its address.
func movedServer(a, b string) bool {
	fa, fb := words(a), words(b)
	if len(fa) < 3 || len(fa) != len(fb) || fa[0] != "server" || fb[0] != "server" {
		return false
	}
	for i := range fa {
		if i != 2 && fa[i] != fb[i] {
			return false
		}
	}
	if strings.ContainsAny(fa[1], `"'\#$`) {
		return false
	}
	from, ok1 := plainAddr(fa[2])
	to, ok2 := plainAddr(fb[2])
	return ok1 && ok2 && from.Addr().Is4() == to.Addr().Is4()
}

// plainAddr parses an IP literal with a port that HAProxy takes as it
// stands: no zone, no IPv4-mapped form, no wildcard or multicast address,
// a port other than 0.
func plainAddr(s string) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return ap, false
	}
	ip := ap.Addr()
	return ap, ap.Port() != 0 && ip.Zone() == "" && !ip.Is4In6() && !ip.IsUnspecified() && !ip.IsMulticast()
}

// controls reports a control character other than a tab: HAProxy
// separates words on some (\v, \f, \r), which words does not.
func controls(line []byte) bool {
	return bytes.ContainsFunc(line, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f })
}

// words splits a line as HAProxy does outside quotes, a line without
// control characters: on spaces and tabs (strings.Fields would also split
// on characters HAProxy keeps in a word, such as a no-break space, and so
// misplace the address).
func words(line string) []string {
	return strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })
}
