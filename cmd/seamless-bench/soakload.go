package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/integration/loadgen"
)

// pacedLoad sends bursts of requests to one path through seamless, a burst
// every interval, each burst one loadgen run (one client, never retrying)
// bounded in requests and time, the whole loop bounded by maxRequests and
// ctx. Paced rather than flat out: the machine is shared, and what a soak
// looks for (leaks, a request lost at a reload) needs no more.
type pacedLoad struct {
	target, path string
	mode         loadgen.Mode
	burst        int
	every        time.Duration
	maxRequests  int64

	mu  sync.Mutex
	sum loadgen.Result
}

func (p *pacedLoad) run(ctx context.Context) error {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		p.mu.Lock()
		left := p.maxRequests - p.sum.Requests
		p.mu.Unlock()
		if left <= 0 {
			return nil
		}
		l, err := loadgen.Start(ctx, loadgen.Config{Target: p.target, Mode: p.mode, Path: p.path,
			Workers: 1, MaxRequests: min(int64(p.burst), left), MaxDuration: 30 * time.Second, Timeout: 5 * time.Second})
		if err != nil {
			return err
		}
		<-l.Done()
		p.add(l.Stop())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *pacedLoad) add(r loadgen.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sum.Requests += r.Requests
	p.sum.Failed += r.Failed
	for k, v := range r.Errors {
		if p.sum.Errors == nil {
			p.sum.Errors = map[string]int64{}
		}
		p.sum.Errors[k] += v
	}
}

func (p *pacedLoad) result() loadgen.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.sum
	r.Errors = maps.Clone(r.Errors)
	return r
}

// loads are the soak's load loops, summed.
type loads []*pacedLoad

func (ls loads) totals() (requests, failed int64) {
	for _, l := range ls {
		r := l.result()
		requests += r.Requests
		failed += r.Failed
	}
	return requests, failed
}

// failures lists every loop's failure classes: "stable-a/ keepalive: status 503 ×2".
func (ls loads) failures() string {
	var parts []string
	for _, l := range ls {
		r := l.result()
		for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
			parts = append(parts, fmt.Sprintf("%s %s: %s ×%d", l.path, l.mode, k, r.Errors[k]))
		}
	}
	return strings.Join(parts, "; ")
}
