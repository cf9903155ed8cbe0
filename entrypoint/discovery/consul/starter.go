package consul

import (
	"sync"
	"time"
)

// setUpAtOnce bounds the per-service queries being set up at once (see
// starter).
const setUpAtOnce = 16

// setUpFor is how long one set-up keeps its place; a variable for tests.
var setUpFor = time.Second

// starter sets per-service queries up a few at a time. Each takes a
// goroutine until its request is written and then waits parked, without
// one; but they come in thousands at once (a seeded start, the agent's
// return to the queries backing off), and 10,000 goroutines at once took
// 51 MB of stacks for a moment. A set-up that takes longer than setUpFor
// (a dial to an address that does not answer) gives its place up, so
// that a few such dials do not hold up the rest.
type starter struct {
	mu      sync.Mutex
	queue   []func(setUp func())
	feeding bool // a goroutine takes the queue
	slots   chan struct{}
}

// startAll runs each of runs on a goroutine of its own once fewer than
// setUpAtOnce are in set-up. A run calls setUp when its set-up is over,
// and returns at once when c stops. The caller must be one of c.wg's, or
// hold one of its counts.
func (c *splitCatalog) startAll(runs ...func(setUp func())) {
	st := &c.starter
	st.mu.Lock()
	defer st.mu.Unlock()
	st.queue = append(st.queue, runs...)
	if st.feeding || len(st.queue) == 0 {
		return
	}
	st.feeding = true
	if st.slots == nil {
		st.slots = make(chan struct{}, setUpAtOnce)
	}
	c.wg.Go(c.feed)
}

func (c *splitCatalog) feed() {
	st := &c.starter
	for {
		st.mu.Lock()
		if len(st.queue) == 0 {
			st.queue, st.feeding = nil, false
			st.mu.Unlock()
			return
		}
		run := st.queue[0]
		st.queue[0], st.queue = nil, st.queue[1:]
		st.mu.Unlock()
		select {
		case st.slots <- struct{}{}:
		case <-c.ctx.Done():
			run(func() {}) // returns at once
			continue
		}
		var once sync.Once
		release := func() { once.Do(func() { <-st.slots }) }
		late := time.AfterFunc(setUpFor, release)
		c.wg.Go(func() {
			run(func() {
				late.Stop()
				release()
			})
		})
	}
}
