package apply

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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

func slotKey(backend, server string) string { return backend + "/" + server }

// plan returns the runtime commands that turn the slots of from into to.
// It fails when to is not from's slots with other members (a reload is
// needed then).
func plan(from, to []model.ServerSlot) ([]string, error) {
	if len(from) != len(to) {
		return nil, errors.New("the slots differ")
	}
	old := make(map[string]model.ServerSlot, len(from))
	for _, s := range from {
		old[slotKey(s.Backend, s.Server)] = s
	}
	var cmds []string
	for _, s := range to {
		k := slotKey(s.Backend, s.Server)
		o, ok := old[k]
		if !ok {
			return nil, fmt.Errorf("slot %s is new", k)
		}
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
				// Consul or the source has checked it already: no need to
				// wait for HAProxy's own checks to rise.
				cmds = append(cmds, "set server "+k+" state ready", "set server "+k+" health up")
			}
		default:
			return nil, fmt.Errorf("slot %s: unknown state %q", k, s.State)
		}
	}
	return cmds, nil
}

// verify checks that HAProxy runs the slots as want describes them.
func verify(want []model.ServerSlot, got []haproxy.ServerState) error {
	have := make(map[string]haproxy.ServerState, len(got))
	for _, s := range got {
		have[slotKey(s.Backend, s.Server)] = s
	}
	var bad []string
	for _, w := range want {
		k := slotKey(w.Backend, w.Server)
		g, ok := have[k]
		switch {
		case !ok:
			bad = append(bad, k+" is missing")
		case w.State == model.SlotReady && (g.Mode() != model.SlotReady || g.Address != w.Address || g.Port != w.Port || g.Weight != w.Weight):
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

// keepState filters a saved `show servers state` for the next worker: only
// servers that keep their address, port and state (ready, or draining)
// carry their runtime state (a drain, a weight an operator set) over. A
// slot that now holds another instance, or the same instance again after
// it was drained and freed, must start as the file says.
func keepState(raw string, next []model.ServerSlot) string {
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
		n, ok := keep[slotKey(s.Backend, s.Server)]
		if ok && n.Address == s.Address && n.Port == s.Port && n.State != model.SlotMaint && s.Mode() == n.State {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
