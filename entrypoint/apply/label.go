package apply

import (
	"fmt"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// noServiceChanged is what Change says when the catalogs agree.
const noServiceChanged = "no service changed"

// describe is the Change of an apply's record and log line: what changed
// per service or, when no service changed, the server slots whose state
// moved (a drained slot freed), so that no row says "no service changed"
// while something did. Slots that follow a service's change (an instance
// joining takes a free slot) are that change and are not repeated.
func describe(change string, before *model.Rendering, after model.Rendering) string {
	if before == nil || change != noServiceChanged {
		return change
	}
	if slots := slotChange(before.Servers, after.Servers); slots != "" {
		return slots
	}
	return change
}

// slotChange lists the slots whose state differs: "web/s2: drain → maint
// (freed)". A slot that only changed address or weight is a service's
// change and already in Change. A backend whose list is the one before
// (shared, not a copy) is skipped unread.
func slotChange(before, after model.Slots) string {
	was := make(map[string][]model.ServerSlot, len(before.Backends()))
	for _, b := range before.Backends() {
		was[b[0].Backend] = b
	}
	var parts []string
	for _, b := range after.Backends() {
		old := was[b[0].Backend]
		if model.SameSlots(old, b) {
			continue
		}
		state := make(map[string]string, len(old))
		for _, s := range old {
			state[s.Server] = s.State
		}
		for _, s := range b {
			o, ok := state[s.Server]
			if !ok || o == s.State {
				continue
			}
			p := fmt.Sprintf("%s/%s: %s → %s", s.Backend, s.Server, o, s.State)
			if o == model.SlotDrain && s.State == model.SlotMaint {
				p += " (freed)"
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}

// unchangedLabel is the Change of an apply that rendered the bytes that
// already run: the catalog may have moved (a meta value the template does
// not print, an instance it filters out), the configuration did not.
func unchangedLabel(change string) string {
	if change == noServiceChanged || change == "" {
		return "the configuration is the same"
	}
	return "the configuration is the same; catalog: " + change
}

// consulItself: the service Consul registers for its own servers (name
// and ID "consul"). It is no one's backend; a user's service that is also
// named consul has an ID of its own and counts.
func consulItself(in model.Instance) bool {
	return in.Source == "consul" && in.Name == "consul" && in.ServiceID() == "consul"
}

// briefServices is how many services a change names at info level and in
// /status.
const briefServices = 5

// brief shortens a change that names many services to the first few and
// a count ("… (+4995 more)"), and logs the whole at debug: a
// catalog of 5,000 services must not make 170 KB log lines and rows.
func (a *Applier) brief(why, change string) string {
	parts := strings.Split(change, "; ")
	if len(parts) <= briefServices {
		return change
	}
	a.log.Debug("the whole change", "why", why, "change", change)
	return fmt.Sprintf("%s (+%d more)", strings.Join(parts[:briefServices], "; "), len(parts)-briefServices)
}
