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
	bg, ag := groupByService(before.Instances), groupByService(after.Instances)
	names := slices.Sorted(maps.Keys(ag))
	for n := range bg {
		if _, ok := ag[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		if bg[n] != nil && ag[n] != nil && model.EqualInstances(bg[n], ag[n]) {
			continue // the common case: one service changed of thousands
		}
		old, now := byService(bg[n]), byService(ag[n])
		switch {
		case len(old) == 0:
			parts = append(parts, fmt.Sprintf("%s: new service (%s)", n, plural(len(now), "instance")))
			continue
		case len(now) == 0:
			parts = append(parts, fmt.Sprintf("%s: gone", n))
			continue
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
		if len(what) > 0 {
			parts = append(parts, n+": "+strings.Join(what, ", "))
		}
	}
	if len(parts) == 0 {
		return "no service changed"
	}
	return strings.Join(parts, "; ")
}

// groupByService splits instances by service name; runs of one name (a
// sorted catalog) are not copied.
func groupByService(insts []model.Instance) map[string][]model.Instance {
	out := map[string][]model.Instance{}
	for i := 0; i < len(insts); {
		j := i + 1
		for j < len(insts) && insts[j].Name == insts[i].Name {
			j++
		}
		if prev, ok := out[insts[i].Name]; ok {
			out[insts[i].Name] = append(slices.Clip(prev), insts[i:j]...)
		} else {
			out[insts[i].Name] = insts[i:j]
		}
		i = j
	}
	return out
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
