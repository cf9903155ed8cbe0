package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	legolog "github.com/go-acme/lego/v5/log"
	"github.com/hashicorp/consul/api"
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

// acmeEnabled reports whether ACME obtains certificates for the routed hosts.
func acmeEnabled(cfg *config.Config) bool { return httpsEnabled(cfg) && cfg.ACMEEmail != "" }

// httpsFiles is what the built-in template's HTTPS frontend is rendered
// with: the crt-list and the ACME challenge map under a state directory
// ("" when unused), and who is told the hosts routed (nil: nobody).
type httpsFiles struct {
	crtList, acmeMap string
	hosts            func([]string)
}

func httpsFilesAt(cfg *config.Config, stateDir string, hosts func([]string)) httpsFiles {
	f := httpsFiles{crtList: crtList(cfg, stateDir), hosts: hosts}
	if acmeEnabled(cfg) {
		f.acmeMap = filepath.Join(stateDir, "acme-challenges.map")
	}
	return f
}

// certsDir is where the installed certificates and the crt-list live.
func certsDir(stateDir string) string { return filepath.Join(stateDir, "certs") }

// httpsCerts keeps the HTTPS frontend's certificates: written before
// HAProxy starts, then changed over the runtime API as SEAMLESS_CERTS_DIR,
// SEAMLESS_CERTS_KV and ACME change.
type httpsCerts struct {
	inst *certs.Installer
	dir  *certs.Dir  // nil without SEAMLESS_CERTS_DIR
	kv   *certs.KV   // nil without SEAMLESS_CERTS_KV
	acme *certs.ACME // nil without SEAMLESS_ACME_EMAIL
	log  *slog.Logger
	// What the files were prepared with, from each source.
	dirSet, kvSet certs.Set
	hosts         chan []string
	wg            sync.WaitGroup
	stop          context.CancelFunc
}

// hostsFunc is what the renderer tells the hosts it routes; nil without
// ACME, which alone needs them.
func (h *httpsCerts) hostsFunc() func([]string) {
	if h == nil || h.acme == nil {
		return nil
	}
	return func(hosts []string) {
		// Only the newest list matters: replace one not read yet.
		for {
			select {
			case h.hosts <- hosts:
				return
			default:
			}
			select {
			case <-h.hosts:
			default:
			}
		}
	}
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
	h := &httpsCerts{inst: inst, log: log}
	if cfg.CertsDir != "" {
		h.dir = certs.NewDir(cfg.CertsDir, cfg.CertsRescan, nil, log)
		if h.dirSet, _, err = h.dir.Scan(); err != nil {
			return nil, fmt.Errorf("SEAMLESS_CERTS_DIR: %w", err)
		}
	}
	var consul *api.Client
	if cfg.CertsKV != "" || cfg.ACMEKV != "" {
		if consul, err = certsConsul(cfg); err != nil {
			return nil, err
		}
	}
	if cfg.CertsKV != "" {
		h.kv = certs.NewKV(consul, cfg.CertsKV, kvHold(cfg), nil, log)
		if cli != nil { // a check needs no certificate but the default
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			h.kvSet, err = h.kv.Read(ctx)
			cancel()
			if err != nil {
				// HTTPS starts with what else it has; the watch brings
				// them once Consul answers.
				log.Warn("SEAMLESS_CERTS_KV cannot be read yet; its certificates are installed once Consul answers",
					"component", "certs", "err", err)
			}
		}
	}
	set, _ := certs.Merge(h.dirSet, h.kvSet)
	if acmeEnabled(cfg) {
		f := httpsFilesAt(cfg, stateDir, nil)
		ch, err := certs.NewChallenges(f.acmeMap, cli)
		if err != nil {
			return nil, fmt.Errorf("SEAMLESS_ACME_EMAIL: %w", err)
		}
		if cli != nil { // not for a check, which only needs the map file
			var am *certs.ACMEMetrics
			if reg != nil {
				am = certs.NewACMEMetrics()
				reg.MustRegister(am)
			}
			legolog.SetDefault(log.With("component", "acme", "library", "lego"))
			h.acme, err = certs.NewACME(certs.ACMEOptions{CA: cfg.ACMECA, Email: cfg.ACMEEmail, CABundle: cfg.ACMECABundle,
				EABKeyID: cfg.ACMEEABKeyID, EABHMAC: cfg.ACMEEABHMAC, Dir: filepath.Join(stateDir, "acme"), KV: cfg.ACMEKV, Consul: consul,
				Challenges: ch, Metrics: am, Log: log})
			if err != nil {
				return nil, err
			}
			h.hosts = make(chan []string, 1)
			set = h.acme.Initial(set)
			log.Info("ACME enabled for the routed hosts no SEAMLESS_CERTS_DIR or SEAMLESS_CERTS_KV certificate covers", "component", "acme",
				"ca", cfg.ACMECA, "email", cfg.ACMEEmail, "challenge_map", f.acmeMap, "shared_kv", cfg.ACMEKV)
		}
	}
	if err := inst.Prepare(set); err != nil {
		return nil, fmt.Errorf("SEAMLESS_HTTPS_BIND: %w", err)
	}
	log.Info("HTTPS frontend", "component", "certs", "bind", cfg.HTTPSBind, "certificates", len(set.Certs),
		"dir", cfg.CertsDir, "kv", cfg.CertsKV, "crt_list", inst.CrtList())
	return h, nil
}

// certsConsul is the Consul client of SEAMLESS_CERTS_KV and
// SEAMLESS_ACME_KV: Consul's own variables, and the first agent of
// SEAMLESS_CONSUL_ADDRS when set.
func certsConsul(cfg *config.Config) (*api.Client, error) {
	ac := api.DefaultConfig()
	if agents := cfg.ConsulAgents(); len(agents) > 0 {
		ac.Address, ac.Scheme = agents[0], "http"
		if rest, ok := strings.CutPrefix(agents[0], "https://"); ok {
			ac.Address, ac.Scheme = rest, "https"
		} else {
			ac.Address = strings.TrimPrefix(agents[0], "http://")
		}
	}
	c, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("SEAMLESS_CERTS_KV, SEAMLESS_ACME_KV: Consul client for %s: %w", ac.Address, err)
	}
	return c, nil
}

// run watches SEAMLESS_CERTS_DIR and SEAMLESS_CERTS_KV, orders what ACME
// must, and installs the changes until stop.
func (h *httpsCerts) run() {
	if h.dir == nil && h.kv == nil && h.acme == nil {
		h.stop = func() {}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	var dirSets, kvSets chan certs.Set
	if h.dir != nil {
		dirSets = make(chan certs.Set)
		h.wg.Go(func() { h.dir.Run(ctx, dirSets) })
	}
	if h.kv != nil {
		kvSets = make(chan certs.Set)
		h.wg.Go(func() { h.kv.Run(ctx, h.kvSet, kvSets) })
	}
	merged := make(chan certs.Set)
	h.wg.Go(func() { certs.RunMerge(ctx, h.dirSet, h.kvSet, dirSets, kvSets, merged, h.log) })
	ch := merged
	if h.acme != nil {
		// ACME adds its certificates to the sources'.
		ch = make(chan certs.Set)
		h.wg.Go(func() { h.acme.Run(ctx, merged, h.hosts, ch) })
	}
	h.wg.Go(func() { h.inst.Run(ctx, ch) })
}

func (h *httpsCerts) close() {
	if h.stop != nil {
		h.stop()
	}
	h.wg.Wait()
}

// kvHold is how long SEAMLESS_CERTS_KV holds certificate removals after
// Consul lost its data: SEAMLESS_REMOVAL_HOLD, none when
// SEAMLESS_REMOVAL_GUARD=0 turns the guard off.
func kvHold(cfg *config.Config) time.Duration {
	if cfg.RemovalGuard <= 0 {
		return 0
	}
	return cfg.RemovalHold
}
