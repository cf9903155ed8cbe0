package status

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"
)

// debugLongest bounds a profile's or trace's ?seconds=.
const debugLongest = 2 * time.Minute

// ListenDebug opens Go's profiler on addr (SEAMLESS_DEBUG_ADDR), on a
// listener of its own: the status endpoint is often published, the
// profiler never should be.
func ListenDebug(addr string, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug listener: %w", err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		log.Warn("SEAMLESS_DEBUG_ADDR listens beyond loopback: anyone who reaches it can read seamless's internals and load its CPU; bind it to 127.0.0.1",
			"addr", ln.Addr().String())
	}
	mux := http.NewServeMux()
	// pprof.Index serves the named profiles (heap, goroutine, allocs...).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", capSeconds(pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", capSeconds(pprof.Trace))
	return &Server{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			// No write timeout: a CPU profile answers after its
			// ?seconds= (bounded by capSeconds).
			IdleTimeout: 30 * time.Second,
		},
		ln:  ln,
		log: log.With("component", "debug"),
	}, nil
}

// capSeconds refuses a profile or trace longer than debugLongest: nobody
// holds the profiler (one at a time) and a core for hours.
func capSeconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if sec, err := strconv.ParseFloat(r.FormValue("seconds"), 64); err == nil && sec > debugLongest.Seconds() {
			http.Error(w, fmt.Sprintf("seconds=%g: at most %g", sec, debugLongest.Seconds()), http.StatusBadRequest)
			return
		}
		h(w, r)
	}
}
