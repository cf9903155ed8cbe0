package supervisor

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestStartWatchCancelsOnStopAndKeepsTheRest(t *testing.T) {
	sigs := make(chan os.Signal, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := WatchStart(sigs, cancel)
	sigs <- syscall.SIGHUP
	sigs <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not cancel the start-up")
	}
	if got := w.End(); got != syscall.SIGTERM {
		t.Errorf("End = %v, want SIGTERM", got)
	}
	select {
	case sig := <-sigs:
		if sig != syscall.SIGHUP {
			t.Errorf("kept %v, want SIGHUP", sig)
		}
	default:
		t.Error("SIGHUP was not kept for Run")
	}
}

func TestStartWatchWithoutStop(t *testing.T) {
	sigs := make(chan os.Signal, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := WatchStart(sigs, cancel)
	if got := w.End(); got != nil || ctx.Err() != nil {
		t.Errorf("End = %v, ctx %v; want nothing", got, ctx.Err())
	}
}
