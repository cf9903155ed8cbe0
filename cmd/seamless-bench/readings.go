package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
)

// procMemory reads VmRSS and VmHWM of pid, in bytes.
func procMemory(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = n << 10
		case "VmHWM:":
			peak = n << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	return rss, peak, nil
}

// metricSum sums the samples of name in a Prometheus text exposition whose
// labels include every pair of match. A metric that is absent sums to 0.
func metricSum(text, name string, match map[string]string) (float64, error) {
	var sum float64
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels := map[string]string{}
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return 0, fmt.Errorf("metrics: bad sample %q", line)
			}
			labels = parseLabels(rest[1:end])
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics: bad value in %q: %w", line, err)
		}
		matches := true
		for k, want := range match {
			matches = matches && labels[k] == want
		}
		if matches {
			sum += v
		}
	}
	return sum, nil
}

// clockTick is the unit of the times in /proc/PID/stat (USER_HZ), 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procCPU reads pid's CPU time from /proc: its own (utime+stime) and that
// of its children it has waited for (cutime+cstime), at clockTick
// resolution.
func procCPU(pid int) (self, children time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is parenthesised and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime, stime, cutime, cstime are 14-17.
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var t [4]int64
	for j := range t {
		if t[j], err = strconv.ParseInt(f[11+j], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return time.Duration(t[0]+t[1]) * clockTick, time.Duration(t[2]+t[3]) * clockTick, nil
}

// treeCPU sums the CPU time of pid's descendants (not pid itself), with
// what each has waited for.
func treeCPU(pid int) time.Duration {
	var sum time.Duration
	for _, p := range procfs.Descendants(pid) {
		self, children, err := procCPU(p.Pid)
		if err == nil {
			sum += self + children
		}
	}
	return sum
}

// appliesByResult reads seamless_config_applies_total by its result label.
func appliesByResult(ctx context.Context, d *discoveryRun) (map[string]float64, error) {
	code, body, err := getHTTP(ctx, "http://"+d.status+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/metrics answered %d", code)
	}
	out := map[string]float64{}
	const name = "seamless_config_applies_total{"
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), name)
		if !ok {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			continue
		}
		f := strings.Fields(rest[end+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out[parseLabels(rest[:end])["result"]] += v
	}
	return out, nil
}

// diffApplies formats after-before by result, those that moved: "reloaded 40".
func diffApplies(before, after map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if d := after[k] - before[k]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
