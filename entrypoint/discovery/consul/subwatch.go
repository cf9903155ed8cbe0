package consul

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// run reads sb's query until its context ends, sending an event for each
// answer and each failure; a failure is retried with backoff.
func (c *splitCatalog) run(ctx context.Context, sb *sub) {
	var (
		cur  cursor
		prev any
		have bool
	)
	if sb.seed > 0 { // wait for a change after the seed's read
		cur.index, prev, have = sb.seed, sb.seedDigest, true
	}
	bo := c.s.newBackoff()
	var epoch context.Context // the restart context of the last request
	for {
		if epoch != nil && epoch.Err() != nil {
			cur.failed() // another sub-watch saw Consul restart
		}
		epoch = c.restartCtx()
		recovery, reconnection := c.s.probe.recovery(), c.s.probe.reconnection()
		rctx, cancel := context.WithCancel(ctx)
		stop := func() bool { return false }
		if cur.wait() > 0 { // a fresh read answers at once anyway
			stop = context.AfterFunc(epoch, cancel)
		}
		// A request in flight through a cut, blocking or not, may hang
		// on a broken connection until its deadline: the agent's return
		// ends it.
		stopR := context.AfterFunc(reconnection, cancel)
		ev, index, err := c.read(rctx, sb, cur.wait())
		stop()
		stopR()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && (epoch.Err() != nil || reconnection.Err() != nil) {
			cur.failed()
			continue // cut short by a restart or the agent's return: read afresh at once
		}
		if err != nil {
			cur.failed()
			if !c.send(ctx, event{sub: sb, err: err}) || !c.s.probe.backoff(ctx, recovery, bo.Next()) {
				return
			}
			continue
		}
		bo.Reset()
		var log *Source // per-service queries would log the same restart a thousand times
		if sb.kind != partHealth {
			log = c.s
		}
		if cur.seen != 0 && index < cur.seen {
			c.s.noteReset()
			c.restart()
			epoch = nil
		}
		// A seeded query's first answer at or below the dump's index is
		// its wait running out: its service did not change since.
		quiet := sb.seed > 0 && cur.seen == 0 && !cur.reread && index != 0 && index <= sb.seed
		moved := cur.answered(index, log, c.what(sb)) && !quiet
		ev.index = index
		if sb.kind == partHealth && (moved || !have) {
			// Only an answer that can differ is converted: most answers
			// of a thousand services are waits that ran out.
			ev.instances = convertEntries(ev.entries, c.dc, c.s.cfg.TagFilter)
			c.converted.Add(1)
		}
		ev.entries = nil
		if moved || !have {
			var now any
			switch sb.kind {
			case partServices:
				now = ev.services
			case partNodes:
				now = ev.nodes
			default:
				// A digest, not the instances: fetch holds them, and a
				// second copy of every service's here would cost as much
				// again.
				now = digest(ev.instances)
			}
			ev.changed = !have || !reflect.DeepEqual(prev, now)
			prev, have = now, true
		}
		// Every answer goes to fetch: an unchanged one says the query is
		// alive, and its index how recent the catalog is.
		if !c.send(ctx, ev) {
			return
		}
		if !sleep(ctx, minInterval) {
			return
		}
	}
}

func (c *splitCatalog) send(ctx context.Context, ev event) bool {
	select {
	case c.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *splitCatalog) what(sb *sub) string {
	switch sb.kind {
	case partServices:
		return "/v1/catalog/services"
	case partNodes:
		return "/v1/catalog/nodes"
	}
	return "/v1/health/service/" + sb.name
}

// read issues sb's query, waiting on index, and converts its answer.
func (c *splitCatalog) read(ctx context.Context, sb *sub, index uint64) (event, uint64, error) {
	if sb.kind == partHealth && index == 0 {
		// A fresh read of a service's health waits on index 1, which any
		// answer passes at once: with an index the agent answers from its
		// streaming view, as it does the blocking queries. Without one it
		// forwards the read to the servers, which forward it to the
		// leader they know: after the leader's death, a dead address,
		// held until their dial times out (10 s in the chaos suite) while
		// the view had caught up within a second.
		index = 1
	}
	opts, cancel := c.s.queryOptions(ctx, c.dc, index)
	defer cancel()
	ev := event{sub: sb}
	var (
		meta *api.QueryMeta
		err  error
	)
	switch sb.kind {
	case partServices:
		ev.services, meta, err = c.s.client.Catalog().Services(opts)
		if err != nil {
			return ev, 0, fmt.Errorf("listing services: %w", err)
		}
	case partNodes:
		var nodes []*api.Node
		nodes, meta, err = c.s.client.Catalog().Nodes(opts)
		if err != nil {
			return ev, 0, fmt.Errorf("listing nodes: %w", err)
		}
		dump := make([]*nodeInfo, 0, len(nodes))
		for _, n := range nodes {
			if n == nil {
				continue
			}
			dump = append(dump, nodeFromAPI(n))
			if ev.dcName == "" && n.PeerName == "" {
				ev.dcName = n.Datacenter
			}
		}
		ev.nodes = convertDump(dump, c.dc, "").Nodes
	case partHealth:
		// A blocking query (index > 0) on the health of a service is
		// served by the agent from its streaming view (Consul 1.10+,
		// use_streaming_backend, on by default) without a parameter.
		ev.entries, meta, err = c.readHealth(opts, sb.name, index)
		if err != nil {
			return ev, 0, fmt.Errorf("reading service %q: %w", sb.name, err)
		}
	}
	if meta.ResultsFilteredByACLs && sb.kind != partHealth && c.warnedACL.CompareAndSwap(false, true) {
		c.s.log.Warn("the token may not read all of the catalog; Consul left out what it may not read",
			"query", c.what(sb))
	}
	return ev, meta.LastIndex, nil
}

// digest identifies converted instances, every field (the JSON of a map
// is sorted by key).
func digest(insts []model.Instance) [sha256.Size]byte {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(insts) // plain data: it cannot fail
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

func nodeFromAPI(n *api.Node) *nodeInfo {
	return &nodeInfo{ID: n.ID, Node: n.Node, PeerName: n.PeerName, Address: n.Address, Datacenter: n.Datacenter,
		TaggedAddresses: n.TaggedAddresses, Meta: n.Meta}
}
