package haproxy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestScanConfigAndDefaults(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bare := write("bare.cfg", "global\n    # hard-stop-after 1s is only a comment\n    maxconn 100\n")
	confd := filepath.Join(dir, "conf.d")
	if err := os.Mkdir(confd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confd, "10-global.cfg"), []byte("global\n\thard-stop-after 30s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confd, "20-defaults.cfg"), []byte("defaults\n  option idle-close-on-response\n  mworker-max-reloads 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	def := Defaults{HardStopAfter: 5 * time.Minute, MaxReloads: 50}

	have, err := ScanConfig([]string{bare})
	if err != nil {
		t.Fatal(err)
	}
	if have != (Directives{}) {
		t.Errorf("bare config: %+v, want nothing found (a comment is not a directive)", have)
	}
	got := def.File(have)
	for _, want := range []string{"global\n", "hard-stop-after 300000ms\n", "mworker-max-reloads 50\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("defaults file lacks %q:\n%s", want, got)
		}
	}

	have, err = ScanConfig([]string{bare, confd})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Directives{HardStopAfter: true, MworkerMaxReloads: true, IdleCloseOnResp: true}); have != want {
		t.Errorf("with conf.d: %+v, want %+v", have, want)
	}
	if got := def.File(have); got != "" {
		t.Errorf("nothing to add, got:\n%s", got)
	}
	if got := (Defaults{}).File(Directives{}); got != "" {
		t.Errorf("zero defaults must add nothing, got:\n%s", got)
	}
	if _, err := ScanConfig([]string{filepath.Join(dir, "missing.cfg")}); err == nil {
		t.Error("a missing file was not reported")
	}
}

// The worker's socket is declared for a path HAProxy's syntax and a Unix
// socket can take, and left out (the runtime API goes through the master)
// for any other.
func TestDefaultsDeclareTheWorkerSocket(t *testing.T) {
	ok := "/var/run/seamless/worker.sock"
	if got, want := (Defaults{WorkerSocket: ok}).File(Directives{}), "    stats socket "+ok+" mode 600 level admin\n"; !strings.Contains(got, want) {
		t.Errorf("defaults file:\n%s\nwant a line %q", got, want)
	}
	for _, bad := range []string{"/run/a b/worker.sock", "/run/a#b/worker.sock", `/run/a"b/worker.sock`, "/run/$HOME/worker.sock",
		"/" + strings.Repeat("d", 100) + "/worker.sock"} {
		if got := (Defaults{WorkerSocket: bad}).File(Directives{}); got != "" {
			t.Errorf("%q declared:\n%s", bad, got)
		}
	}
}

// The longest worker socket path declared is the longest HAProxy takes
// for a listening socket: it binds "<path>.<pid>.tmp" and renames it, so
// it refuses paths past 97 bytes, 10 short of a Unix address, and a
// declared socket it refused kept the whole configuration from loading.
func TestTheLongestWorkerSocketDeclaredIsOneHAProxyTakes(t *testing.T) {
	bin := testenv.HAProxy(t)
	base := t.TempDir()
	for _, n := range []int{MaxSocketPath, MaxSocketPath + 1} {
		// A directory whose worker.sock path is n bytes long.
		dir := filepath.Join(base, strings.Repeat("d", n-len(base)-len("//x/worker.sock")), "x")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "worker.sock")
		if len(p) != n {
			t.Fatalf("path of %d bytes, want %d", len(p), n)
		}
		body := Defaults{WorkerSocket: p}.File(Directives{})
		if declared := body != ""; declared != (n <= MaxSocketPath) {
			t.Fatalf("%d bytes: declared %v", n, declared)
		}
		// Declared or not, HAProxy must take the path seamless would.
		cfg := filepath.Join(dir, "check.cfg")
		if err := os.WriteFile(cfg, []byte("global\n    stats socket "+p+" mode 600 level admin\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput()
		if took := err == nil; took != SocketPathFits(p) {
			t.Errorf("%d bytes: HAProxy took the socket: %v, SocketPathFits: %v\n%s", n, took, SocketPathFits(p), out)
		}
	}
}
