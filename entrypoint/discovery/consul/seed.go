package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// defaultSeedAt is how many watched services make a per-service catalog
// read its first answer with one request on the node dump rather than
// one per service, provided they are at least half of those listed: the
// dump reads every service, watched or not. Measured on Consul 1.14.11
// with 10 instances per service (TestBenchSeededStart): the whole catalog
// after 66 ms seeded against 100 ms per service at 100 services, 0.58 s
// against 1.18 s at 1,000, 1.76 s against 3.18 s at 3,000 — each service
// read on its own costs about twice its share of the dump. Below a few
// dozen services both take a few milliseconds, and the per-service start
// needs no internal endpoint.
const defaultSeedAt = 64

// seedWanted reports whether the first listing, want of listed services
// to watch, is read from the node dump.
func (c *splitCatalog) seedWanted(want, listed int) bool {
	at := c.s.cfg.seedAt
	if at == 0 {
		at = defaultSeedAt
	}
	return at > 0 && want >= at && 2*want >= listed
}

// seed reads the catalog's first answer with one request on the node
// dump, then starts each service's health query waiting on the dump's
// index: Consul answers a blocking query once the service's own index
// passes the one it waits on, and the dump's index is the Raft index of
// its read, so the queries answer at the service's next change — one
// made between the read and the query's start included — instead of all
// at once with what the dump already said. If the read fails, the
// queries start as without a seed, each answering at once.
func (c *splitCatalog) seed(ctx context.Context) error {
	want := c.pending
	c.pending = nil
	parts, index, err := c.readSeed(ctx, want)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.s.log.Warn("reading the catalog's first answer in one request failed: reading it per service",
			"datacenter", cmp.Or(c.dc, c.dcName, "the agent's"), "services", len(want), "err", err)
		for _, name := range want {
			c.health[name] = c.start(partHealth, name)
		}
		return nil
	}
	if hook := c.s.cfg.seeded; hook != nil {
		hook(index)
	}
	c.seedIndex, c.seedEpoch = index, c.restartCtx()
	runs := make([]func(setUp func()), 0, len(want))
	for _, name := range want {
		c.shareNodeChecks(parts[name])
		c.parts[name] = parts[name]
		sb, run := c.seeded(name, index, digest(parts[name]))
		c.health[name], runs = sb, append(runs, run)
	}
	c.startOnceServing(runs)
	c.dirty = true
	c.s.log.Info("first answer of the catalog read in one request; each service's query waits for its next change",
		"datacenter", cmp.Or(c.dc, c.dcName), "services", len(want), "index", index)
	return nil
}

// readSeed reads the node dump and returns the instances of each service
// of want, as its health query would convert them, and the dump's index.
func (c *splitCatalog) readSeed(ctx context.Context, want []string) (map[string][]model.Instance, uint64, error) {
	// The dump does not name the datacenter; the node list did.
	dc := cmp.Or(c.dc, c.dcName)
	if dc == "" {
		return nil, 0, errors.New("the datacenter is not known yet (no node listed)")
	}
	opts, cancel := c.s.queryOptions(ctx, c.dc, 0)
	defer cancel()
	dump, meta, err := c.s.readDump(opts)
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", nodeDumpPath, err)
	}
	if meta.LastIndex == 0 {
		return nil, 0, errors.New("the node dump carries no index")
	}
	if meta.ResultsFilteredByACLs {
		// The token may read less of the dump than of each service:
		// the per-service answers say what it may read.
		return nil, 0, errors.New("the token may not read all of the node dump")
	}
	keep := make(map[string]bool, len(want))
	for _, name := range want {
		keep[name] = true
	}
	return seedParts(dump, dc, c.s.cfg.TagFilter, keep), meta.LastIndex, nil
}

// seedParts converts dump into the instances of each service of keep,
// sorted, each service in an array of its own: parts of one array of the
// whole catalog would keep all of it alive for as long as any service
// still had its seeded part (29 MB at 10,000 × 10, beside the parts read
// again since), and the services not kept with it.
func seedParts(dump []*nodeInfo, dc, tagFilter string, keep map[string]bool) map[string][]model.Instance {
	room := seedRoom(dump, tagFilter, keep)
	parts := make(map[string][]model.Instance, len(room))
	convertEach(dump, dc, tagFilter, 0, func(in model.Instance) {
		if n := room[in.Name]; n > 0 {
			if parts[in.Name] == nil {
				parts[in.Name] = make([]model.Instance, 0, n)
			}
			parts[in.Name] = append(parts[in.Name], in)
		}
	})
	for name, p := range parts {
		model.SortInstances(p)
		parts[name] = p[:len(p):len(p)]
	}
	return parts
}

// seedRoom counts the instances seedParts makes of each service of keep,
// by convertDump's rules: an array sized for instances the tag filter
// leaves out would keep that room for as long as the part lives.
func seedRoom(dump []*nodeInfo, tagFilter string, keep map[string]bool) map[string]int {
	room := make(map[string]int, len(keep))
	for _, n := range dump {
		if n == nil {
			continue
		}
		for _, svc := range n.Services {
			if converted(n, svc, tagFilter) && keep[svc.Service] {
				room[svc.Service]++
			}
		}
	}
	return room
}

// floor is the seed's index, the catalog's lowest, until Consul starts
// over (a reset seen since the seed): then 0.
func (c *splitCatalog) floor() uint64 {
	if c.seedEpoch != nil && c.seedEpoch.Err() != nil {
		c.seedIndex, c.seedEpoch = 0, nil
	}
	return c.seedIndex
}

// seeded is the health query of service name waiting on index, with the
// instances the seed gave it (their digest) as its last answer, and what
// runs it.
func (c *splitCatalog) seeded(name string, index uint64, d [32]byte) (*sub, func(setUp func())) {
	ctx, cancel := context.WithCancel(c.ctx)
	sb := &sub{kind: partHealth, name: name, cancel: cancel, seed: index, seedDigest: d}
	return sb, func(setUp func()) { c.runSetUp(ctx, sb, setUp) }
}

// startOnceServing starts runs now, or once Config.Serving is closed: one
// goroutine waits for all of them, not one each.
func (c *splitCatalog) startOnceServing(runs []func(setUp func())) {
	serving := c.s.cfg.Serving
	c.wg.Go(func() {
		if serving != nil {
			select {
			case <-serving:
			default:
				c.s.log.Debug("the per-service queries wait until HAProxy serves", "services", len(runs))
				select {
				case <-serving:
				case <-c.ctx.Done():
					return
				}
			}
		}
		c.startAll(runs...)
	})
}
