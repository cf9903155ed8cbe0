package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/certs"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/regular"
)

// showProcTimeout bounds the master CLI's `show proc` for one /status: a
// master busy reloading must not hold the page.
const showProcTimeout = time.Second

// statusProvider makes /status and the page at / from what serve has: the
// discovery half (nil in drop-in mode), the master CLI, and the files
// HAProxy loads (in discovery mode, the rendered one), and the HTTPS
// certificates (nil without the built-in HTTPS frontend).
func statusProvider(disc *discovery, cli *haproxy.MasterCLI, configFiles []string, reloads *reloadLog, hc *httpsCerts) status.Provider {
	p := &statusPage{procs: cli, stats: cli, reloads: reloads, files: slices.Clone(configFiles), now: time.Now, timeout: showProcTimeout}
	if disc != nil {
		p.applier = disc.applier
	}
	if hc != nil {
		p.certs = hc.inst.Served
	}
	p.hostname, _ = os.Hostname()
	return p.report
}

// applierView is what the page reads of an apply.Applier.
type applierView interface {
	Statuses() []model.SourceStatus
	History() []apply.Record
	Running() apply.Running
}

// procLister is the master CLI as the page uses it.
type procLister interface {
	ShowProc(ctx context.Context) (haproxy.Procs, error)
}

// statReader sends a command to the master CLI (`@1 show stat`).
type statReader interface {
	Do(ctx context.Context, cmd string) (string, error)
}

type statusPage struct {
	applier  applierView // nil in drop-in mode
	procs    procLister
	stats    statReader            // nil: no backends shown
	reloads  *reloadLog            // nil: no reloads shown
	certs    func() []certs.Served // nil: no HTTPS frontend
	files    []string
	hostname string
	now      func() time.Time
	timeout  time.Duration
}

func (p *statusPage) report(ctx context.Context) status.Report {
	r := status.Report{
		Time: p.now(), Version: version, Hostname: p.hostname, Mode: status.ModeDropIn,
		ConfigFiles: configFiles(p.files),
		HAProxy:     p.haproxy(ctx),
	}
	if commit != "unknown" {
		r.Commit = commit
	}
	var run apply.Running
	if p.applier != nil {
		r.Mode = status.ModeDiscovery
		r.Sources = sources(p.applier.Statuses())
		r.Applies = applies(p.applier.History())
		run = p.applier.Running()
		r.Skipped, r.ConsulIndex = run.Skipped, run.ConsulIndex
		for _, rt := range run.Routes {
			r.Routes = append(r.Routes, status.Route{Match: rt.Match, Service: rt.Service, Backend: rt.Backend})
		}
	}
	if p.reloads != nil {
		r.Reloads = p.reloads.history()
	}
	switch {
	case p.applier != nil:
		// The applier keeps the rendered file what runs: it rolls a
		// refused one back, and a runtime change rewrites it without a
		// reload.
		for i := range r.ConfigFiles {
			r.ConfigFiles[i].RunningSHA256 = r.ConfigFiles[i].SHA256
		}
	case p.reloads != nil:
		p.reloads.annotate(r.ConfigFiles)
	}
	r.Config = fingerprint(r.ConfigFiles, p.applier != nil)
	if p.stats != nil {
		r.Backends, r.BackendsError = p.backends(ctx, run)
	}
	if p.certs != nil {
		r.Certificates = certificates(p.certs(), r.Time)
	}
	return r
}

func certificates(served []certs.Served, now time.Time) []status.Certificate {
	out := make([]status.Certificate, 0, len(served))
	for _, s := range served {
		out = append(out, status.Certificate{Name: s.Name, Source: s.Source, Hosts: slices.Clone(s.Names),
			Issuer: s.Issuer, Serial: serialHex(s.Serial), NotAfter: s.NotAfter.UTC(), Expiring: s.Expiring(now),
			ServedSince: s.Since.UTC(), File: s.File})
	}
	return out
}

// serialHex prints a serial as HAProxy's `show ssl cert` and openssl do:
// upper-case hex in whole bytes.
func serialHex(n *big.Int) string {
	if n == nil {
		return ""
	}
	return strings.ToUpper(hex.EncodeToString(n.Bytes()))
}

func (p *statusPage) haproxy(ctx context.Context) status.HAProxy {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	procs, err := p.procs.ShowProc(ctx)
	if err != nil {
		return status.HAProxy{Error: err.Error()}
	}
	master := proc(procs.Master)
	h := status.HAProxy{Version: procs.Master.Version, Master: &master}
	for _, w := range procs.Workers {
		h.Workers = append(h.Workers, proc(w))
	}
	for _, w := range procs.Old {
		h.OldWorkers = append(h.OldWorkers, proc(w))
	}
	return h
}

func proc(p haproxy.Proc) status.Proc {
	return status.Proc{Pid: p.Pid, Reloads: p.Reloads, Version: p.Version}
}

func sources(sts []model.SourceStatus) []status.Source {
	out := make([]status.Source, 0, len(sts))
	for _, s := range sts {
		out = append(out, status.Source{Name: s.Name, Up: s.Up, LastSuccess: s.LastSuccess,
			LastError: s.LastError, LastErrorAt: s.LastErrorAt,
			Stale: s.StaleReason, Held: s.Held, HeldUntil: s.HeldUntil, Withheld: s.Withheld, WithheldUntil: s.WithheldUntil})
	}
	return out
}

// applies turns the applier's history, newest last, into newest first.
func applies(hist []apply.Record) []status.Apply {
	out := make([]status.Apply, 0, len(hist))
	for _, r := range slices.Backward(hist) {
		out = append(out, status.Apply{Time: r.Time, Reason: r.Reason, Change: r.Change, How: r.How,
			DurationSeconds: r.Duration.Seconds(), Error: r.Error})
	}
	return out
}

// configFiles describes the files HAProxy loads for `-f` paths, listed as
// haproxy.ListConfigFiles does. A file that is not regular (a FIFO swapped
// in) is named, never opened: opening a FIFO blocks until a writer comes.
func configFiles(paths []string) []status.ConfigFile {
	entries, _, err := haproxy.ListConfigFiles(paths)
	var out []status.ConfigFile
	for _, e := range entries {
		if e.NotRegular != nil {
			out = append(out, status.ConfigFile{Path: e.Path, Error: e.NotRegular.Error()})
			continue
		}
		out = append(out, configFile(e.Path))
	}
	if err != nil {
		out = append(out, status.ConfigFile{Error: err.Error()})
	}
	return out
}

func configFile(path string) status.ConfigFile {
	// A FIFO swapped in since the listing must not block.
	f, st, err := regular.Open(path)
	if re := (*regular.Error)(nil); errors.As(err, &re) {
		return status.ConfigFile{Path: path, Error: (&haproxy.NotRegularError{Path: path, Mode: re.Mode}).Error()}
	}
	if err != nil {
		return status.ConfigFile{Path: path, Error: err.Error()}
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return status.ConfigFile{Path: path, Error: err.Error()}
	}
	return status.ConfigFile{Path: path, SHA256: hex.EncodeToString(h.Sum(nil)), Size: n, Modified: st.ModTime().UTC()}
}

// countWorkers is seamless_haproxy_workers read from `show proc` at each
// scrape; not while a reload is in flight (busy), when the master
// re-executes and the reloader itself asks it: the last values stay.
func countWorkers(cli procLister, busy func() bool) func(ctx context.Context) (current, old int, err error) {
	return func(ctx context.Context) (int, int, error) {
		if busy() {
			return 0, 0, errReloading
		}
		p, err := cli.ShowProc(ctx)
		return len(p.Workers), len(p.Old), err
	}
}

var errReloading = errors.New("a reload is in flight")
