package routes

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// maxIdent bounds a name taken as it is; longer or unsafe names are cut
// to identPrefix characters and given a hash.
const (
	maxIdent    = 64
	identPrefix = 40
)

// Ident maps a name (a service name, an instance ID) to one HAProxy accepts
// for a proxy or a server: letters, digits, '-', '_' and '.'. A name made
// only of those (and at most 64 long) is kept as it is, so backends and
// servers read like the catalog; any other is cut, its other characters
// replaced by '_', and a hash of the whole name appended, so that "a b"
// and "a_b" stay apart. The mapping depends on the name alone: the same
// name always gives the same identifier, render after render.
func Ident(s string) string {
	if s != "" && len(s) <= maxIdent && isIdent(s) {
		return s
	}
	b := make([]byte, 0, identPrefix+9)
	for i := 0; i < len(s) && len(b) < identPrefix; i++ {
		if c := s[i]; isIdentByte(c) {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	if len(b) == 0 {
		b = append(b, '_')
	}
	sum := sha256.Sum256([]byte(s))
	return string(b) + "-" + hex.EncodeToString(sum[:4])
}

func isIdent(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isIdentByte(s[i]) {
			return false
		}
	}
	return s != ""
}

func isIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

// uniqueNames makes names unique in order: the second and later holders of
// a name get "-2", "-3"... (skipping names already taken). Callers pass
// names in a deterministic order.
func uniqueNames(names []string) []string {
	taken := make(map[string]bool, len(names))
	for _, n := range names {
		taken[n] = true
	}
	seen := make(map[string]bool, len(names))
	out := make([]string, len(names))
	for i, n := range names {
		if !seen[n] {
			seen[n] = true
			out[i] = n
			continue
		}
		for k := 2; ; k++ {
			c := n + "-" + strconv.Itoa(k)
			if !taken[c] {
				taken[c], seen[c] = true, true
				out[i] = c
				break
			}
		}
	}
	return out
}
