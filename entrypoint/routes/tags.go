package routes

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The tags the default configuration reads. Any other tag starting with
// "seamless." is reported as unknown (usually a typo); tags without that
// prefix belong to someone else and are ignored.
const (
	TagHTTPHost = "seamless.http.host"
	TagHTTPPath = "seamless.http.path"
	TagTCPPort  = "seamless.tcp.port"
	// TagHTTPTLS=redirect sends the service's plain HTTP requests to
	// HTTPS (308, which keeps the method and body).
	TagHTTPTLS = "seamless.http.tls"

	tagPrefix = "seamless."
)

// Routed reports whether a service whose instances carry tags between
// them can be routed at all: Build routes only services with a seamless.*
// tag, on any instance. A source may leave the others out (consul.Config's
// Wanted) and the configuration stays the same, provided no other source
// has a service of the same name (Build groups instances by name, across
// sources). The name is not used.
func Routed(_ string, tags []string) bool { return hasSeamlessTag(tags) }

// Limits of what a tag or a registration may carry.
const (
	maxPath = 256
	// MaxWeight is HAProxy's largest server weight.
	MaxWeight = 256
)

// Tags is what one instance's tags ask for, validated and normalised:
// hosts in lower case, paths without a trailing slash, each value once.
type Tags struct {
	Hosts []string // "example.com", "*.example.com" or an IPv4 address
	Paths []string // "/" or a prefix such as "/api"
	Ports []int    // TCP ports, 1–65535
	// Redirect: seamless.http.tls=redirect, HTTP requests go to HTTPS.
	Redirect bool
}

// Empty reports whether the tags ask for nothing.
func (t Tags) Empty() bool { return len(t.Hosts)+len(t.Paths)+len(t.Ports) == 0 }

// ParseTags reads the seamless.* tags of one instance. Every tag that
// cannot be used (a bad value, no value, a name seamless does not know,
// usually a typo) is described in problems, in words for an operator that
// name the tag. The caller must not route an instance with problems:
// using the rest of its tags could make its route wider than asked
// (a host without its path, a path without its host).
func ParseTags(tags []string) (t Tags, problems []string) {
	for _, tag := range tags {
		if len(tag) < len(tagPrefix) || !strings.EqualFold(tag[:len(tagPrefix)], tagPrefix) {
			continue
		}
		key, val, hasVal := strings.Cut(tag, "=")
		switch key {
		case TagHTTPHost, TagHTTPPath, TagTCPPort, TagHTTPTLS:
		default:
			problems = append(problems, fmt.Sprintf("unknown tag %s (known: %s, %s, %s, %s)",
				quote(key), TagHTTPHost, TagHTTPPath, TagTCPPort, TagHTTPTLS))
			continue
		}
		if !hasVal {
			problems = append(problems, fmt.Sprintf("tag %s has no value (%s=...)", key, key))
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
		case TagHTTPTLS:
			if val == "redirect" {
				t.Redirect = true
			} else {
				err = fmt.Errorf(`the only value is "redirect" (send HTTP requests to HTTPS)`)
			}
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("tag %s=%s is invalid: %v", key, quote(val), err))
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
	if !model.IsDNSName(name, false) {
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

// ParseAddress validates an instance address (model.CheckAddress, the
// rule every template shares) and normalises it: IPv4-mapped IPv6 becomes
// IPv4, a name is in lower case. A name is resolved by HAProxy at start;
// one that does not resolve leaves that server disabled (init-addr none),
// not the configuration broken.
func ParseAddress(s string) (Address, error) {
	if err := model.CheckAddress(s); err != nil {
		return Address{}, err
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		ip = ip.Unmap()
		return Address{Host: ip.String(), IPv6: ip.Is6()}, nil
	}
	return Address{Host: strings.ToLower(s)}, nil
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
