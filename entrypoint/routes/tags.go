package routes

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The tags the default configuration reads. Any other tag starting with
// "seamless." is reported as unknown (usually a typo); tags without that
// prefix belong to someone else and are ignored.
const (
	TagHTTPHost = "seamless.http.host"
	TagHTTPPath = "seamless.http.path"
	TagTCPPort  = "seamless.tcp.port"

	tagPrefix = "seamless."
)

// Limits of what a tag or a registration may carry.
const (
	maxServiceName = 128
	maxPath        = 256
	maxDNSName     = 253
	maxLabel       = 63
	// MaxWeight is HAProxy's largest server weight.
	MaxWeight = 256
)

// Tags is what one instance's tags ask for, validated and normalised:
// hosts in lower case, paths without a trailing slash, each value once.
type Tags struct {
	Hosts []string // "example.com", "*.example.com" or an IPv4 address
	Paths []string // "/" or a prefix such as "/api"
	Ports []int    // TCP ports, 1–65535
}

// Empty reports whether the tags ask for nothing.
func (t Tags) Empty() bool { return len(t.Hosts)+len(t.Paths)+len(t.Ports) == 0 }

// ParseTags reads the seamless.* tags of one instance. Every tag that
// cannot be used is left out and described in problems, in words for an
// operator; the others apply.
func ParseTags(tags []string) (t Tags, problems []string) {
	for _, tag := range tags {
		if len(tag) < len(tagPrefix) || !strings.EqualFold(tag[:len(tagPrefix)], tagPrefix) {
			continue
		}
		key, val, hasVal := strings.Cut(tag, "=")
		switch key {
		case TagHTTPHost, TagHTTPPath, TagTCPPort:
		default:
			problems = append(problems, fmt.Sprintf("unknown tag %s left out (known: %s, %s, %s)",
				quote(key), TagHTTPHost, TagHTTPPath, TagTCPPort))
			continue
		}
		if !hasVal {
			problems = append(problems, fmt.Sprintf("tag %s left out: it has no value (%s=...)", key, key))
			continue
		}
		var err error
		switch key {
		case TagHTTPHost:
			var h string
			if h, err = ParseHost(val); err == nil && !slices.Contains(t.Hosts, h) {
				t.Hosts = append(t.Hosts, h)
			}
		case TagHTTPPath:
			var p string
			if p, err = ParsePath(val); err == nil && !slices.Contains(t.Paths, p) {
				t.Paths = append(t.Paths, p)
			}
		case TagTCPPort:
			var p int
			if p, err = ParsePort(val); err == nil && !slices.Contains(t.Ports, p) {
				t.Ports = append(t.Ports, p)
			}
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("tag %s=%s left out: %v", key, quote(val), err))
		}
	}
	return t, problems
}

// ParseHost validates a host name for seamless.http.host and returns it in
// lower case: dot-separated labels of letters, digits and hyphens (not at
// either end of a label), the last one not all digits; or an IPv4 address;
// or "*." followed by a name, which matches every name ending in ".name"
// (at any depth, never the name itself).
func ParseHost(s string) (string, error) {
	h := strings.ToLower(s)
	name, wildcard := strings.CutPrefix(h, "*.")
	if ip, err := netip.ParseAddr(name); err == nil && ip.Is4() && !wildcard {
		return ip.String(), nil
	}
	if !isDNSName(name, false) {
		return "", fmt.Errorf("not a host name: use letters, digits and hyphens in dot-separated labels, " +
			`an IPv4 address, or "*." and a name for every name under it`)
	}
	return h, nil
}

// ParsePath validates a path prefix for seamless.http.path and returns it
// without a trailing slash ("/" stays "/"). A prefix matches whole path
// segments: "/api" matches /api and /api/x, not /apix.
func ParsePath(s string) (string, error) {
	if !strings.HasPrefix(s, "/") {
		return "", fmt.Errorf(`not a path prefix: it must start with "/"`)
	}
	if len(s) > maxPath {
		return "", fmt.Errorf("path prefix longer than %d characters", maxPath)
	}
	for i := 0; i < len(s); i++ {
		if !isPathByte(s[i]) {
			return "", fmt.Errorf("path prefix has %s: only letters, digits and - . _ ~ / : @ + , ; = are accepted",
				describeByte(s[i]))
		}
	}
	p := s
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	if p == "/" {
		return p, nil
	}
	for seg := range strings.SplitSeq(p[1:], "/") {
		switch seg {
		case "":
			return "", fmt.Errorf(`path prefix has an empty segment ("//")`)
		case ".", "..":
			return "", fmt.Errorf("path prefix has a %q segment", seg)
		}
	}
	return p, nil
}

// ParsePort validates a TCP port: decimal digits, 1–65535.
func ParsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a port number")
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %d is outside 1–65535", p)
	}
	return p, nil
}

// CheckServiceName reports why a service name cannot be used: it must be
// 1–128 printable ASCII characters without spaces. Backend names are
// derived from it (see Ident), never printed as they are.
func CheckServiceName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("the service has no name")
	case len(s) > maxServiceName:
		return fmt.Errorf("service name longer than %d characters", maxServiceName)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return fmt.Errorf("service name has %s: only printable ASCII without spaces is accepted", describeByte(s[i]))
		}
	}
	return nil
}

// Address is a validated server address.
type Address struct {
	// Host is an IPv4 address, an IPv6 address (without brackets) or a
	// DNS name in lower case.
	Host string
	IPv6 bool
}

// HostPort is the address as a server line takes it: IPv6 in brackets.
func (a Address) HostPort(port int) string {
	if a.IPv6 {
		return "[" + a.Host + "]:" + strconv.Itoa(port)
	}
	return a.Host + ":" + strconv.Itoa(port)
}

// ParseAddress validates an instance address: an IPv4 or IPv6 address
// (IPv4-mapped IPv6 becomes IPv4; no zone; not unspecified) or a DNS name
// (labels of letters, digits, hyphens and underscores, an optional final
// dot). A name is resolved by HAProxy at start; one that does not resolve
// leaves that server disabled (init-addr none), not the configuration
// broken.
func ParseAddress(s string) (Address, error) {
	if s == "" {
		return Address{}, fmt.Errorf("the instance has no address")
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		if ip.Zone() != "" { // before Unmap, which drops it
			return Address{}, fmt.Errorf("address %s has an IPv6 zone, which a server line cannot carry", quote(s))
		}
		ip = ip.Unmap()
		if ip.IsUnspecified() {
			return Address{}, fmt.Errorf("address %s is unspecified (it means every address, not one)", quote(s))
		}
		return Address{Host: ip.String(), IPv6: ip.Is6()}, nil
	}
	name := strings.ToLower(s)
	if !isDNSName(strings.TrimSuffix(name, "."), true) {
		return Address{}, fmt.Errorf("address %s is neither an IP address nor a DNS name", quote(s))
	}
	return Address{Host: name}, nil
}

// isDNSName reports whether s (lower case) is a DNS name: 1–253
// characters, labels of 1–63 letters, digits and hyphens (and underscores
// if underscore), not starting or ending with a hyphen, and a last label
// that is not all digits (so that "10.0.0" is not taken for a name).
func isDNSName(s string, underscore bool) bool {
	if s == "" || len(s) > maxDNSName {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > maxLabel || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || underscore && c == '_') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

func isPathByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("-._~/:@+,;=", c) >= 0
}

// describeByte names a byte for a message without printing it raw.
func describeByte(c byte) string {
	if c > ' ' && c <= '~' {
		return fmt.Sprintf("the character %q", c)
	}
	return fmt.Sprintf("the byte 0x%02x", c)
}

// quote prints an untrusted string for a log message: as it is when it is
// made of safe characters, else Go-quoted so that no newline or control
// character reaches the log.
func quote(s string) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~/:@+,;=*", c) >= 0) {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}
