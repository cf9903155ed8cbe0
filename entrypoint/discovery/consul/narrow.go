package consul

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
)

// uses reports whether the service name, whose instances carry tags
// between them (the union /v1/catalog/services lists), is watched: it has
// the tag filter's tag, and Config.Wanted takes it.
func (s *Source) uses(name string, tags []string) bool {
	if s.cfg.TagFilter != "" && !slices.Contains(tags, s.cfg.TagFilter) {
		return false
	}
	return s.cfg.Wanted == nil || s.cfg.Wanted(name, tags)
}

// watchSet decides which services of one catalog are watched, and keeps
// the count of both for Source.Services. It serves every mode of the
// catalog (per service, node dump, public endpoints) so that all three
// give the same catalog, and a switch between them logs nothing. Only the
// catalog's watch goroutine calls update.
type watchSet struct {
	s  *Source
	dc string

	listed, watched atomic.Int64

	known   bool            // a listing was taken
	wanted  map[string]bool // the services watched
	ignored map[string]bool // listed (with the tag filter's tag), not wanted
}

func newWatchSet(s *Source, dc string) *watchSet {
	return &watchSet{s: s, dc: dc}
}

// update takes a listing of services with their tags and returns the
// names to watch, sorted. With Config.Wanted set, it logs the first
// listing's counts, and then each service that starts or stops being
// used while it stays listed (a tag added or removed).
func (w *watchSet) update(services map[string][]string) []string {
	narrowing := w.s.cfg.Wanted != nil
	want := make([]string, 0, len(services))
	// Kept only to log what moved: without Wanted nothing moves.
	var wanted, ignored map[string]bool
	if narrowing {
		wanted, ignored = make(map[string]bool, len(w.wanted)), make(map[string]bool, len(w.ignored))
	}
	listed := 0
	for name, tags := range services {
		if w.s.cfg.TagFilter != "" && !slices.Contains(tags, w.s.cfg.TagFilter) {
			continue
		}
		listed++
		switch {
		case !w.s.uses(name, tags):
			if narrowing {
				ignored[name] = true
			}
		case narrowing:
			wanted[name] = true
			fallthrough
		default:
			want = append(want, name)
		}
	}
	slices.Sort(want)
	w.listed.Store(int64(listed))
	w.watched.Store(int64(len(want)))
	if narrowing {
		w.report(wanted, ignored, listed)
	}
	w.known, w.wanted, w.ignored = true, wanted, ignored
	return want
}

// report logs what update changed: the counts at the first listing, then
// the services that became used or unused while listed. Services that
// come or go altogether are the applier's to report.
func (w *watchSet) report(wanted, ignored map[string]bool, listed int) {
	dc := cmp.Or(w.dc, "the agent's")
	if !w.known {
		w.s.log.Info(fmt.Sprintf("watching %d of the %d services listed; the others are not used", len(wanted), listed),
			"datacenter", dc, "watched", len(wanted), "listed", listed)
		return
	}
	var gained, lost []string
	for name := range wanted {
		if w.ignored[name] {
			gained = append(gained, name)
		}
	}
	for name := range ignored {
		if w.wanted[name] {
			lost = append(lost, name)
		}
	}
	if len(gained) > 0 {
		w.s.log.Info("services now used: watching them", "services", names(gained),
			"datacenter", dc, "watched", len(wanted), "listed", listed)
	}
	if len(lost) > 0 {
		w.s.log.Info("services no longer used: not watching them", "services", names(lost),
			"datacenter", dc, "watched", len(wanted), "listed", listed)
	}
}

// names lists a few names for a log line, sorted.
func names(ns []string) string {
	const most = 10
	slices.Sort(ns)
	if len(ns) <= most {
		return strings.Join(ns, ",")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ns[:most], ","), len(ns)-most)
}

// serviceTags is each service of a node dump with the union of its
// instances' tags, as /v1/catalog/services lists them (cluster peers'
// services left out, as there).
func serviceTags(dump []*nodeInfo) map[string][]string {
	out := map[string][]string{}
	for _, n := range dump {
		if n == nil || n.PeerName != "" {
			continue
		}
		for _, svc := range n.Services {
			if svc == nil || svc.PeerName != "" {
				continue
			}
			tags := out[svc.Service]
			if tags == nil {
				tags = []string{}
			}
			for _, t := range svc.Tags {
				if !slices.Contains(tags, t) {
					tags = append(tags, t)
				}
			}
			out[svc.Service] = tags
		}
	}
	return out
}

// narrowDump removes from a node dump the services w does not watch. The
// dump is the caller's own decoding: changing it in place is fine.
func (w *watchSet) narrowDump(dump []*nodeInfo) {
	want := w.update(serviceTags(dump))
	if len(want) == int(w.listed.Load()) {
		return // every service is watched (convertDump applies the tag filter)
	}
	keep := make(map[string]bool, len(want))
	for _, name := range want {
		keep[name] = true
	}
	for _, n := range dump {
		if n != nil {
			n.Services = slices.DeleteFunc(n.Services, func(svc *nodeService) bool {
				return svc != nil && !keep[svc.Service]
			})
		}
	}
}

// Services reports, summed over the catalogs the source watches, how many
// services Consul lists (those with Config.TagFilter's tag, when set) and
// how many of them are watched: without Config.Wanted, all of them.
func (s *Source) Services() (listed, watched int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		if f, ok := w.f.(*catalogFetcher); ok {
			listed += int(f.set.listed.Load())
			watched += int(f.set.watched.Load())
		}
	}
	return listed, watched
}
