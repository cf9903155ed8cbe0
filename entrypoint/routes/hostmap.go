package routes

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
)

// HAProxy tries a frontend's use_backend rules one by one: with a rule per
// host, a request for the last of 10,000 hosts cost it 1.8 ms of CPU
// (HAProxy 2.6: 498 requests a second against 4,976 through a map). Past
// hostMapMin exact hosts, those routed whole (any path) are looked up in a
// map file instead, a tree. The rules of an exact host with a path stay
// rules and come before the map, wildcards and rules for any host after
// it: the order the rules had (compareRules), since the rules of two
// exact hosts never match the same request.

// hostMapMin is how many exact hosts routed whole take a map rather than
// a rule each: a few dozen rules cost HAProxy nothing to speak of, and
// stay readable in the configuration.
const hostMapMin = 64

// hostMap is a map file of exact hosts to their backends, which the
// rendering hands the applier to write (model.Rendering.Files). Its name
// holds a digest of its content, so that a file once written never
// changes: the configuration that names it, and only that one, reads it.
type hostMap struct {
	path string
	text []byte
}

// mapHosts takes the exact hosts routed whole out of rules into a map in
// dir, in its place among the rules, when they are at least min; it
// returns rules as they are otherwise.
func mapHosts(rules []viewRule, dir string, min int) ([]viewRule, *hostMap) {
	n := 0
	for _, r := range rules {
		if r.HostMatch == "str" && r.Path == "" {
			n++
		}
	}
	if dir == "" || n < min {
		return rules, nil
	}
	var text bytes.Buffer
	kept := make([]viewRule, 0, len(rules)-n+1)
	at := -1 // where the map goes: after the exact hosts' path rules
	for _, r := range rules {
		if r.HostMatch == "str" && r.Path == "" {
			text.WriteString(r.Host + " " + r.Backend + "\n")
			continue
		}
		if at < 0 && r.HostMatch != "str" {
			at = len(kept)
		}
		kept = append(kept, r)
	}
	if at < 0 {
		at = len(kept)
	}
	sum := sha256.Sum256(text.Bytes())
	m := &hostMap{path: filepath.Join(dir, "hosts-"+hex.EncodeToString(sum[:16])+".map"), text: text.Bytes()}
	kept = append(kept[:at], append([]viewRule{{Map: m.path}}, kept[at:]...)...)
	return kept, m
}

// removeHostMaps removes the map files in dir but keep (none when ""),
// and what an interrupted write of one left: once HAProxy runs a
// configuration, no other reads them.
func removeHostMaps(dir, keep string) {
	old, _ := filepath.Glob(filepath.Join(dir, "hosts-*.map"))
	tmp, _ := filepath.Glob(filepath.Join(dir, ".hosts-*.map.tmp-*"))
	for _, p := range append(old, tmp...) {
		if p != keep {
			os.Remove(p)
		}
	}
}

// mapSweep tells when the state directory needs a sweep for hosts maps:
// at the first commit (an earlier run's maps), and after a rendering that
// named a map other than the one kept (it may have been written, and not
// taken). Otherwise a commit keeps the map HAProxy reads already, and
// nothing else can be there: a listing of the directory per change saved.
type mapSweep struct {
	mu    sync.Mutex
	kept  string // the map of the last sweep ("": none)
	clean bool   // the directory holds kept alone; false before a first sweep
}

// rendered notes the map a rendering names.
func (m *mapSweep) rendered(path string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if path != m.kept {
		m.clean = false
	}
}

// sweep reports whether a commit of path must sweep, and notes that it
// does.
func (m *mapSweep) sweep(path string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.clean && path == m.kept {
		return false
	}
	m.kept, m.clean = path, true
	return true
}
