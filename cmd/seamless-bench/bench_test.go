package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// seamlessBin is the real seamless, built once for scenario a.
var seamlessBin string

func TestMain(m *testing.M) { testenv.RunWithSeamless(m, "../seamless", &seamlessBin) }

func TestParseReloadCounts(t *testing.T) {
	text := `# HELP seamless_reloads_total Reloads by result.
# TYPE seamless_reloads_total counter
seamless_reloads_total{result="success"} 7
seamless_reloads_total{reason="hup",result="failure"} 1
seamless_reloads_total{reason="hup",result="success"} 2 1700000000000
seamless_reloads_total_created{result="success"} 1.7e+09
seamless_reload_duration_seconds{quantile="0.5"} 0.01
`
	got, err := parseReloadCounts(text)
	if err != nil {
		t.Fatal(err)
	}
	if got["success"] != 9 || got["failure"] != 1 || len(got) != 2 {
		t.Errorf("got %v, want success 9, failure 1", got)
	}
	if got, err := parseReloadCounts("up 1\n"); err != nil || len(got) != 0 {
		t.Errorf("absent metric: got %v, %v; want empty", got, err)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond} {
		if got, _ := percentile(ds, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if _, ok := percentile(nil, 50); ok {
		t.Error("percentile of nothing reported ok")
	}
}

// TestReloadAllScenarios runs every scenario briefly against the real
// HAProxy and the real seamless.
func TestReloadAllScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("starts HAProxy")
	}
	testenv.HAProxy(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"seamless-bench", "reload", "-seamless", seamlessBin,
		"-reloads", "4", "-warmup", "2", "-interval", "10ms", "-workers", "4", "-timeout", "1m"}, &stdout, &stderr)
	t.Logf("table:\n%s", stdout.String())
	if code != 0 {
		t.Fatalf("exit code %d\nstderr:\n%s", code, stderr.String())
	}

	rows := map[string]string{}
	for line := range strings.Lines(stdout.String()) {
		cells := strings.Split(line, "|")
		if len(cells) == 8 {
			rows[strings.TrimSpace(cells[0])+"/"+strings.TrimSpace(cells[1])] = line
		}
	}
	for _, s := range allScenarios {
		for _, mode := range []string{"newconn", "keepalive"} {
			row, ok := rows[s.title+"/"+mode]
			if !ok {
				t.Errorf("no row for %s / %s", s.title, mode)
				continue
			}
			if !strings.Contains(row, "4/4") {
				t.Errorf("not every reload completed: %s", row)
			}
		}
	}
	// A hard restart closes the listener, so the load must see failures;
	// if it does not, the benchmark cannot see loss at all.
	for _, mode := range []string{"newconn", "keepalive"} {
		if !strings.Contains(stdout.String(), "d hard restart / "+mode+" failures:") {
			t.Errorf("hard restart with %s clients shows no failures", mode)
		}
	}
	// Nothing we started may outlive the run.
	if pids := procfs.Mentioning(tmp); len(pids) > 0 {
		t.Errorf("processes left running: %v", pids)
	}
	if strings.Contains(stderr.String(), "leftover") {
		t.Errorf("a scenario leaked processes that the final sweep had to kill:\n%s", stderr.String())
	}
}
