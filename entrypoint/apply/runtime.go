package apply

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Runtime is HAProxy's runtime API as the applier needs it
// (haproxy.Runtime).
type Runtime interface {
	Apply(ctx context.Context, cmds []string) error
	ServersState(ctx context.Context) (string, []haproxy.ServerState, error)
}

// backendStates is a Runtime that reads the state of some backends only
// (haproxy.Runtime): a change then reads back what it touched, not every
// server of the configuration.
type backendStates interface {
	BackendServersState(ctx context.Context, backends []string) ([]haproxy.ServerState, error)
}

// appliesAndReads is a Runtime that sends commands and reads back the
// backends they touched in one go (haproxy.Runtime: in one connection).
type appliesAndReads interface {
	ApplyAndRead(ctx context.Context, cmds, backends []string) ([]haproxy.ServerState, error)
}

// applyAndRead sends cmds, then reads back the servers of the backends
// they touched; it returns the slots of want in those backends (all of
// them, and every server's state, when the Runtime can only read them all).
func applyAndRead(ctx context.Context, rt Runtime, cmds []string, want model.Slots, touched map[string]bool) ([]model.ServerSlot, []haproxy.ServerState, error) {
	backends := touchedBackends(touched)
	if ar, ok := rt.(appliesAndReads); ok {
		states, err := ar.ApplyAndRead(ctx, cmds, backends)
		return slotsIn(want, backends), states, err
	}
	if err := rt.Apply(ctx, cmds); err != nil {
		return nil, nil, err
	}
	states, err := readBackends(ctx, rt, backends)
	if _, some := rt.(backendStates); some {
		return slotsIn(want, backends), states, err
	}
	return want.Flat(), states, err
}

// readBackends reads the servers of backends (or of every backend, when
// the Runtime can only read them all).
func readBackends(ctx context.Context, rt Runtime, backends []string) ([]haproxy.ServerState, error) {
	if bs, ok := rt.(backendStates); ok {
		return bs.BackendServersState(ctx, backends)
	}
	_, states, err := rt.ServersState(ctx)
	return states, err
}

// touchedBackends are the backends of the touched slots, sorted.
func touchedBackends(touched map[string]bool) []string {
	backends := map[string]bool{}
	for k := range touched {
		if i := strings.LastIndexByte(k, '/'); i >= 0 {
			backends[k[:i]] = true
		}
	}
	return slices.Sorted(maps.Keys(backends))
}

// slotsIn are the slots of want in backends (sorted).
func slotsIn(want model.Slots, backends []string) []model.ServerSlot {
	var in []model.ServerSlot
	for _, b := range want.Backends() {
		if _, ok := slices.BinarySearch(backends, b[0].Backend); ok {
			in = append(in, b...)
		}
	}
	return in
}

func slotKey(backend, server string) string { return backend + "/" + server }

// slotID is a slot as a map key, without building its name.
type slotID struct{ backend, server string }

// runtimeCommands returns the runtime commands that turn the slots of from into to.
// It fails when to is not from's slots with other members (a reload is
// needed then). checks says whether the servers have HAProxy health checks.
func runtimeCommands(from, to []model.ServerSlot, checks bool) ([]string, error) {
	if len(from) != len(to) {
		return nil, errors.New("the slots differ")
	}
	var old map[slotID]model.ServerSlot // only when the slots are not in the same order
	var cmds []string
	for i, s := range to {
		o := from[i]
		if o.Backend != s.Backend || o.Server != s.Server {
			if old == nil {
				old = make(map[slotID]model.ServerSlot, len(from))
				for _, f := range from {
					old[slotID{f.Backend, f.Server}] = f
				}
			}
			var ok bool
			if o, ok = old[slotID{s.Backend, s.Server}]; !ok {
				return nil, fmt.Errorf("slot %s is new", slotKey(s.Backend, s.Server))
			}
		}
		if o == s {
			continue // the common case: thousands of slots, a few changed
		}
		k := slotKey(s.Backend, s.Server)
		switch s.State {
		case model.SlotMaint, model.SlotDrain:
			if o.State != s.State {
				cmds = append(cmds, "set server "+k+" state "+s.State)
			}
		case model.SlotReady:
			if o.Address != s.Address || o.Port != s.Port || o.State != model.SlotReady {
				if _, err := netip.ParseAddr(s.Address); err != nil {
					return nil, fmt.Errorf("slot %s: %s is a name; the runtime API takes only IP addresses", k, s.Address)
				}
				cmds = append(cmds, "set server "+k+" addr "+s.Address+" port "+strconv.Itoa(s.Port))
			}
			if o.Weight != s.Weight || o.State != model.SlotReady {
				cmds = append(cmds, "set server "+k+" weight "+strconv.Itoa(s.Weight))
			}
			if o.State != model.SlotReady {
				cmds = append(cmds, "set server "+k+" state ready")
				// Consul or the source has checked it already: no need to
				// wait for HAProxy's own checks to rise. Without checks a
				// ready server is up, and its health is not HAProxy's to set.
				if checks {
					cmds = append(cmds, "set server "+k+" health up")
				}
			}
		default:
			return nil, fmt.Errorf("slot %s: unknown state %q", k, s.State)
		}
	}
	return cmds, nil
}

// verify checks that HAProxy runs the slots the plan changed (touched, by
// backend/server) as want describes them. Slots the plan left alone are
// not held to the rendering: an operator may have drained one by hand.
// A slot addressed by a DNS name is not compared by address: HAProxy
// reports what the name resolved to.
func verify(want []model.ServerSlot, got []haproxy.ServerState, touched map[string]bool) error {
	ids := make(map[slotID]bool, len(touched))
	for k := range touched {
		if i := strings.LastIndexByte(k, '/'); i >= 0 { // a server's name has no slash
			ids[slotID{k[:i], k[i+1:]}] = true
		}
	}
	have := make(map[slotID]int, len(got))
	for i, s := range got {
		have[slotID{s.Backend, s.Server}] = i
	}
	var bad []string
	for _, w := range want {
		i, ok := have[slotID{w.Backend, w.Server}]
		if !ok {
			bad = append(bad, slotKey(w.Backend, w.Server)+" is missing")
			continue
		}
		if !ids[slotID{w.Backend, w.Server}] {
			continue
		}
		k, g := slotKey(w.Backend, w.Server), got[i]
		_, ipErr := netip.ParseAddr(w.Address)
		switch {
		case w.State == model.SlotReady && (g.Mode() != model.SlotReady || (ipErr == nil && g.Address != w.Address) || g.Port != w.Port || g.Weight != w.Weight):
			bad = append(bad, fmt.Sprintf("%s is %s %s:%d weight %d, want ready %s:%d weight %d",
				k, g.Mode(), g.Address, g.Port, g.Weight, w.Address, w.Port, w.Weight))
		case w.State == model.SlotDrain && g.Mode() == model.SlotReady,
			w.State == model.SlotMaint && g.Mode() != model.SlotMaint:
			bad = append(bad, fmt.Sprintf("%s is %s, want %s", k, g.Mode(), w.State))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("HAProxy's servers differ from the plan: %s", strings.Join(bad, "; "))
	}
	return nil
}

// touchedSlots names the slots cmds change.
func touchedSlots(cmds []string) map[string]bool {
	out := map[string]bool{}
	for _, c := range cmds {
		if f := strings.Fields(c); len(f) > 2 {
			out[f[2]] = true
		}
	}
	return out
}

// keepState filters a saved `show servers state` for the next worker: a
// server carries its runtime state (a drain, a maintenance or a weight set
// by an operator) over only when its slot holds the same instance at the
// same address, in the same planned state, before and after. A slot that
// now holds another instance, the same one again after it was drained and
// freed, or a draining one that is back, starts as the file says. So do
// the slots in untrusted (a runtime change that failed partway touched
// them: their state may be that change's, not the file's).
func keepState(raw string, prev, next []model.ServerSlot, untrusted map[string]bool) string {
	before := map[string]model.ServerSlot{}
	for _, s := range prev {
		before[slotKey(s.Backend, s.Server)] = s
	}
	keep := map[string]model.ServerSlot{}
	for _, s := range next {
		keep[slotKey(s.Backend, s.Server)] = s
	}
	states, err := haproxy.ParseServersState(raw)
	if err != nil {
		return "1\n"
	}
	lines := strings.Split(strings.TrimSpace(raw), "\n")
	var b strings.Builder
	b.WriteString("1\n")
	i := 0
	for _, line := range lines[1:] {
		if strings.HasPrefix(line, "#") {
			b.WriteString(line + "\n")
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		s := states[i]
		i++
		k := slotKey(s.Backend, s.Server)
		n, ok := keep[k]
		p := before[k]
		if ok && n.Instance != "" && n.Instance == p.Instance && n.Address == p.Address && n.Port == p.Port &&
			n.State == p.State && n.Port == s.Port && !untrusted[k] {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
