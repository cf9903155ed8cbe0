package apply

import (
	"bytes"
	"crypto/sha256"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// attempt is one apply: why it runs, what it renders, and what changed.
type attempt struct {
	start   time.Time
	why     string // which sources or signal
	force   bool   // reload even when unchanged (SIGHUP)
	rend    model.Rendering
	catalog model.Catalog     // the local catalog behind rend
	indexes map[string]uint64 // by datacenter, the Consul index of each catalog behind rend
	change  string            // what changed, per service, for the log and /status
	moves   []serverMove      // a runtimeUpdate of servers moved in a configuration without slots
}

// digest is the hash of at's configuration, by which a refusal is
// remembered. Only a refusal, or a comparison with one, needs it:
// hashing 1.5 MB at 1000 services × 10 took a millisecond per change.
func (at *attempt) digest() [32]byte { return sha256.Sum256(at.rend.Config) }

// step is how a rendering comes to run.
type step int

const (
	unchanged     step = iota // HAProxy runs these bytes already
	refusedBefore             // HAProxy or haproxy -c refused these bytes: wait for others
	runtimeUpdate             // only server slots differ, or servers moved: the runtime API, no reload
	reloadNeeded              // anything else: write, validate, reload
)

// plan decides how at's rendering comes to run, from it and the
// rendering that runs.
func (a *Applier) plan(at *attempt) step {
	if bytes.Equal(at.rend.Config, a.running) && !at.force && !a.diverged {
		return unchanged
	}
	switch {
	case a.refused != ([32]byte{}) && !at.force && at.digest() == a.refused:
		return refusedBefore
	case a.diverged:
		// The runtime commands would be reckoned from running, which
		// HAProxy may not run.
		return reloadNeeded
	case a.runtimeApplies(at.rend, at.force):
		return runtimeUpdate
	case a.movesApply(at):
		return runtimeUpdate
	}
	return reloadNeeded
}

// movesApply: at's rendering, which has no slots (a template of yours),
// differs from what HAProxy runs only in servers moved (movesOnly), which
// at.moves then holds, and HAProxy moves keep-alive clients with them
// (Options.MovesInPlace). A reload for each would re-execute the master
// and start a worker per instance that moves, where `set server` changes
// the one that runs.
func (a *Applier) movesApply(at *attempt) bool {
	if at.force || a.opts.Runtime == nil || !a.taken || at.rend.Servers.Len() > 0 ||
		a.opts.MovesInPlace == nil || !a.opts.MovesInPlace() {
		return false
	}
	moves, ok := movesOnly(a.running, at.rend.Config)
	if ok {
		at.moves = moves
	}
	return ok
}

// runtimeApplies: rend differs from what runs only in its server slots.
func (a *Applier) runtimeApplies(rend model.Rendering, force bool) bool {
	return !force && a.opts.Runtime != nil && a.runRend != nil && rend.Servers.Len() > 0 &&
		len(rend.Structure) > 0 && bytes.Equal(rend.Structure, a.runRend.Structure)
}
