package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// seamlessRun is scenario a: `seamless haproxy -f CFG` supervising HAProxy,
// reloaded by SIGHUP to seamless. Completion is read from its metrics.
type seamlessRun struct {
	env     *runEnv
	p       *proc
	status  string // 127.0.0.1:port of the status endpoint
	success float64
	other   float64 // reloads with any result but "success"
	sock    string  // HAProxy's master CLI, in seamless's run directory
	reloads int     // the master's reload counter
}

func (s *seamlessRun) start(ctx context.Context) error {
	status, err := freeAddr()
	if err != nil {
		return err
	}
	s.status = status
	runDir := filepath.Join(s.env.dir, "run")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	env := append(os.Environ(),
		"SEAMLESS_RUN_DIR="+runDir,
		"SEAMLESS_STATUS_ADDR="+status,
	)
	if s.env.haproxy != "" {
		env = append(env, "SEAMLESS_HAPROXY_BIN="+s.env.haproxy)
	}
	p, err := startProc("seamless", s.env.log, env, s.env.seamless, "haproxy", "-f", s.env.cfgPath)
	if err != nil {
		return err
	}
	s.p = p
	err = poll(ctx, 10*time.Millisecond, readyTimeout, "seamless /healthz", func() (bool, error) {
		if err := p.alive(); err != nil {
			return false, err
		}
		code, body, err := getHTTP(ctx, "http://"+s.status+"/healthz")
		if err != nil {
			return false, err
		}
		if code != http.StatusOK {
			return false, fmt.Errorf("/healthz answered %d: %.80q", code, body)
		}
		return true, nil
	})
	if err != nil {
		return s.env.withLog(err)
	}
	if err := s.env.waitServing(ctx, p.alive); err != nil {
		return err
	}
	s.success, s.other, err = s.reloadCounts(ctx)
	if err != nil {
		return s.env.withLog(err)
	}
	s.sock = filepath.Join(runDir, "master.sock")
	info, err := showProc(ctx, s.sock)
	s.reloads = info.Master.Reloads
	return s.env.withLog(err)
}

func (s *seamlessRun) reloadCounts(ctx context.Context) (success, other float64, err error) {
	return reloadCounts(ctx, s.status)
}

// reloadCounts reads seamless_reloads_total from the status endpoint at
// addr: confirmed, and every other result.
func reloadCounts(ctx context.Context, addr string) (success, other float64, err error) {
	code, body, err := getHTTP(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return 0, 0, err
	}
	if code != http.StatusOK {
		return 0, 0, fmt.Errorf("/metrics answered %d", code)
	}
	byResult, err := parseReloadCounts(body)
	if err != nil {
		return 0, 0, err
	}
	for result, n := range byResult {
		if result == "success" {
			success += n
		} else {
			other += n
		}
	}
	return success, other, nil
}

// reload times a SIGHUP with the same probe as scenario b (the master's
// reload counter), then checks, without timing it, that seamless confirmed
// the reload. Timing by polling /metrics every few milliseconds would load
// seamless's process and slow the very re-execution being measured.
func (s *seamlessRun) reload(ctx context.Context) (time.Duration, error) {
	info, lat, err := signalAndWaitReload(ctx, s.env, s.p, syscall.SIGHUP, s.sock, s.reloads)
	if err != nil {
		return 0, err
	}
	s.reloads = info.Master.Reloads
	var success, other float64
	err = poll(ctx, 20*time.Millisecond, reloadTimeout, "seamless_reloads_total", func() (bool, error) {
		if err := s.p.alive(); err != nil {
			return false, err
		}
		var err error
		success, other, err = s.reloadCounts(ctx)
		return err == nil && (success > s.success || other > s.other), err
	})
	if err != nil {
		return 0, s.env.withLog(err)
	}
	failed := other > s.other
	s.success, s.other = success, other
	if failed {
		return 0, fmt.Errorf("seamless reports a reload that did not succeed")
	}
	return lat, nil
}

func (s *seamlessRun) stop() error {
	if s.p == nil {
		return nil
	}
	return s.p.stop(syscall.SIGTERM, stopGrace)
}

// parseReloadCounts returns the samples of seamless_reloads_total in a
// Prometheus text exposition, by the value of their result label. A metric
// that is absent counts as zero.
func parseReloadCounts(text string) (map[string]float64, error) {
	const name = "seamless_reloads_total"
	out := map[string]float64{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("metrics: bad sample %q", line)
		}
		labels := parseLabels(line[len(name)+1 : end])
		// The value may be followed by a timestamp.
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: bad value in %q: %w", line, err)
		}
		out[labels["result"]] += v
	}
	return out, nil
}

// parseLabels parses `a="x",b="y"` with the exposition format's escapes.
func parseLabels(s string) map[string]string {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return labels
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					val.WriteByte('\n')
					continue
				}
			}
			val.WriteByte(s[i])
		}
		labels[key] = val.String()
		if i >= len(s) {
			return labels
		}
		s = s[i+1:]
	}
}
