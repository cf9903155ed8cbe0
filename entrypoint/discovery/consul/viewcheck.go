package consul

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The agent answers a blocking health query from a streaming view of the
// service, fed by one of its servers. That view is not always the
// cluster's:
//   - after a partition heals it keeps serving what it had before the cut
//     while its subscription retries, with a backoff that grew during the
//     cut (up to a minute in Consul 1.14);
//   - in a rolling restart it may resubscribe to a server that has just
//     restarted and is still applying its log: the view goes back to an
//     older state, with an index below what was passed on, and may list
//     instances long gone.
// So after a failure, and whenever the view answers below what was passed
// on, the service is read from the servers (the leader): while they and
// the view differ, their answer is passed on and the view is not followed
// until it has caught up with them. An answer below what was passed on is
// taken only when the servers too are below it: Consul started over.
// Nothing is read from the servers while the view follows them.

// ViewCheckOutcomes are the outcomes of a check of the agent's view of a
// service against its servers, as ViewChecks counts them:
//   - agreed: the servers agree with the view;
//   - differed: they differ (a view that lags, or went back to an older
//     state), and their answer is followed until the view catches up;
//   - started_over: an answer below what was passed on, the servers below
//     it too: Consul started over, and the answer stands;
//   - unknown: the servers could not tell (their read failed, or a server
//     behind the view answered): checked again at the view's next poll.
var ViewCheckOutcomes = [...]string{"agreed", "differed", "started_over", "unknown"}

const (
	checkAgreed = iota
	checkDiffered
	checkStartedOver
	checkUnknown
)

// ViewChecks returns how many checks of the agents' views against the
// servers came to outcome (one of ViewCheckOutcomes; 0 for another).
func (s *Source) ViewChecks(outcome string) uint64 {
	for i, o := range ViewCheckOutcomes {
		if o == outcome {
			return s.viewChecks[i].Load()
		}
	}
	return 0
}

// behindPoll is how often a service is read from the servers while its
// view is not followed.
const behindPoll = 5 * time.Second

// directTimeout bounds a read from the servers: it must not hold a
// service's query longer than the agent's view would.
const directTimeout = 3 * time.Second

// viewTrail is what a health query keeps to judge its view.
type viewTrail struct {
	verify   bool              // check the view at its next answer (after a failure)
	passedAt uint64            // the index of what was passed on last (the view's or the servers')
	view     [sha256.Size]byte // digest of the view's latest converted answer
	// While catchUp is not 0 the view is not followed: it is polled
	// (behindPoll) and checked, until its index reaches catchUp or it
	// agrees with the servers' last answer (servers, when haveServers).
	catchUp     uint64
	servers     [sha256.Size]byte
	haveServers bool
	// restarted: the query reads afresh because another saw Consul start
	// over (a restart that the leader confirmed, or the lists' index went
	// back): an answer below what was passed on is Consul's new state.
	restarted bool
}

// quietTo is the index at or below which an answer to w's next health
// query is its wait running out, with nothing to decode or convert: a
// seeded query's first answer at or below the dump's index (its service
// did not change since); 0 otherwise.
func (w *subWatch) quietTo() uint64 {
	if w.sb.seed > 0 && w.cur.seen == 0 && !w.cur.reread {
		return w.sb.seed
	}
	return 0
}

// answeredHealth takes an answer of the agent's view of a service at
// index; false when the context ended.
func (w *subWatch) answeredHealth(ev event, index uint64) bool {
	c, ctx, sb, tr := w.c, w.ctx, w.sb, &w.trail
	quiet := index != 0 && index <= w.quietTo()
	// Per-service queries would log the same restart a thousand times.
	moved := w.cur.answered(index, nil, c.what(sb)) && !quiet
	if moved || !w.have {
		// Only an answer that can differ is converted: most answers of
		// a thousand services are waits that ran out.
		ev.instances = convertEntries(ev.entries, c.dc, c.s.cfg.TagFilter)
		c.converted.Add(1)
		tr.view = digest(ev.instances)
	}
	ev.entries = nil
	if quiet {
		tr.passedAt, ev.index = index, index
		return c.send(ctx, ev)
	}
	older := w.have && index < tr.passedAt
	verify, restarted := tr.verify, tr.restarted
	tr.verify, tr.restarted = false, false
	followed := false
	switch {
	case older && restarted:
		// Announced already: taken as Consul's new state, without asking
		// the leader again, nor restarting the others once more (each
		// restart cuts every held query).
		c.s.noteReset()
		tr.catchUp, tr.haveServers = 0, false
		return w.follow(ev, index, moved)
	case older:
	case tr.catchUp != 0 && (index >= tr.catchUp || tr.haveServers && tr.view == tr.servers):
		tr.catchUp, tr.haveServers = 0, false // caught up
		return w.follow(ev, index, moved)
	case tr.catchUp == 0:
		// Followed: no older than what was passed on. After a failure
		// it may still lag its servers: checked once passed on.
		if !w.follow(ev, index, moved) {
			return false
		}
		if !verify {
			return true
		}
		followed = true
	}
	insts, at, err := c.direct(ctx, sb.name)
	if ctx.Err() != nil {
		return false
	}
	d := digest(insts)
	switch {
	case err != nil || !older && at < index:
		// The servers cannot tell (none answered, or one behind the
		// view answered from older state): check again at the view's
		// next poll. Meanwhile a view that was followed still is; one
		// that was not, or that answers below what was passed on, is
		// not.
		c.s.viewChecks[checkUnknown].Add(1)
		why := "the server that answered is behind the view"
		if err != nil {
			why = err.Error()
		}
		c.s.log.Debug("the agent's view of a service could not be checked against its servers; checking again soon",
			"service", sb.name, "view_index", index, "server_index", at, "why", why)
		if followed {
			tr.catchUp = index + 1 // until the view moves
			return true
		}
		tr.catchUp = max(tr.catchUp, tr.passedAt, 1)
		return w.hold(index)
	case older && at < tr.passedAt:
		// The servers are below what was passed on too: Consul started
		// over, and the view's answer stands (the removal guard holds
		// what it drops).
		c.s.viewChecks[checkStartedOver].Add(1)
		c.s.log.Warn("Consul's index went backwards (restarted with less data, or another server answered): starting the query over",
			"query", c.what(sb), "consul", c.s.addr(), "from", tr.passedAt, "to", index, "servers_at", at)
		w.startOver()
		tr.catchUp, tr.haveServers = 0, false
		return w.follow(ev, index, moved)
	case d == tr.view:
		c.s.viewChecks[checkAgreed].Add(1)
		tr.catchUp, tr.haveServers = 0, false
		switch {
		case followed:
			return true
		case !moved && w.prev != any(d):
			// Not converted (the same index as before): the servers'
			// answer is the view's.
			return w.pass(event{sub: sb, instances: insts}, d, index)
		}
		return w.follow(ev, index, moved)
	}
	c.s.viewChecks[checkDiffered].Add(1)
	c.s.log.Debug("the agent's view of a service differs from its servers; following them until the view catches up",
		"service", sb.name, "view_index", index, "server_index", at, "older_than_passed_on", older)
	// The view must move past where it stands and reach the servers'
	// index (or agree with them) before it is followed again.
	tr.catchUp, tr.servers, tr.haveServers = max(at, index+1), d, true
	w.cur.index = max(index, 1)
	if w.prev == any(d) {
		if followed {
			return true
		}
		return w.hold(index)
	}
	return w.pass(event{sub: sb, instances: insts}, d, at)
}

// follow passes on the view's answer at index: converted when moved (or
// first), else the same as before.
func (w *subWatch) follow(ev event, index uint64, moved bool) bool {
	tr := &w.trail
	tr.passedAt, ev.index = index, index
	if moved || !w.have {
		ev.changed = !w.have || w.prev != any(tr.view)
		w.prev, w.have = tr.view, true
	}
	// Every answer goes to fetch: an unchanged one says the query is
	// alive, and its index how recent the catalog is.
	return w.c.send(w.ctx, ev)
}

// pass passes on the servers' answer ev (digest d) at index.
func (w *subWatch) pass(ev event, d [sha256.Size]byte, index uint64) bool {
	ev.index, ev.changed = index, true
	w.prev, w.have, w.trail.passedAt = d, true, index
	return w.c.send(w.ctx, ev)
}

// hold passes nothing on from the view's answer at index: the query is
// alive, its data as recent as what was passed on; the next query waits
// on the view's index.
func (w *subWatch) hold(index uint64) bool {
	w.cur.index = max(index, 1)
	return w.c.send(w.ctx, event{sub: w.sb, index: w.trail.passedAt})
}

// direct reads the health of service name from the servers: without an
// index (the agent answers only blocking queries from its view), and
// not stale: from the leader, whose state is the cluster's, rather than
// from a server that may be still applying its log. at is the answer's
// index. A read that fails (an election, a dead leader's address still
// dialled) is made again at the view's next poll.
func (c *splitCatalog) direct(ctx context.Context, name string) (insts []model.Instance, at uint64, err error) {
	select {
	case c.directs <- struct{}{}:
		defer func() { <-c.directs }()
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, directTimeout)
	defer cancel()
	opts, cancelQ := c.s.queryOptions(ctx, c.dc, 0)
	defer cancelQ()
	opts.AllowStale = false
	entries, meta, err := c.readHealth(opts, name, 0, 0)
	if err != nil {
		return nil, 0, err
	}
	return convertEntries(entries, c.dc, c.s.cfg.TagFilter), meta.LastIndex, nil
}
