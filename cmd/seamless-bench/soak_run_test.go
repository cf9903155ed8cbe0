//go:build soak

package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/consulproc"
	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// TestShortSoak runs the whole soak for little more than a minute, every
// kind of churn included (a Consul restart, template edits), against the
// real seamless, HAProxy and Consul: `go test -tags soak -run TestShortSoak
// ./cmd/seamless-bench`. Not in make test: it is the soak's own check,
// for when the harness changes.
func TestShortSoak(t *testing.T) {
	testenv.HAProxy(t)
	consul := consulproc.DefaultBin()
	if _, err := os.Stat(consul); err != nil {
		t.Fatalf("consul agent: %v (make consul builds it; or set SEAMLESS_CONSUL_BIN)", err)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"seamless-bench", "soak", "-seamless", seamlessBin, "-consul", consul,
		"-duration", "75s", "-sample", "15s", "-template-every", "10s", "-consul-restarts", "1", "-settle", "90s"},
		&stdout, &stderr)
	t.Logf("report:\n%s", stdout.String())
	if code != 0 {
		t.Fatalf("exit code %d\nstderr (last part):\n%s", code, lastBytes(stderr.String(), 4000))
	}
	out := stdout.String()
	// Edits at 10, 20, ..., 70 s.
	for _, want := range []string{"consul restart 1", "template edit + HUP 7", "health flap", "file service +",
		"slope/min", "failed 0;", "final configuration equals a fresh render", "back at the start's catalog", "PASS"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Six readings (0, 15, ..., 75 s) plus the header and the slopes.
	if n := strings.Count(out, " | "); n < 8*len(soakColumns) {
		t.Errorf("the table has too few cells (%d)", n)
	}
	if pids := procfs.Mentioning(tmp); len(pids) > 0 {
		t.Errorf("processes left running: %v", pids)
	}
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
