// Package status serves seamless's HTTP endpoints: /healthz for liveness,
// /readyz for readiness, /metrics for Prometheus and, given a Provider,
// /status (JSON, see Report) and a page for people at /.
package status

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Server is the status listener.
type Server struct {
	srv *http.Server
	ln  net.Listener
	log *slog.Logger
}

// Option adds to what Listen serves.
type Option func(*options)

type options struct {
	report Provider
}

// WithStatus serves GET /status, the Report p makes as JSON, and GET /, the
// same as a page that refreshes itself.
func WithStatus(p Provider) Option {
	return func(o *options) { o.report = p }
}

// Listen binds addr now, so that a busy port is an error at start-up rather
// than a log line later. healthy returns nil when seamless and HAProxy are
// fine; ready, when moreover traffic is served as configured (first
// discovery done and applied).
func Listen(addr string, reg *prometheus.Registry, healthy, ready func() error, log *slog.Logger, opts ...Option) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("status listener: %w", err)
	}
	log = log.With("component", "status")
	cl := &capListener{Listener: ln, max: maxConns(), log: log}
	return &Server{
		srv: &http.Server{
			Handler: handler(reg, healthy, ready, opts...),
			// Bounded, so that no client holds a connection (a
			// descriptor) for long: probes and scrapes are small.
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second, // /status and /metrics on a loaded machine
			IdleTimeout:       30 * time.Second,
			ConnState:         cl.connState,
		},
		ln:  cl,
		log: log,
	}, nil
}

// checks are the health and readiness functions given to Listen.
type checks struct {
	healthy, ready func() error
}

// readyz: ready only when healthy too.
func (c checks) readyz() error {
	if err := c.healthy(); err != nil {
		return err
	}
	return c.ready()
}

func handler(reg *prometheus.Registry, healthy, ready func() error, opts ...Option) http.Handler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c := checks{healthy: healthy, ready: ready}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", probe(c.healthy))
	mux.HandleFunc("GET /readyz", probe(c.readyz))
	if o.report != nil {
		mux.HandleFunc("GET /status", c.serveJSON(o.report))
		mux.HandleFunc("GET /{$}", c.servePage(o.report))
	}
	return mux
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.srv.Shutdown(c)
	})
	defer stop()
	s.log.Info("endpoint listening", "addr", s.Addr()) // the component says which
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func probe(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		err := check()
		var degraded *model.Degraded
		if errors.As(err, &degraded) {
			fmt.Fprintln(w, "ok, degraded:", degraded)
			return
		}
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}
