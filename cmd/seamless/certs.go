package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/seamless-lb/seamless/entrypoint/certs"
	"github.com/seamless-lb/seamless/entrypoint/config"
)

// httpsEnabled reports whether the built-in template serves HTTPS: a user
// template binds what it wants itself.
func httpsEnabled(cfg *config.Config) bool {
	return cfg.HTTPSBind != "" && cfg.Template == "" && cfg.Discovery()
}

// crtList is the HTTPS frontend's crt-list under stateDir, "" when the
// built-in template has no HTTPS frontend.
func crtList(cfg *config.Config, stateDir string) string {
	if !httpsEnabled(cfg) {
		return ""
	}
	return filepath.Join(certsDir(stateDir), "crt-list")
}

// certsDir is where the installed certificates and the crt-list live.
func certsDir(stateDir string) string { return filepath.Join(stateDir, "certs") }

// httpsCerts keeps the HTTPS frontend's certificates: written before
// HAProxy starts, then changed over the runtime API as SEAMLESS_CERTS_DIR
// changes.
type httpsCerts struct {
	inst *certs.Installer
	dir  *certs.Dir // nil without SEAMLESS_CERTS_DIR
	wg   sync.WaitGroup
	stop context.CancelFunc
}

// prepareCerts makes the default certificate and writes the certificates
// of SEAMLESS_CERTS_DIR with their crt-list into stateDir, before the
// first configuration is rendered and checked (it names the crt-list).
// reload is called when the runtime API fails; it is not called before
// start. reg may be nil.
func prepareCerts(cfg *config.Config, stateDir string, cli certs.CLI, reload func(string), reg prometheus.Registerer, log *slog.Logger) (*httpsCerts, error) {
	var m *certs.Metrics
	if reg != nil {
		m = certs.NewMetrics()
		reg.MustRegister(m)
	}
	inst, err := certs.NewInstaller(certs.InstallerOptions{Dir: certsDir(stateDir), CLI: cli, Reload: reload, Metrics: m, Log: log})
	if err != nil {
		return nil, fmt.Errorf("SEAMLESS_HTTPS_BIND: %w", err)
	}
	h := &httpsCerts{inst: inst}
	var set certs.Set
	if cfg.CertsDir != "" {
		h.dir = certs.NewDir(cfg.CertsDir, cfg.CertsRescan, nil, log)
		if set, _, err = h.dir.Scan(); err != nil {
			return nil, fmt.Errorf("SEAMLESS_CERTS_DIR: %w", err)
		}
	}
	if err := inst.Prepare(set); err != nil {
		return nil, fmt.Errorf("SEAMLESS_HTTPS_BIND: %w", err)
	}
	log.Info("HTTPS frontend", "component", "certs", "bind", cfg.HTTPSBind, "certificates", len(set.Certs),
		"dir", cfg.CertsDir, "crt_list", inst.CrtList())
	return h, nil
}

// run watches SEAMLESS_CERTS_DIR and installs its changes until stop.
func (h *httpsCerts) run() {
	if h.dir == nil {
		h.stop = func() {}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	ch := make(chan certs.Set)
	h.wg.Go(func() { h.dir.Run(ctx, ch) })
	h.wg.Go(func() { h.inst.Run(ctx, ch) })
}

func (h *httpsCerts) close() {
	if h.stop != nil {
		h.stop()
	}
	h.wg.Wait()
}
