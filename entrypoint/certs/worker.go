package certs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// masterWait bounds how long an install waits for the master CLI while a
// reload is in flight (the master re-executes, then its new worker loads).
var masterWait = 10 * time.Second

// worker returns the pid of the worker that "@1" reaches once it has
// finished loading, waiting up to masterWait while the master re-executes
// or the worker loads; 0 when none answers by then. A worker that differs
// from the one an install started with was started by a reload since the
// files were written: it loaded them, or loads them, so its set needs a
// check, not another reload.
func (i *Installer) worker(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, masterWait)
	defer cancel()
	for {
		if pid := i.readyWorker(ctx); pid != 0 {
			return pid
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// readyWorker is one try of worker.
func (i *Installer) readyWorker(ctx context.Context) int {
	attempt, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ans, err := i.o.CLI.Do(attempt, "show proc")
	if err != nil {
		return 0
	}
	p, err := haproxy.ParseShowProc(ans)
	if err != nil || !p.HasWorkers() {
		return 0
	}
	// 3.1+ lists a worker while it still loads; one that answers has loaded.
	w := append(append([]haproxy.Proc{}, p.Workers...), p.Old...)[0]
	v, err := i.o.CLI.Do(attempt, fmt.Sprintf("@!%d show version", w.Pid))
	if v = strings.TrimSpace(v); err != nil || v == "" || v[0] < '0' || v[0] > '9' {
		return 0
	}
	return w.Pid
}
