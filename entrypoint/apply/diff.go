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
	b, a := byService(before), byService(after)
	names := slices.Sorted(maps.Keys(a))
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		old, now := b[n], a[n]
		switch {
		case old == nil:
			parts = append(parts, fmt.Sprintf("%s: new service (%s)", n, plural(len(now), "instance")))
			continue
		case now == nil:
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

func byService(c model.Catalog) map[string]map[string]model.Instance {
	out := map[string]map[string]model.Instance{}
	for _, in := range c.Instances {
		if out[in.Name] == nil {
			out[in.Name] = map[string]model.Instance{}
		}
		out[in.Name][in.Source+"/"+in.ID+"/"+net.JoinHostPort(in.Address, strconv.Itoa(in.Port))] = in
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
