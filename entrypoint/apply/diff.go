package apply

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Change summarises what differs between two catalogs, per service, for
// the log line of an apply: "web: +2 instances, 1 now critical; api: new
// service (3 instances)".
func Change(before, after model.Catalog) string {
	var parts []string
	model.ZipServices(&before, &after, func(n string, bs, as []model.Instance) {
		if bs != nil && as != nil && model.EqualInstances(bs, as) {
			return // the common case: one service changed of thousands
		}
		if p := serviceChange(n, bs, as); p != "" {
			parts = append(parts, p)
		}
	})
	if len(parts) == 0 {
		return "no service changed"
	}
	return strings.Join(parts, "; ")
}

// serviceChange describes what changed in one service, "" if nothing.
func serviceChange(n string, bs, as []model.Instance) string {
	old, now := byService(bs), byService(as)
	switch {
	case len(old) == 0:
		return fmt.Sprintf("%s: new service (%s)", n, plural(len(now), "instance"))
	case len(now) == 0:
		return fmt.Sprintf("%s: gone", n)
	}
	var added, removed, other int
	statuses := map[string]int{}
	for k, in := range now {
		was, ok := old[k]
		switch {
		case !ok:
			added++
		case was.Status != in.Status:
			statuses[in.Status]++
		case !sameInstance(was, in):
			other++
		}
	}
	for k := range old {
		if _, ok := now[k]; !ok {
			removed++
		}
	}
	var what []string
	if added > 0 {
		what = append(what, "+"+plural(added, "instance"))
	}
	if removed > 0 {
		what = append(what, "-"+plural(removed, "instance"))
	}
	for _, st := range slices.Sorted(maps.Keys(statuses)) {
		what = append(what, fmt.Sprintf("%d now %s", statuses[st], st))
	}
	if other > 0 {
		what = append(what, plural(other, "instance")+" changed")
	}
	if len(what) == 0 {
		return ""
	}
	return n + ": " + strings.Join(what, ", ")
}

// byService keys one service's instances by source, ID and address.
func byService(insts []model.Instance) map[string]model.Instance {
	out := make(map[string]model.Instance, len(insts))
	for _, in := range insts {
		out[in.Source+"/"+in.ID+"/"+net.JoinHostPort(in.Address, strconv.Itoa(in.Port))] = in
	}
	return out
}

func sameInstance(a, b model.Instance) bool {
	return slices.Equal(a.Tags, b.Tags) && maps.Equal(a.Meta, b.Meta) &&
		a.Weight == b.Weight && a.WarningWeight == b.WarningWeight
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
