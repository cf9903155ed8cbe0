// Command demo-backend is the small HTTP service behind the demo and the
// compose examples: it answers with its name so that load balancing is
// visible, and /slow?ms=N holds a request open to watch a drain.
//
// With -consul ADDR (or -register, which takes CONSUL_HTTP_ADDR and Consul's
// other variables) it registers itself in Consul with an HTTP check on its
// /healthz, and on SIGTERM it deregisters first (and waits until the
// servers' catalog no longer lists it), keeps serving for -drain
// and then while requests still come (at most -drain-max) so that the load
// balancer applies the change, and only then stops: a scale-down drops no
// request. Without Consul, -drain alone keeps serving after SIGTERM (for a
// load balancer that watches the container engine).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// shutdownTimeout bounds how long in-flight requests may take to finish
// once the server stops, after the drain.
const shutdownTimeout = 10 * time.Second

// run serves until ctx ends (main cancels it on SIGTERM or SIGINT), then
// deregisters, drains and stops. args[0] is the program name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args[1:], stderr, net.InterfaceAddrs)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo-backend: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("backend", cfg.Name)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	var seen lastRequest
	srv := &http.Server{Handler: seen.wrap(handler(cfg.Name)), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String())

	var reg *registration
	if cfg.Consul != nil {
		if reg, err = newRegistration(cfg, log); err != nil {
			log.Error("consul", "err", err)
			_ = srv.Close()
			return 1
		}
	}
	regCtx, stopReg := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if reg != nil {
		wg.Go(func() { reg.keep(regCtx) })
	}

	code := 0
	select {
	case <-ctx.Done():
	case err := <-served:
		log.Error("serve", "err", err)
		code = 1
	}
	term := time.Now()
	bound := term.Add(cfg.DrainMax)
	stopReg()
	wg.Wait()
	// Deregister before anything else, then keep serving while the load
	// balancer takes this instance out of its configuration. An instance
	// that never registered was never routed to.
	drain := cfg.Drain
	if reg != nil && !reg.deregister(bound) {
		drain = 0
	}
	if code == 0 && drain > 0 {
		log.Info("draining: still serving while the load balancer applies the change",
			"drain", drain, "idle", cfg.DrainIdle, "max", cfg.DrainMax)
		why := drained(time.Now().Add(drain), bound, cfg.DrainIdle, seen.at)
		log.Info("drained", "why", why, "after", time.Since(term).Round(time.Millisecond))
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Error("shutdown", "err", err)
		code = 1
	}
	log.Info("stopped")
	return code
}

// drained returns once the drain may end: at bound, or once minEnd has
// passed and no request came for idle (at once with idle 0). A fixed
// drain guesses how long the load balancer takes; traffic that still
// comes says it has not finished, whatever made it slow.
func drained(minEnd, bound time.Time, idle time.Duration, last func() time.Time) string {
	for {
		now := time.Now()
		if !now.Before(bound) {
			return "the drain's bound (-drain-max)"
		}
		next := minEnd
		if !now.Before(minEnd) {
			quiet := last().Add(idle)
			if idle == 0 || !now.Before(quiet) {
				return "no request came for -drain-idle"
			}
			next = quiet
		}
		t := time.NewTimer(earliest(next, bound).Sub(now))
		<-t.C
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// lastRequest is when the latest request other than a health check
// arrived.
type lastRequest struct{ nanos atomic.Int64 }

func (l *lastRequest) at() time.Time {
	if n := l.nanos.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

func (l *lastRequest) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" { // Consul's check, not traffic
			l.nanos.Store(time.Now().UnixNano())
		}
		h.ServeHTTP(w, r)
	})
}

func handler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", name)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
		if err != nil || ms < 0 || ms > 600_000 {
			http.Error(w, "ms must be 0..600000", http.StatusBadRequest)
			return
		}
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			fmt.Fprintf(w, "slow hello from %s after %dms\n", name, ms)
		case <-r.Context().Done():
		}
	})
	return mux
}
