package apply

import (
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// slotCommands gives runtimeCommands' answer for the slots laid end to
// end, reading only the backends whose lists are not the running ones.
func TestSlotCommandsSkipSharedBackends(t *testing.T) {
	in := func(backend string, slots ...model.ServerSlot) []model.ServerSlot {
		out := slices.Clone(slots)
		for i := range out {
			out[i].Backend = backend
		}
		return out
	}
	api := in("http-api", sl("s1", "a", "10.0.1.1", 80, 1, model.SlotReady), free("s2"))
	web := in("http-web", sl("s1", "w", "10.0.0.1", 80, 1, model.SlotReady), free("s2"))
	webMoved := in("http-web", sl("s1", "w", "10.0.0.1", 80, 1, model.SlotDrain), sl("s2", "v", "10.0.0.2", 80, 1, model.SlotReady))
	shared := in("http-db", sl("s1", "d", "10.0.2.1", 5432, 1, model.SlotReady))
	running := model.SlotsByBackend([][]model.ServerSlot{api, shared, web})
	for _, tc := range []struct {
		name    string
		to      model.Slots
		want    []string
		wantErr string
	}{
		{"nothing changed", model.SlotsByBackend([][]model.ServerSlot{api, shared, web}), nil, ""},
		{"a copy of the same slots", model.SlotsByBackend([][]model.ServerSlot{slices.Clone(api), shared, slices.Clone(web)}), nil, ""},
		{"one backend changed", model.SlotsByBackend([][]model.ServerSlot{api, shared, webMoved}),
			[]string{"set server http-web/s1 state drain", "set server http-web/s2 addr 10.0.0.2 port 80",
				"set server http-web/s2 weight 1", "set server http-web/s2 state ready", "set server http-web/s2 health up"}, ""},
		{"a backend gone", model.SlotsByBackend([][]model.ServerSlot{api, web}), nil, "slots differ"},
		{"backends in another order", model.SlotsByBackend([][]model.ServerSlot{shared, api, webMoved}),
			[]string{"set server http-web/s1 state drain", "set server http-web/s2 addr 10.0.0.2 port 80",
				"set server http-web/s2 weight 1", "set server http-web/s2 state ready", "set server http-web/s2 health up"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := slotCommands(running, tc.to, true)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("commands = %q, %v; want %q", got, err, tc.want)
			}
			flat, err := runtimeCommands(running.Flat(), tc.to.Flat(), true)
			if err != nil || !slices.Equal(got, flat) {
				t.Errorf("slot by slot: %q, %v; backend by backend: %q", flat, err, got)
			}
		})
	}
}
