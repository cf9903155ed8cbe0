package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
)

// soakSample is one reading of seamless and its HAProxy during the soak.
type soakSample struct {
	at         time.Duration // since the churn began
	services   int           // in the world: both sources, stable included
	instances  int
	rss        int64 // seamless's VmRSS, bytes
	goroutines float64
	fds        int
	haproxy    int // live HAProxy masters and workers below seamless (not `haproxy -c`)
	zombies    int // exited processes below seamless that nobody reaped
	reloads    float64
	requests   int64 // through seamless to the stable services, so far
	failed     int64
}

// soakColumns are the columns that are fitted with a slope: what must stay
// flat over the run.
var soakColumns = []struct {
	name   string
	format string
	value  func(soakSample) float64
}{
	{"rss MiB", "%.1f", func(s soakSample) float64 { return float64(s.rss) / (1 << 20) }},
	{"goroutines", "%.0f", func(s soakSample) float64 { return s.goroutines }},
	{"fds", "%.0f", func(s soakSample) float64 { return float64(s.fds) }},
	{"haproxy procs", "%.0f", func(s soakSample) float64 { return float64(s.haproxy) }},
	{"zombies", "%.0f", func(s soakSample) float64 { return float64(s.zombies) }},
	{"failed", "%.0f", func(s soakSample) float64 { return float64(s.failed) }},
}

// sampleClient reads /metrics without keeping the connection: an idle
// one would be counted in seamless's fds and goroutines.
var sampleClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// readSample reads seamless's memory, fds and process tree from /proc and
// its goroutines and reloads from its /metrics.
func readSample(ctx context.Context, d *discoveryRun) (soakSample, error) {
	var s soakSample
	pid := d.p.pid()
	var err error
	if s.rss, _, err = procMemory(pid); err != nil {
		return s, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.fds = len(fds)
	for _, p := range procfs.Descendants(pid) {
		switch {
		case p.Zombie():
			s.zombies++
		case p.Name == "haproxy" && !checking(p.Pid):
			s.haproxy++
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.status+"/metrics", nil)
	if err != nil {
		return s, err
	}
	resp, err := sampleClient.Do(req)
	if err != nil {
		return s, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	resp.Body.Close()
	if err != nil {
		return s, err
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("/metrics answered %d", resp.StatusCode)
	}
	body := string(b)
	if s.goroutines, err = metricSum(body, "go_goroutines", nil); err != nil {
		return s, err
	}
	s.reloads, err = metricSum(body, "seamless_reloads_total", nil)
	return s, err
}

// checking reports whether pid is an `haproxy -c`, which seamless runs
// for a moment to validate a configuration: not a master or a worker.
func checking(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(b), "\x00"), "-c")
}

// slope is the least-squares slope of y over x; 0 with fewer than two
// distinct x.
func slope(x, y []float64) float64 {
	n := float64(len(x))
	if len(x) < 2 || len(x) != len(y) {
		return 0
	}
	var sx, sy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for i := range x {
		sxy += (x[i] - mx) * (y[i] - my)
		sxx += (x[i] - mx) * (x[i] - mx)
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}

// slopes fits each of soakColumns over the samples' minutes.
func slopes(samples []soakSample) []float64 {
	x := make([]float64, len(samples))
	for i, s := range samples {
		x[i] = s.at.Minutes()
	}
	out := make([]float64, len(soakColumns))
	for j, c := range soakColumns {
		y := make([]float64, len(samples))
		for i, s := range samples {
			y[i] = c.value(s)
		}
		out[j] = slope(x, y)
	}
	return out
}

// printSoakTable writes one row per sample and, under it, the slope per
// minute of each fitted column.
func printSoakTable(w io.Writer, samples []soakSample) {
	head := []string{"minute", "services", "instances", "reloads", "requests"}
	for _, c := range soakColumns {
		head = append(head, c.name)
	}
	rows := [][]string{head}
	for _, s := range samples {
		row := []string{fmt.Sprintf("%.1f", s.at.Minutes()), fmt.Sprint(s.services), fmt.Sprint(s.instances),
			fmt.Sprintf("%.0f", s.reloads), fmt.Sprint(s.requests)}
		for _, c := range soakColumns {
			row = append(row, fmt.Sprintf(c.format, c.value(s)))
		}
		rows = append(rows, row)
	}
	slopeRow := []string{"slope/min", "", "", "", ""}
	for _, v := range slopes(samples) {
		slopeRow = append(slopeRow, fmt.Sprintf("%+.2f", v))
	}
	rows = append(rows, slopeRow)
	widths := make([]int, len(head))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, cell := range row {
			cells[i] = fmt.Sprintf("%*s", widths[i], cell)
		}
		fmt.Fprintln(w, strings.Join(cells, " | "))
	}
}
