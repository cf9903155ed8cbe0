package status

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

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
	mux := http.NewServeMux()
	// pprof.Index serves the named profiles (heap, goroutine, allocs...).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &Server{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			// No write timeout: a CPU profile answers after its
			// ?seconds=, and pprof refuses one longer than the timeout.
			IdleTimeout: 30 * time.Second,
		},
		ln:  ln,
		log: log.With("component", "debug"),
	}, nil
}
