package haproxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Bind is one TCP address a configuration listens on.
type Bind struct {
	// Network is "tcp4", "tcp6" (IPv6 only) or "tcp" (an IPv6 wildcard
	// that also takes IPv4, as HAProxy binds [::] by default).
	Network string
	Addr    netip.AddrPort
	File    string
	Line    int
	// Conditional: inside a .if block, which seamless does not evaluate.
	Conditional bool
}

func (b Bind) String() string { return b.Addr.String() }

// Where is file:line of the bind line.
func (b Bind) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// bindSections are the sections whose bind lines listen on TCP.
var bindSections = map[string]bool{"frontend": true, "listen": true, "peers": true, "log-forward": true}

// sections are the keywords that open a section; lines of the others are
// skipped.
var sections = map[string]bool{
	"global": true, "defaults": true, "frontend": true, "listen": true, "backend": true, "peers": true,
	"log-forward": true, "resolvers": true, "userlist": true, "program": true, "mailers": true,
	"http-errors": true, "ring": true, "cache": true, "crt-store": true, "traces": true, "acme": true,
	"dynamic-update": true,
}

// Section reports whether word, a line's first, opens a section.
func Section(word string) bool { return sections[word] }

// maxPorts bounds the ports one address of a bind line may expand to; a
// wider range is skipped rather than probed.
const maxPorts = 1024

// ParseBinds lists the TCP addresses that the bind lines of files (and TCP
// stats sockets) listen on. It reads conservatively: whatever it cannot
// resolve for certain (unix and abns sockets, fd@, host names, unset
// environment variables, bind options that change where or how it binds)
// is left out, never guessed; HAProxy's own check decides the syntax.
// getenv resolves "${NAME}" as HAProxy would (its environment).
func ParseBinds(files []string, getenv func(string) (string, bool)) ([]Bind, error) {
	var out []Bind
	for _, f := range files {
		b, err := parseBindFile(f, getenv)
		if err != nil {
			return out, err
		}
		out = append(out, b...)
	}
	return out, nil
}

func parseBindFile(path string, getenv func(string) (string, bool)) ([]Bind, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseBindReader(path, f, make([]byte, 64*1024), getenv)
}

// parseBindContents is ParseBinds of files whose contents are read.
func parseBindContents(files []string, contents [][]byte, getenv func(string) (string, bool)) ([]Bind, error) {
	var out []Bind
	for i, f := range files {
		// In memory, a buffer grows only for a line longer than its start.
		b, err := parseBindReader(f, bytes.NewReader(contents[i]), make([]byte, 4096), getenv)
		if err != nil {
			return out, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// parseBindReader is parseBindFile of r, path's content, scanned through
// buf; a line may grow it to 1 MiB.
func parseBindReader(path string, r io.Reader, buf []byte, getenv func(string) (string, bool)) ([]Bind, error) {
	var out []Bind
	section, depth, n := "", 0, 0
	sc := bufio.NewScanner(r)
	sc.Buffer(buf, 1024*1024)
	for sc.Scan() {
		n++
		if w, plain := firstWord(sc.Bytes()); plain && !keyword(w) {
			continue // a server line of ten thousand: no word to split
		}
		words, ok := splitLine(sc.Text(), getenv)
		if len(words) == 0 {
			continue
		}
		switch w := words[0].text; {
		case w == ".if":
			depth++
			continue
		case w == ".endif":
			depth = max(depth-1, 0)
			continue
		case strings.HasPrefix(w, "."):
			continue
		case sections[w]:
			section = w
			continue
		}
		var addrs word
		var opts []word
		switch {
		case bindSections[section] && words[0].text == "bind" && len(words) > 1:
			addrs, opts = words[1], words[2:]
		case section == "global" && len(words) > 2 && words[0].text == "stats" && words[1].text == "socket":
			addrs, opts = words[2], words[3:]
		default:
			continue
		}
		if !ok || !addrs.known || !plainBind(opts) {
			continue
		}
		v6only := hasWord(opts, "v6only")
		for _, a := range strings.Split(addrs.text, ",") {
			for _, b := range parseBindAddr(a, v6only) {
				b.File, b.Line, b.Conditional = path, n, depth > 0
				out = append(out, b)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// firstWord is line's first word as it is written, and whether that is
// the word itself: no quote or escape, which only splitLine reads.
func firstWord(line []byte) (w []byte, plain bool) {
	i := 0
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	j := i
	for j < len(line) && line[j] != ' ' && line[j] != '\t' && line[j] != '#' {
		switch line[j] {
		case '"', '\'', '\\':
			return nil, false
		}
		j++
	}
	return line[i:j], true
}

// keyword: a first word parseBindFile reads the line for.
func keyword(w []byte) bool {
	switch string(w) {
	case "bind", "stats":
		return true
	}
	return len(w) > 0 && w[0] == '.' || sections[string(w)]
}

// plainBind: no option that binds elsewhere than the address says
// (another network namespace, one interface, a foreign address).
func plainBind(opts []word) bool {
	for _, o := range opts {
		switch o.text {
		case "namespace", "interface", "transparent", "v4v6":
			return false
		}
	}
	return true
}

func hasWord(ws []word, s string) bool {
	for _, w := range ws {
		if w.text == s {
			return true
		}
	}
	return false
}

// parseBindAddr reads one address of a bind line ("[prefix@]host:port[-end]").
func parseBindAddr(s string, v6only bool) []Bind {
	family := ""
	if p, rest, ok := strings.Cut(s, "@"); ok {
		switch p {
		case "ipv4", "tcp4":
			family = "4"
		case "ipv6", "tcp6":
			family = "6"
		case "tcp":
		default:
			return nil // unix@, abns@, fd@, sockpair@, udp@, quic4@...
		}
		s = rest
	}
	if strings.HasPrefix(s, "/") {
		return nil
	}
	var host, ports string
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 || !strings.HasPrefix(s[end+1:], ":") {
			return nil
		}
		host, ports = s[1:end], s[end+2:]
	} else {
		i := strings.LastIndex(s, ":")
		if i < 0 {
			return nil
		}
		host, ports = s[:i], s[i+1:]
	}
	var ip netip.Addr
	switch {
	case host == "" || host == "*":
		ip = netip.IPv4Unspecified()
		if family == "6" {
			ip = netip.IPv6Unspecified()
		}
	default:
		var err error
		if ip, err = netip.ParseAddr(host); err != nil || ip.Zone() != "" {
			return nil // a host name, resolved by HAProxy at start-up
		}
	}
	ip = ip.Unmap()
	if family == "4" && !ip.Is4() || family == "6" && !ip.Is6() {
		return nil
	}
	network := "tcp4"
	if ip.Is6() {
		network = "tcp6"
		if ip.IsUnspecified() && !v6only {
			network = "tcp"
		}
	}
	lo, hi, ok := portRange(ports)
	if !ok {
		return nil
	}
	var out []Bind
	for p := lo; p <= hi; p++ {
		out = append(out, Bind{Network: network, Addr: netip.AddrPortFrom(ip, uint16(p))})
	}
	return out
}

func portRange(s string) (lo, hi int, ok bool) {
	a, b, isRange := strings.Cut(s, "-")
	lo, err := strconv.Atoi(a)
	if err != nil || lo < 1 || lo > 65535 || a != strconv.Itoa(lo) {
		return 0, 0, false
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil || hi < lo || hi > 65535 || b != strconv.Itoa(hi) || hi-lo >= maxPorts {
			return 0, 0, false
		}
	}
	return lo, hi, true
}

// word is one word of a configuration line; known is false when it holds
// something seamless cannot resolve for certain (an unset or unusual
// variable, an escape).
type word struct {
	text  string
	known bool
}

// splitLine splits a line into words as HAProxy's parser does for the
// common cases: blanks separate words, '#' starts a comment, double
// quotes expand "$NAME" and "${NAME}", single quotes are literal. ok is
// false when the quoting does not close.
func splitLine(line string, getenv func(string) (string, bool)) (words []word, ok bool) {
	var cur strings.Builder
	known, in, started := true, false, false
	flush := func() {
		if started {
			words = append(words, word{cur.String(), known})
		}
		cur.Reset()
		known, in, started = true, false, false
	}
	quote := byte(0)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				flush()
			}
			continue
		case quote == 0 && c == '#':
			flush()
			return words, true
		case c == '\\':
			known = false // escapes: left to HAProxy
			if i+1 < len(line) {
				i++
				cur.WriteByte(line[i])
			}
		case quote == 0 && (c == '"' || c == '\''):
			quote = c
		case quote != 0 && c == quote:
			quote = 0
		case quote == '"' && c == '$':
			name, n := varName(line[i+1:])
			v, set := "", false
			if name != "" && getenv != nil {
				v, set = getenv(name)
			}
			if !set {
				known = false
			}
			cur.WriteString(v)
			i += n
		default:
			cur.WriteByte(c)
		}
		in, started = true, true
	}
	if quote != 0 {
		return words, false
	}
	flush()
	return words, true
}

// varName reads "NAME" or "{NAME}" after a '$' and returns the name and
// the bytes it took; "" for any other form.
func varName(s string) (string, int) {
	braced := strings.HasPrefix(s, "{")
	i := 0
	if braced {
		i = 1
	}
	start := i
	for i < len(s) && (s[i] == '_' || s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z' || i > start && s[i] >= '0' && s[i] <= '9') {
		i++
	}
	name := s[start:i]
	if braced {
		if i >= len(s) || s[i] != '}' {
			return "", 0
		}
		i++
	}
	return name, i
}
