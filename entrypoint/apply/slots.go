package apply

import "github.com/seamless-lb/seamless/entrypoint/model"

// slotCommands is runtimeCommands for a rendering's slots, backend by
// backend: a backend whose list is the one that runs (a rendering shares
// the lists that did not change) is skipped without reading its slots,
// so one change costs its backend, not the thousands of slots around it.
// When the backends are not the same ones in the same order, it compares
// every slot, as runtimeCommands does.
func slotCommands(from, to model.Slots, checks bool) ([]string, error) {
	fb, tb := from.Backends(), to.Backends()
	if len(fb) != len(tb) {
		return runtimeCommands(from.Flat(), to.Flat(), checks)
	}
	for i := range tb {
		if fb[i][0].Backend != tb[i][0].Backend {
			return runtimeCommands(from.Flat(), to.Flat(), checks)
		}
	}
	var cmds []string
	for i := range tb {
		if model.SameSlots(fb[i], tb[i]) {
			continue
		}
		c, err := runtimeCommands(fb[i], tb[i], checks)
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, c...)
	}
	return cmds, nil
}
