package certs

import (
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
)

// removalHold keeps the certificates that a Consul KV listing dropped
// while such a listing is not to be believed at once, as the discovery
// guard does with instances (SEAMLESS_REMOVAL_HOLD): after Consul's index
// went backwards (a server restarted or restored without its data), and
// when one answer empties a prefix that held more than one certificate
// (the same loss seen through a server whose index is higher). Added and
// replaced certificates apply at once; when the hold ends, the listing is
// taken as it is.
type removalHold struct {
	hold  time.Duration // 0: never hold
	until time.Time     // when the current hold ends; zero: none
	held  map[string]bool
	log   *slog.Logger
}

// start holds removals from now for the hold period.
func (h *removalHold) start(now time.Time, why string) {
	if h.hold <= 0 {
		return
	}
	h.until = now.Add(h.hold)
	h.log.Warn("removals of certificates held: "+why, "until", h.until.UTC().Format(time.RFC3339), "hold", h.hold.String())
}

// active reports whether removals are held at now.
func (h *removalHold) active(now time.Time) bool { return !h.until.IsZero() && now.Before(h.until) }

// compose is listed, plus, during a hold, what prev had that listed lacks.
// At the end of a hold the names still missing are logged as removed.
func (h *removalHold) compose(listed, prev Set, now time.Time) Set {
	if !h.active(now) {
		if len(h.held) > 0 {
			var gone []string
			for name := range h.held {
				if _, back := listed.Certs[name]; !back {
					gone = append(gone, name)
				}
			}
			if len(gone) > 0 {
				slices.Sort(gone)
				h.log.Info("hold over: certificates still gone from Consul KV are removed", "names", strings.Join(gone, ","))
			}
		}
		h.until, h.held = time.Time{}, nil
		return listed
	}
	out := Set{Certs: maps.Clone(listed.Certs)}
	if out.Certs == nil {
		out.Certs = map[string]*Entry{}
	}
	var newly []string
	for name, e := range prev.Certs {
		if _, ok := out.Certs[name]; ok {
			continue
		}
		out.Certs[name] = e
		if h.held == nil {
			h.held = map[string]bool{}
		}
		if !h.held[name] {
			h.held[name] = true
			newly = append(newly, name)
		}
	}
	if len(newly) > 0 {
		slices.Sort(newly)
		h.log.Warn("certificates gone from Consul KV keep serving until the hold ends", "names", strings.Join(newly, ","),
			"until", h.until.UTC().Format(time.RFC3339))
	}
	return out
}
