package apply

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// serversOnly reports whether next differs from taken, a configuration
// HAProxy runs, only in server lines: moved (their address), added or
// removed, within the sections that hold them. The text of next then says
// nothing to haproxy -c that taken did not, so next needs no check before
// its reload: at 1000 backends of 10 servers the check is some 250 ms of
// CPU, most of a template's time from a changed instance to the file.
// What the check would also have read again, files the configuration
// names (a certificate replaced on disk since), is read by the reload,
// whose refusal puts taken back.
//
// Each kind of change is held to what HAProxy already took:
//   - a moved server keeps its name and every other word, and its address
//     is an IP literal with a port on both sides, of the same family
//     (HAProxy parses it without resolving it; movedServer);
//   - an added server is named as HAProxy allows, by a name no other line
//     of next holds, has such an address, and the rest of its line is
//     that of a server HAProxy runs beside it, of the same family, made
//     of keywords that need nothing unique (addedServer);
//   - a removed server's name appears nowhere else in next: nothing
//     tracks it or routes to it by name (removedServer).
//
// Names are counted as HAProxy spells them: quotes taken out. A file
// where an escape, a variable in double quotes or a server-template could
// spell one otherwise has servers added or removed checked.
//
// Deliberately narrow: any other line that changed, a renamed server, a
// host name (resolved by the check), a quote or an escape in a changed
// line, a control character (HAProxy splits words on \v, \f and \r too),
// a wildcard or multicast address, a zero port, a server added to a run
// of servers without one beside it or outside a backend or listen
// section, or more than maxServerChanges added or removed at once needs
// the check.
func serversOnly(taken, next []byte) bool {
	if len(taken) == 0 {
		return false
	}
	ma, mb, start := changedRuns(taken, next)
	return serverChanges(splitServers(ma), splitServers(mb), sectionAt(taken, start), next)
}

// serverChanges is serversOnly of a and b, taken and next (or the same
// part of each) split, the first run in section.
func serverChanges(a, b servers, section string, next []byte) bool {
	if len(a.other) != len(b.other) {
		return false
	}
	for i := range a.other {
		if !bytes.Equal(a.other[i], b.other[i]) {
			return false
		}
	}
	changed, budget, names := false, maxServerChanges, &mentions{next: next}
	for i := range a.runs {
		if i > 0 {
			if s, ok := sectionOf(a.other[i-1]); ok {
				section = s
			}
		}
		ra, rb := a.runs[i], b.runs[i]
		if slices.EqualFunc(ra, rb, bytes.Equal) {
			continue
		}
		changed = true
		if !serverRun(ra, rb, section == "backend" || section == "listen", names, &budget) {
			return false
		}
	}
	return changed
}

// sectionOf is the section line opens, if it opens one.
func sectionOf(line []byte) (string, bool) {
	kind, _, ok := sectionName(line)
	return kind, ok
}

// sectionName is the kind and name of the section line opens, if it
// opens one.
func sectionName(line []byte) (kind, name string, ok bool) {
	w := words(string(line))
	if len(w) == 0 || !haproxy.Section(w[0]) {
		return "", "", false
	}
	if len(w) > 1 {
		name = w[1]
	}
	return w[0], name, true
}

// sectionAt is the section cfg's line at offset i is in: "" before any.
// Server lines mean one thing in a backend, others in peers or a ring.
func sectionAt(cfg []byte, i int) string {
	_, kind, _ := sectionHeaderAt(cfg, i)
	return kind
}

// sectionHeaderAt is sectionAt with the section's name and the offset of
// its header line (0 and "" before any section).
func sectionHeaderAt(cfg []byte, i int) (header int, kind, name string) {
	for i > 0 {
		j := bytes.LastIndexByte(cfg[:i-1], '\n') + 1
		if k, n, ok := sectionName(cfg[j : i-1]); ok {
			return j, k, n
		}
		i = j
	}
	return 0, "", ""
}

// maxServerChanges bounds the servers added or removed without a check:
// each is looked up in the whole configuration, and a change of many at
// once is not what the shortcut is for.
const maxServerChanges = 16

// changedRuns returns the lines of taken and of next from the first that
// differs to the last, widened to whole runs of server lines: what lies
// around them is the same in both, and a change is judged within its run.
// A change to one server of 10,000 then splits 10 lines, not 20,000.
// start is where they begin in taken.
func changedRuns(taken, next []byte) (a, b []byte, start int) {
	p := commonPrefix(taken, next)
	q := commonSuffix(taken[p:], next[p:])
	// Back to the start of the line p is in, and of the server lines
	// before it; on to the end of the line the suffix starts in, and of
	// the server lines after it.
	start = bytes.LastIndexByte(taken[:p], '\n') + 1
	for start > 0 {
		prev := bytes.LastIndexByte(taken[:start-1], '\n') + 1
		if !isServerLine(taken[prev : start-1]) {
			break
		}
		start = prev
	}
	endA, endB := lineEnd(taken, len(taken)-q), lineEnd(next, len(next)-q)
	for endA < len(taken) {
		e := lineEnd(taken, endA+1)
		if !isServerLine(taken[endA+1 : e]) {
			break
		}
		endA, endB = e, endB+(e-endA)
	}
	return taken[start:endA], next[start:endB], start
}

// equalRun is how many bytes commonPrefix and commonSuffix compare at a
// time: bytes.Equal compares a run several times faster than a loop over
// its bytes, which took a third of a millisecond per 400 KB, twice per
// change of a template at 1000 services × 10.
const equalRun = 256

// commonPrefix is the length of the longest prefix a and b share.
func commonPrefix(a, b []byte) int {
	n, p := min(len(a), len(b)), 0
	for p+equalRun <= n && bytes.Equal(a[p:p+equalRun], b[p:p+equalRun]) {
		p += equalRun
	}
	for p < n && a[p] == b[p] {
		p++
	}
	return p
}

// commonSuffix is the length of the longest suffix a and b share.
func commonSuffix(a, b []byte) int {
	n, q := min(len(a), len(b)), 0
	for q+equalRun <= n && bytes.Equal(a[len(a)-q-equalRun:len(a)-q], b[len(b)-q-equalRun:len(b)-q]) {
		q += equalRun
	}
	for q < n && a[len(a)-1-q] == b[len(b)-1-q] {
		q++
	}
	return q
}

// lineEnd is the index of the newline ending the line i is in, or len(b).
func lineEnd(b []byte, i int) int {
	if e := bytes.IndexByte(b[i:], '\n'); e >= 0 {
		return i + e
	}
	return len(b)
}

// servers is a configuration as its server lines and the rest: runs[i]
// are the server lines between other[i-1] and other[i].
type servers struct {
	other [][]byte
	runs  [][][]byte
}

func splitServers(cfg []byte) servers {
	var s servers
	var run [][]byte
	for {
		line, rest, found := bytes.Cut(cfg, []byte{'\n'})
		if isServerLine(line) {
			run = append(run, line)
		} else {
			s.runs = append(s.runs, run)
			s.other = append(s.other, line)
			run = nil
		}
		if !found {
			break
		}
		cfg = rest
	}
	s.runs = append(s.runs, run)
	return s
}

// isServerLine: the first word is "server", as HAProxy splits a line
// without control characters.
func isServerLine(line []byte) bool {
	w := bytes.TrimLeft(line, " \t")
	return len(w) > len("server") && bytes.HasPrefix(w, []byte("server")) &&
		(w[len("server")] == ' ' || w[len("server")] == '\t') && !controls(line)
}

// serverRun checks one run of server lines from taken (a) to next (b);
// servers may be added or removed only in a backend or listen section.
func serverRun(a, b [][]byte, proxy bool, names *mentions, budget *int) bool {
	byName := func(run [][]byte) (map[string]string, bool) {
		m := make(map[string]string, len(run))
		for _, l := range run {
			w := words(string(l))
			if len(w) < 2 {
				return nil, false
			}
			if _, dup := m[w[1]]; dup {
				return nil, false
			}
			m[w[1]] = string(l)
		}
		return m, true
	}
	ma, ok1 := byName(a)
	mb, ok2 := byName(b)
	if !ok1 || !ok2 {
		return false
	}
	for name, lb := range mb {
		la, ok := ma[name]
		switch {
		case ok && la == lb:
		case ok:
			if !movedServer(la, lb) {
				return false
			}
		default:
			if *budget--; !proxy || *budget < 0 || !addedServer(lb, a, names) {
				return false
			}
		}
	}
	for name := range ma {
		if _, ok := mb[name]; !ok {
			if *budget--; !proxy || *budget < 0 || !removedServer(name, names) {
				return false
			}
		}
	}
	return true
}

// addedServer: line is a server HAProxy takes if it took the lines of its
// run in taken.
func addedServer(line string, taken [][]byte, names *mentions) bool {
	w := words(line)
	if len(w) < 3 || !serverName(w[1]) {
		return false
	}
	if n, ok := names.count(w[1]); !ok || n != 1 {
		return false
	}
	addr, ok := plainAddr(w[2])
	if !ok || !plainKeywords(w[3:]) {
		return false
	}
	for _, l := range taken {
		tw := words(string(l))
		if len(tw) >= 3 && slices.Equal(tw[3:], w[3:]) {
			if ta, ok := plainAddr(tw[2]); ok && ta.Addr().Is4() == addr.Addr().Is4() {
				return true
			}
		}
	}
	return false
}

// removedServer: nothing in next names the server (use-server, track,
// srv_is_up...).
func removedServer(name string, names *mentions) bool {
	n, ok := names.count(name)
	return serverName(name) && ok && n == 0
}

// mentions counts server names in next as HAProxy spells them.
type mentions struct {
	next []byte
	done bool
	text []byte // next as names read in it, once done; nil: unknown
}

func (m *mentions) count(name string) (n int, ok bool) {
	if !m.done {
		m.text, m.done = spelt(m.next), true
	}
	if m.text == nil {
		return 0, false
	}
	return occurrences(m.text, name), true
}

// spelt is cfg with its quotes taken out, as HAProxy joins the parts of
// a word (web"2" is web2), or nil when a name could be spelt in a way
// the text does not show: an escape (web\x32), a variable in double
// quotes ("${N}"), or a server-template, which names servers itself.
func spelt(cfg []byte) []byte {
	if bytes.IndexByte(cfg, '\\') >= 0 || bytes.Contains(cfg, []byte("server-template")) {
		return nil
	}
	for i := 0; ; {
		j := bytes.IndexByte(cfg[i:], '$')
		if j < 0 {
			break
		}
		i += j
		start := bytes.LastIndexByte(cfg[:i], '\n') + 1
		if bytes.IndexByte(cfg[start:lineEnd(cfg, i)], '"') >= 0 {
			return nil
		}
		i++
	}
	if bytes.IndexAny(cfg, `"'`) < 0 {
		return cfg
	}
	out := make([]byte, 0, len(cfg))
	for _, c := range cfg {
		if c != '"' && c != '\'' {
			out = append(out, c)
		}
	}
	return out
}

// serverName: only the characters HAProxy allows in a server's name.
func serverName(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return !nameChar(r) })
}

func nameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == ':'
}

// occurrences counts name in cfg as a whole word: not next to a character
// a name may hold ("web-1" is not in "web-10", it is in "be/web-1").
func occurrences(cfg []byte, name string) int {
	n := 0
	for i := 0; ; {
		j := bytes.Index(cfg[i:], []byte(name))
		if j < 0 {
			return n
		}
		start, end := i+j, i+j+len(name)
		if (start == 0 || !nameChar(rune(cfg[start-1]))) && (end == len(cfg) || !nameChar(rune(cfg[end]))) {
			n++
		}
		i = start + 1
	}
}

// serverKeywords are the server keywords an added line may hold, copied
// from a line HAProxy took: none names anything unique to one server (an
// id, a cookie) or reads a file. The value is the number of words after.
var serverKeywords = map[string]int{
	"check": 0, "backup": 0, "send-proxy": 0, "send-proxy-v2": 0, "check-send-proxy": 0,
	"weight": 1, "maxconn": 1, "maxqueue": 1, "minconn": 1, "inter": 1, "fastinter": 1, "downinter": 1,
	"rise": 1, "fall": 1, "slowstart": 1, "observe": 1, "error-limit": 1, "on-error": 1,
	"on-marked-down": 1, "on-marked-up": 1,
}

func plainKeywords(w []string) bool {
	for i := 0; i < len(w); i++ {
		n, ok := serverKeywords[w[i]]
		if !ok {
			return false
		}
		i += n
	}
	return true
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

// serverMove is a server of a backend that moves to another address.
type serverMove struct {
	backend, server string
	to              netip.AddrPort
}

// movesOnly returns the servers next moves when that is all it changes
// from taken: every line that differs is a moved server (movedServer) of
// a backend or listen section, both named as HAProxy allows and the
// server named by no other server line of its section. Each move is then
// one `set server` away, and the worker runs what a reload of next would
// start it with. Left to a reload: a configuration that says hash-key
// anywhere (a server hashed by its address would keep its old place), or
// .if anywhere (the section a line is in depends on a condition; a name
// holding ".if" reloads too).
func movesOnly(taken, next []byte) ([]serverMove, bool) {
	if len(taken) == 0 || bytes.Contains(next, []byte("hash-key")) || bytes.Contains(next, []byte(".if")) {
		return nil, false
	}
	ma, mb, start := changedRuns(taken, next)
	if bytes.Count(ma, []byte{'\n'}) != bytes.Count(mb, []byte{'\n'}) {
		return nil, false
	}
	// Offsets are next's: before start its bytes are taken's.
	header, kind, name := sectionHeaderAt(taken, start)
	var moves []serverMove
	headers := map[int]bool{}
	at := start
	for {
		la, ra, more := bytes.Cut(ma, []byte{'\n'})
		lb, rb, _ := bytes.Cut(mb, []byte{'\n'})
		switch {
		case bytes.Equal(la, lb):
			if k, n, ok := sectionName(lb); ok {
				header, kind, name = at, k, n
			}
		case (kind == "backend" || kind == "listen") && serverName(name) &&
			isServerLine(la) && isServerLine(lb) && movedServer(string(la), string(lb)):
			w := words(string(lb))
			to, _ := plainAddr(w[2])
			if !serverName(w[1]) {
				return nil, false
			}
			moves = append(moves, serverMove{backend: name, server: w[1], to: to})
			headers[header] = true
		default:
			return nil, false
		}
		if !more {
			break
		}
		at += len(lb) + 1
		ma, mb = ra, rb
	}
	for h := range headers {
		if !namedOnce(next, h, moves) {
			return nil, false
		}
	}
	return moves, len(moves) > 0
}

// namedOnce: in the section whose header line starts at offset header of
// cfg, each server moves names in that section is named by one server
// line alone, so that `set server` reaches the one that moved.
func namedOnce(cfg []byte, header int, moves []serverMove) bool {
	first, rest, _ := bytes.Cut(cfg[header:], []byte{'\n'})
	_, section, _ := sectionName(first)
	count := map[string]int{}
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte{'\n'})
		if _, _, ok := sectionName(line); ok {
			break
		}
		if w := words(string(line)); len(w) > 1 && (w[0] == "server" || w[0] == "server-template") {
			count[w[1]]++
		}
	}
	for _, m := range moves {
		if m.backend == section && count[m.server] != 1 {
			return false
		}
	}
	return true
}

func moveCommands(moves []serverMove) []string {
	cmds := make([]string, len(moves))
	for i, m := range moves {
		cmds[i] = "set server " + slotKey(m.backend, m.server) + " addr " + m.to.Addr().String() + " port " + strconv.Itoa(int(m.to.Port()))
	}
	return cmds
}

// verifyMoves checks that HAProxy's servers are where moves put them.
func verifyMoves(moves []serverMove, got []haproxy.ServerState) error {
	have := make(map[slotID]haproxy.ServerState, len(got))
	for _, s := range got {
		have[slotID{s.Backend, s.Server}] = s
	}
	var bad []string
	for _, m := range moves {
		k := slotKey(m.backend, m.server)
		g, ok := have[slotID{m.backend, m.server}]
		if !ok {
			bad = append(bad, k+" is missing")
			continue
		}
		if a, err := netip.ParseAddr(g.Address); err != nil || a != m.to.Addr() || g.Port != int(m.to.Port()) {
			bad = append(bad, fmt.Sprintf("%s is at %s:%d, want %s", k, g.Address, g.Port, m.to))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("HAProxy's servers differ from the plan: %s", strings.Join(bad, "; "))
	}
	return nil
}
