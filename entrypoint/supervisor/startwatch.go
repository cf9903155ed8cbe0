package supervisor

import (
	"context"
	"os"
	"slices"
	"sync"
)

// StartWatch reads the signals that arrive while seamless starts (the wait
// for the discovery sources can be long): a stop signal cancels the
// start-up at once, anything else is kept for Run.
type StartWatch struct {
	sigs chan os.Signal
	done chan struct{}
	wg   sync.WaitGroup
	stop os.Signal
	kept []os.Signal
}

// WatchStart watches sigs (from Notify) until End; a stop signal calls
// cancel.
func WatchStart(sigs chan os.Signal, cancel context.CancelFunc) *StartWatch {
	w := &StartWatch{sigs: sigs, done: make(chan struct{})}
	w.wg.Go(func() {
		for {
			select {
			case <-w.done:
				return
			case sig := <-sigs:
				if slices.Contains(stopSignals, sig) {
					if w.stop == nil {
						w.stop = sig
					}
					cancel()
					continue
				}
				w.kept = append(w.kept, sig)
			}
		}
	})
	return w
}

// End stops watching, puts the other signals back for Run, and returns the
// stop signal that arrived, if one did.
func (w *StartWatch) End() os.Signal {
	close(w.done)
	w.wg.Wait()
	for _, sig := range w.kept {
		select {
		case w.sigs <- sig:
		default: // full: signal.Notify would have dropped it too
		}
	}
	return w.stop
}
