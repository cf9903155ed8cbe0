package main

// `tls`: HTTPS through seamless's built-in HTTPS frontend while a
// certificate rotates.
//
// A seamless of its own (real HAProxy) for each run of a variant serves a
// host, bench.test, from a SEAMLESS_CERTS_DIR on 127.0.0.1. Each variant
// runs once per round, -rounds rounds interleaved (abc abc ...), and its
// rounds are added up. Two bounded loads run at once for -duration:
// -workers clients that open a new TLS connection for every
// request (a full handshake each, no session resumption) and -workers
// clients on keep-alive connections. Requests are never retried. The
// variants:
//
//	a  no rotation
//	b  the certificate file replaced every -rotate: seamless installs it over
//	   HAProxy's runtime API, no reload
//	c  the same, plus a SIGHUP to seamless after each replacement: a reload
//	   per rotation, what a certbot deploy hook does
//
// After each rotation, handshakes poll until the new serial is served
// (within the period, or it counts as not served); the reloads are
// seamless_reloads_total's increase. Two tables, one per client mode, give the rates with their ratio to a, the failures,
// p50/p99 latency (a new connection's includes its handshake), rotations
// and reloads.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
)

const tlsHost = "bench.test"

type tlsOptions struct {
	seamless, haproxy string
	duration, rotate  time.Duration
	warmup            time.Duration
	workers, rounds   int
	maxRequests       int64
	variants          []tlsVariant
	keep              bool
}

type tlsVariant struct {
	key, name      string
	rotate, reload bool
}

var allTLSVariants = []tlsVariant{
	{"a", "no rotation", false, false},
	{"b", "rotation, runtime API", true, false},
	{"c", "rotation + reload", true, true},
}

func parseTLSFlags(args []string, stderr io.Writer) (tlsOptions, error) {
	fs := flag.NewFlagSet("tls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := tlsOptions{}
	fs.StringVar(&o.seamless, "seamless", "bin/seamless", "the seamless binary")
	fs.StringVar(&o.haproxy, "haproxy", envOr("SEAMLESS_HAPROXY_BIN", "haproxy"), "the HAProxy binary")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "load per variant and round")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds, each running every variant once")
	fs.DurationVar(&o.rotate, "rotate", time.Second, "certificate rotation period (variants b and c)")
	fs.DurationVar(&o.warmup, "warmup", 3*time.Second, "an unmeasured run of variant a first; 0: none")
	fs.IntVar(&o.workers, "workers", 4, "clients per mode (new connections, keep-alive)")
	fs.Int64Var(&o.maxRequests, "max-requests", 2_000_000, "requests per mode and variant, at most")
	variants := fs.String("variants", "abc", "which variants, in order")
	fs.BoolVar(&o.keep, "keep", false, "keep each variant's files and seamless's log")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, k := range *variants {
		i := strings.IndexFunc("abc", func(r rune) bool { return r == k })
		if i < 0 {
			return o, fmt.Errorf("-variants %q: only a, b and c exist", *variants)
		}
		o.variants = append(o.variants, allTLSVariants[i])
	}
	switch {
	case len(o.variants) == 0:
		return o, errors.New("-variants: none chosen")
	case o.duration <= 0 || o.duration > time.Hour:
		return o, fmt.Errorf("-duration %v: between 0 and 1h", o.duration)
	case o.rotate < 10*time.Millisecond:
		return o, fmt.Errorf("-rotate %v: 10ms at least", o.rotate)
	case o.rounds < 1 || o.rounds > 100:
		return o, fmt.Errorf("-rounds %d: 1 to 100", o.rounds)
	case o.workers < 1 || o.workers > 256:
		return o, fmt.Errorf("-workers %d: 1 to 256", o.workers)
	case o.maxRequests < 1:
		return o, fmt.Errorf("-max-requests %d: 1 at least", o.maxRequests)
	}
	return o, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

type tlsResult struct {
	v              tlsVariant
	fresh, keep    *tlsLoad
	elapsed        time.Duration
	rotations      int
	served         []time.Duration // from each rotation to its serial served, if within the period
	reloads, other float64
	err            error
}

func runTLS(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseTLSFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench tls: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "bench")
	if o.haproxy, err = exec.LookPath(o.haproxy); err != nil {
		fmt.Fprintf(stderr, "seamless-bench tls: HAProxy: %v\n", err)
		return 1
	}
	root, err := os.MkdirTemp("", "seamless-bench-tls-")
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench tls: %v\n", err)
		return 1
	}
	failed := false
	defer func() {
		for _, pid := range procfs.Mentioning(root) {
			log.Warn("killing leftover process", "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if failed || o.keep {
			log.Info("keeping the files of the runs", "dir", root)
			return
		}
		os.RemoveAll(root)
	}()
	be, err := startNamedBackends("bench")
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench tls: backend: %v\n", err)
		return 1
	}
	defer be.stop()
	if o.warmup > 0 {
		w := o
		w.duration = o.warmup
		log.Info("warming up", "variant", "a", "for", o.warmup)
		if r := runTLSVariant(ctx, log, w, filepath.Join(root, "warmup"), be.ports["bench"], allTLSVariants[0]); r.err != nil {
			log.Warn("warm-up failed", "err", r.err)
		}
	}
	// Rounds interleave the variants (abc abc ...) so that a machine
	// busier during one part of the run does not weigh on one variant.
	results := make([]tlsResult, len(o.variants))
	for round := 1; round <= o.rounds; round++ {
		for i, v := range o.variants {
			if ctx.Err() != nil || results[i].err != nil {
				continue
			}
			log.Info("running", "variant", v.key, "name", v.name, "round", round, "for", o.duration)
			r := runTLSVariant(ctx, log, o, filepath.Join(root, fmt.Sprintf("%s%d", v.key, round)), be.ports["bench"], v)
			if r.err != nil {
				failed = true
				log.Error("variant failed", "variant", v.key, "round", round, "err", r.err)
			}
			results[i].add(r)
		}
	}
	version, _ := exec.Command(o.haproxy, "-v").Output()
	line, _, _ := strings.Cut(string(version), "\n")
	fmt.Fprintf(stdout, "%s; %d rounds of %v per variant, interleaved; %d clients per mode; rotation every %v\n\n",
		strings.TrimSpace(line), o.rounds, o.duration, o.workers, o.rotate)
	printTLSTables(stdout, o, results)
	if failed || ctx.Err() != nil {
		return 1
	}
	return 0
}

// add merges round r into the variant's totals.
func (t *tlsResult) add(r tlsResult) {
	t.v = r.v
	if r.err != nil {
		t.err = r.err
		return
	}
	t.elapsed += r.elapsed
	t.rotations += r.rotations
	t.served = append(t.served, r.served...)
	t.reloads += r.reloads
	t.other += r.other
	for _, pair := range [][2]**tlsLoad{{&t.fresh, &r.fresh}, {&t.keep, &r.keep}} {
		into, from := pair[0], *pair[1]
		if *into == nil {
			*into = from
			continue
		}
		(*into).merge(from)
	}
}

// runTLSVariant starts a seamless of its own in dir, runs both loads with
// the variant's rotations, and stops it.
func runTLSVariant(ctx context.Context, log *slog.Logger, o tlsOptions, dir string, backendPort int, v tlsVariant) (r tlsResult) {
	r.v = v
	services, certsDir := filepath.Join(dir, "services"), filepath.Join(dir, "certs")
	for _, d := range []string{services, certsDir} {
		if r.err = os.MkdirAll(d, 0o755); r.err != nil {
			return r
		}
	}
	svc := fmt.Sprintf("name: bench\ntags: [\"seamless.http.host=%s\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", tlsHost, backendPort)
	if r.err = os.WriteFile(filepath.Join(services, "bench.yaml"), []byte(svc), 0o644); r.err != nil {
		return r
	}
	// Every certificate the run installs, made before it: key generation
	// is not what is measured.
	n := 1
	if v.rotate {
		n += int(o.duration/o.rotate) + 1
	}
	bundles, serials := make([][]byte, n), make([]string, n)
	for i := range bundles {
		if bundles[i], serials[i], r.err = benchCert(); r.err != nil {
			return r
		}
	}
	if r.err = replaceFile(filepath.Join(certsDir, "bench.pem"), bundles[0]); r.err != nil {
		return r
	}
	addrs, err := freeAddrs(3)
	if err != nil {
		r.err = err
		return r
	}
	httpsAddr, status := addrs[1], addrs[2]
	runDir := filepath.Join(dir, "run")
	if r.err = os.MkdirAll(runDir, 0o755); r.err != nil {
		return r
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SEAMLESS_") && !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	env = append(env, "SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR="+services, "SEAMLESS_WAIT=0",
		"SEAMLESS_HTTP_BIND="+addrs[0], "SEAMLESS_HTTPS_BIND="+httpsAddr, "SEAMLESS_CERTS_DIR="+certsDir,
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATUS_ADDR="+status, "SEAMLESS_STATE_DIR="+filepath.Join(dir, "state"),
		"SEAMLESS_RUN_DIR="+runDir, "SEAMLESS_HAPROXY_BIN="+o.haproxy)
	logf, err := os.Create(filepath.Join(dir, "seamless.log"))
	if err != nil {
		r.err = err
		return r
	}
	defer logf.Close()
	p, err := startProc("seamless", logf, env, o.seamless, "haproxy")
	if err != nil {
		r.err = err
		return r
	}
	defer func() {
		if err := p.stop(syscall.SIGTERM, stopGrace); err != nil && r.err == nil {
			r.err = err
		}
		if r.err != nil {
			r.err = fmt.Errorf("%w\nseamless's log (%s):\n%s", r.err, logf.Name(), tail(logf.Name(), 30))
		}
	}()
	// Ready: a handshake is served the first certificate (/status lists
	// it from before HAProxy starts).
	if r.err = poll(ctx, 20*time.Millisecond, readyTimeout, "the HTTPS frontend serving "+tlsHost, func() (bool, error) {
		if err := p.alive(); err != nil {
			return false, err
		}
		s, err := handshakeSerial(httpsAddr)
		return err == nil && s == serials[0], err
	}); r.err != nil {
		return r
	}
	ok0, other0, err := reloadCounts(ctx, status)
	if err != nil {
		r.err = err
		return r
	}

	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	r.fresh = newTLSLoad(httpsAddr, tlsHost, false, o.maxRequests)
	r.keep = newTLSLoad(httpsAddr, tlsHost, true, o.maxRequests)
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() { r.fresh.run(lctx, o.workers) })
	wg.Go(func() { r.keep.run(lctx, o.workers) })
	if v.rotate {
		r.rotations, r.served, r.err = rotate(lctx, o.rotate, p, v.reload, filepath.Join(certsDir, "bench.pem"), bundles[1:], serials[1:], httpsAddr)
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	if r.err != nil {
		return r
	}
	// /status names what HAProxy serves.
	if r.err = poll(ctx, 50*time.Millisecond, 5*time.Second, "/status naming the served certificate", func() (bool, error) {
		hs, err := handshakeSerial(httpsAddr)
		if err != nil {
			return false, err
		}
		st, err := servedSerial(ctx, status)
		if err != nil {
			return false, err
		}
		a, _ := new(big.Int).SetString(hs, 16)
		b, _ := new(big.Int).SetString(st, 16)
		return a != nil && b != nil && a.Cmp(b) == 0, fmt.Errorf("served %s, /status names %s", hs, st)
	}); r.err != nil {
		return r
	}
	ok1, other1, err := reloadCounts(ctx, status)
	if err != nil {
		r.err = err
		return r
	}
	r.reloads, r.other = ok1-ok0, other1-other0
	return r
}

// rotate replaces the certificate every period until ctx ends, with a
// SIGHUP to seamless after each when reload is set. After each, it polls
// handshakes until the new serial is served, for at most the period, and
// returns how long each one served took.
func rotate(ctx context.Context, period time.Duration, p *proc, reload bool, path string, bundles [][]byte, serials []string, addr string) (rotations int, served []time.Duration, err error) {
	t := time.NewTicker(period)
	defer t.Stop()
	for i := range bundles {
		select {
		case <-ctx.Done():
			return rotations, served, nil
		case <-t.C:
		}
		start := time.Now()
		if err := replaceFile(path, bundles[i]); err != nil {
			return rotations, served, err
		}
		if reload {
			if err := p.signal(syscall.SIGHUP); err != nil {
				return rotations, served, err
			}
		}
		// Not served within the period: counted as not served; cut
		// short by the end of the run: not counted.
		ok := false
		_ = poll(ctx, 20*time.Millisecond, period-period/10, "rotation served", func() (bool, error) {
			s, err := handshakeSerial(addr)
			if err == nil && s == serials[i] {
				served = append(served, time.Since(start))
				ok = true
			}
			return ok, err
		})
		if ok || ctx.Err() == nil {
			rotations++
		}
	}
	return rotations, served, nil
}

// servedSerial is the serial /status names for the bench certificate.
func servedSerial(ctx context.Context, status string) (string, error) {
	code, body, err := getHTTP(ctx, "http://"+status+"/status")
	if err != nil {
		return "", err
	}
	if code != 200 {
		return "", fmt.Errorf("/status answered %d", code)
	}
	var rep struct {
		Certificates []struct{ Name, Serial string }
	}
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		return "", err
	}
	for _, c := range rep.Certificates {
		if c.Name == "bench" {
			return c.Serial, nil
		}
	}
	return "", errors.New("/status lists no certificate bench")
}
