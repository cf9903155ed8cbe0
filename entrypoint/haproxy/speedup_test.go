package haproxy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/reaper"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// Choosing the speed-up at start does not parse the user's configuration:
// with 10,000 backends that parse is seconds before HAProxy starts.
func TestTheSpeedupIsProbedWithoutTheUserConfiguration(t *testing.T) {
	bin := testenv.HAProxy(t)
	rp := startReaper(t)
	dir, cfg, cl := speedupConfig(t)
	var mu sync.Mutex
	var runs [][]string
	run := func(ctx context.Context, argv, env []string) ([]byte, reaper.Status, error) {
		mu.Lock()
		runs = append(runs, argv)
		mu.Unlock()
		return rp.Output(ctx, argv, env)
	}
	v := &Validator{Bin: bin, Args: cl.CheckArgs(), Env: os.Environ(), Run: run}
	speedup := filepath.Join(dir, "check-speedup.cfg")
	fast, err := WithSpeedup(context.Background(), v, cl, nil, speedup)
	if err != nil {
		t.Fatal(err)
	}
	if fast == v || !slices.Contains(fast.Args, speedup) || !slices.Contains(fast.Args, cfg) {
		t.Fatalf("validator args %q: want the speed-up file and the configuration", fast.Args)
	}
	for _, argv := range runs {
		if slices.Contains(argv, cfg) {
			t.Errorf("choosing the speed-up parsed the configuration: %q", argv)
		}
	}
	if len(runs) != 1 {
		t.Errorf("haproxy ran %d times to choose the speed-up, want 1", len(runs))
	}
	if err := fast.Check(context.Background()); err != nil {
		t.Errorf("the chosen validator refuses a valid configuration: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*probe*")); len(m) > 0 {
		t.Errorf("the probe's file is left behind: %q", m)
	}
}

// An HAProxy that refuses the speed-up's keyword keeps the plain validator,
// and says which keyword.
func TestAnHAProxyWithoutTheSpeedupValidatesAtFullCost(t *testing.T) {
	bin := testenv.HAProxy(t)
	rp := startReaper(t)
	dir, _, cl := speedupConfig(t)
	// A wrapper that refuses the keyword, as HAProxy before 2.5 does.
	old := filepath.Join(dir, "old-haproxy")
	script := "#!/bin/sh\nfor a; do case \"$a\" in *check-speedup.cfg) echo \"[ALERT]    (1) : config : parsing [$a:3] : unknown keyword 'httpclient.ssl.verify' in 'global' section\"; exit 1;; esac; done\nexec " + bin + " \"$@\"\n"
	if err := os.WriteFile(old, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v := &Validator{Bin: old, Args: cl.CheckArgs(), Env: os.Environ(), Run: rp.Output}
	got, err := WithSpeedup(context.Background(), v, cl, nil, filepath.Join(dir, "check-speedup.cfg"))
	if got != v {
		t.Errorf("got a validator with args %q, want the plain one", got.Args)
	}
	if err == nil || !strings.Contains(err.Error(), "httpclient.ssl.verify") {
		t.Errorf("err = %v, want one naming the refused keyword", err)
	}
	if err := got.Check(context.Background()); err != nil {
		t.Errorf("the plain validator refuses a valid configuration: %v", err)
	}
}

// speedupConfig writes a valid configuration into a new directory and
// returns the directory, the file and its command line.
func speedupConfig(t *testing.T) (dir, cfg string, cl *CommandLine) {
	t.Helper()
	dir = t.TempDir()
	cfg = filepath.Join(dir, "haproxy.cfg")
	writeConfig(t, cfg, testenv.FreePort(t), "")
	cl, err := ParseCommandLine([]string{"-f", cfg}, filepath.Join(dir, "master.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return dir, cfg, cl
}
