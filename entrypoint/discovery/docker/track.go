package docker

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// tracker builds the catalog of a re-list and logs what changed: each
// container left out or not passing once (and when that ends), and each
// service's instances added, removed or changed. Only Run's goroutine
// uses it.
type tracker struct {
	log *slog.Logger
	// conditions are the skip reason or notes last logged, by container
	// ID, so that each is logged once rather than at every re-list.
	conditions map[string]string
	// services are the instances of the last re-list by service name; nil
	// before the first.
	services map[string][]model.Instance
}

func newTracker(log *slog.Logger) *tracker {
	return &tracker{log: log, conditions: map[string]string{}}
}

// update takes a re-list's containers and returns the catalog and the
// IDs of every container listed, routed or not.
func (t *tracker) update(found []converted) (*model.Catalog, map[string]bool) {
	cat := &model.Catalog{}
	ids := make(map[string]bool, len(found))
	services := map[string][]model.Instance{}
	skipped := 0
	for _, c := range found {
		ids[c.id] = true
		t.logCondition(c)
		if c.instance == nil {
			skipped++
			continue
		}
		cat.Instances = append(cat.Instances, *c.instance)
		services[c.instance.Name] = append(services[c.instance.Name], *c.instance)
	}
	for id := range t.conditions {
		if !ids[id] {
			delete(t.conditions, id) // gone: nothing more to say about it
		}
	}
	model.SortCatalog(cat)
	if t.services == nil {
		t.log.Info("Docker containers listed", "containers", len(found), "instances", len(cat.Instances), "left_out", skipped, "services", len(services))
	} else {
		logChanges(t.log, t.services, services)
	}
	t.services = services
	return cat, ids
}

// logCondition logs why a container is left out or not passing when that
// is new, and that it is routed again when it ends.
func (t *tracker) logCondition(c converted) {
	var cond string
	switch {
	case c.instance == nil && c.quiet:
		return
	case c.instance == nil:
		cond = "skip:" + c.skip
	default:
		var msgs []string
		for _, n := range c.notes {
			msgs = append(msgs, n.msg)
		}
		cond = strings.Join(msgs, "; ")
	}
	before, had := t.conditions[c.id]
	if cond == before {
		return
	}
	attrs := []any{"container", c.name, "id", shortID(c.id)}
	if c.instance != nil {
		attrs = append(attrs, "service", c.instance.Name, "status", c.instance.Status)
	}
	if cond == "" {
		delete(t.conditions, c.id)
		if had {
			t.log.Info("container routed as labelled again", attrs...)
		}
		return
	}
	t.conditions[c.id] = cond
	if c.instance == nil {
		t.log.Warn("container left out", append(attrs, "reason", c.skip)...)
		return
	}
	for _, n := range c.notes {
		level := slog.LevelInfo
		if n.warn {
			level = slog.LevelWarn
		}
		t.log.Log(context.Background(), level, n.msg, attrs...)
	}
}

// logChanges logs what changed between two re-lists, service by service:
// "service changed service=web added=1 removed=0 changed=2 instances=4".
func logChanges(log *slog.Logger, before, after map[string][]model.Instance) {
	var names []string
	for n := range before {
		names = append(names, n)
	}
	for n := range after {
		if _, ok := before[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		b, a := before[n], after[n]
		switch {
		case b == nil:
			log.Info("service added", "service", n, "instances", len(a))
		case a == nil:
			log.Info("service removed", "service", n, "instances_before", len(b))
		default:
			added, removed, changed := model.DiffInstances(b, a)
			if added+removed+changed > 0 {
				log.Info("service changed", "service", n, "added", added, "removed", removed, "changed", changed, "instances", len(a))
			}
		}
	}
}
