package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// TestTLSAllVariants runs the TLS benchmark briefly against the real
// HAProxy and seamless: both tables have every variant, the rotations of b
// are served with no reload, and c reloads.
func TestTLSAllVariants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts HAProxy")
	}
	testenv.HAProxy(t)
	t.Setenv("TMPDIR", t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"seamless-bench", "tls", "-seamless", seamlessBin, "-duration", "3s", "-rounds", "1", "-rotate", "500ms",
		"-warmup", "0", "-workers", "2", "-max-requests", "20000"}, &stdout, &stderr)
	t.Logf("tables:\n%s", stdout.String())
	if code != 0 {
		t.Fatalf("exit code %d\nstderr:\n%s", code, stderr.String())
	}
	// variant | rate | vs a | handshakes | failed handshakes | requests | failed requests | p50 | p99 | rotations served | took | reloads
	rows := map[string][][]string{}
	for line := range strings.Lines(stdout.String()) {
		cells := strings.Split(line, "|")
		if len(cells) != 12 || strings.TrimSpace(cells[0]) == "variant" {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		key := cells[0][:1]
		rows[key] = append(rows[key], cells)
	}
	for _, k := range []string{"a", "b", "c"} {
		if len(rows[k]) != 2 {
			t.Fatalf("variant %s: %d rows, want one per table", k, len(rows[k]))
		}
		for _, r := range rows[k] {
			if r[1] == "failed" || r[5] == "0" {
				t.Errorf("variant %s: %v: no request served", k, r)
			}
		}
	}
	if b := rows["b"][0]; b[11] != "0" || strings.HasPrefix(b[9], "0/") || b[9] == "-" {
		t.Errorf("variant b (runtime API): rotations served %s, reloads %s; want some served, 0 reloads", b[9], b[11])
	}
	if c := rows["c"][0]; c[11] == "0" {
		t.Errorf("variant c (a reload per rotation) counted no reload: %v", c)
	}
}
