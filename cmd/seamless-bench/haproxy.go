package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// renderConfig returns the HAProxy configuration used by every scenario.
// Only the X-Config-Version line changes between versions: a harmless
// change that still makes HAProxy load a different file, and that the
// backend echoes so the load shows which version answered.
func renderConfig(frontend, backend string, version int) []byte {
	return fmt.Appendf(nil, `# written by seamless-bench
global
    hard-stop-after 30s

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option idle-close-on-response

frontend fe
    bind %s
    http-request set-header X-Config-Version %d
    default_backend be

backend be
    server app %s
`, frontend, version, backend)
}

// writeConfig replaces path atomically, so HAProxy never reads half a file.
func writeConfig(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".haproxy-*.cfg")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// showProc asks the master CLI on sock for `show proc`, through the same
// client seamless uses.
func showProc(ctx context.Context, sock string) (haproxy.Procs, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return (&haproxy.MasterCLI{Network: "unix", Addr: sock}).ShowProc(ctx)
}

// startBackend serves the application HAProxy forwards to: 200 and a short
// body naming the config version that handled the request.
func startBackend() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprintf(w, "ok config=%s\n", r.Header.Get("X-Config-Version"))
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "backend: %v\n", err)
		}
	}
	return ln.Addr().String(), stop, nil
}
