package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// runBinary runs the built seamless with extra environment.
func runBinary(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(seamlessBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), o.String(), e.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, o.String(), e.String()
}

func TestCheckCommand(t *testing.T) {
	testenv.HAProxy(t)
	s := newSite(t, startBackend(t))
	s.write(t, 1)
	code, out, errOut := runBinary(t, nil, "check", "-f", s.path)
	if code != 0 || !strings.Contains(out, "configuration is valid") {
		t.Errorf("valid config: exit %d, %q %q", code, out, errOut)
	}

	s.extraFE = "    bogus-directive\n"
	s.write(t, 2)
	code, _, errOut = runBinary(t, []string{"SEAMLESS_CONFIG=" + s.path}, "check")
	if code != exitInvalid {
		t.Errorf("invalid config: exit %d, want %d", code, exitInvalid)
	}
	if !strings.Contains(errOut, "haproxy.cfg:11]") || !strings.Contains(errOut, "bogus-directive") {
		t.Errorf("HAProxy's error lines are missing:\n%s", errOut)
	}

	code, _, _ = runBinary(t, []string{"SEAMLESS_HAPROXY_BIN=/nonexistent/haproxy"}, "check", "-f", s.path)
	if code != exitNoRun {
		t.Errorf("missing haproxy: exit %d, want %d", code, exitNoRun)
	}
}

// A bad variable stops seamless before HAProxy starts, naming the variable.
func TestBadEnvironmentExits2(t *testing.T) {
	s := newSite(t, startBackend(t))
	s.write(t, 1)
	code, _, errOut := runBinary(t, []string{"SEAMLESS_STOP_GRACE=forever"}, "haproxy", "-f", s.path)
	if code != exitUsage || !strings.Contains(errOut, "SEAMLESS_STOP_GRACE") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	if strings.Contains(errOut, "haproxy started") {
		t.Error("HAProxy was started despite the bad variable")
	}
}

func TestEnvAndHelpCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"seamless", "env"}, &out, &errOut); code != 0 {
		t.Fatalf("env: exit %d", code)
	}
	for _, v := range config.Vars() {
		if !strings.Contains(out.String(), v.Name) {
			t.Errorf("seamless env lacks %s", v.Name)
		}
	}
	out.Reset()
	if code := run(context.Background(), []string{"seamless", "frobnicate"}, &out, &errOut); code != exitUsage {
		t.Errorf("unknown command: exit %d, want %d", code, exitUsage)
	}
}

func TestVersionCommand(t *testing.T) {
	testenv.HAProxy(t)
	code, out, _ := runBinary(t, nil, "version")
	if code != 0 || !strings.Contains(out, "seamless ") || !strings.Contains(out, "HAProxy 2.") && !strings.Contains(out, "HAProxy 3.") {
		t.Errorf("exit %d, %q", code, out)
	}
}

// The README documents every variable, with its default.
func TestREADMEListsEveryVariable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range config.Vars() {
		row := fmt.Sprintf("| `%s` | %s | `%s` | %s |", v.Name, v.Type, v.Default, v.Desc)
		if !strings.Contains(string(b), row) {
			t.Errorf("README.md lacks the row (regenerate the table from 'seamless env'):\n%s", row)
		}
	}
}

// With SEAMLESS_LOG_FORMAT=json every line on stderr is JSON, HAProxy's
// included, with HAProxy's severity as the level.
func TestJSONLogs(t *testing.T) {
	testenv.HAProxy(t)
	_, s, in := serving(t, 1, startOpts{env: []string{"SEAMLESS_LOG_FORMAT=json"}})
	s.extraFE = "    bogus-directive\n"
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "refusal counted", func() bool { return in.metric(failures) == 1 })
	in.signal(syscall.SIGTERM)
	in.wait(15 * time.Second)
	var haproxyLines, reloadErrors int
	for _, line := range strings.Split(strings.TrimSpace(in.out.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		if rec["component"] == "haproxy" {
			haproxyLines++
		}
		if rec["component"] == "reload" && rec["level"] == "ERROR" {
			reloadErrors++
		}
	}
	if haproxyLines == 0 || reloadErrors != 1 {
		t.Errorf("%d HAProxy lines, %d reload errors; want some and 1", haproxyLines, reloadErrors)
	}
}

func TestHealthCommand(t *testing.T) {
	testenv.HAProxy(t)
	_, _, in := serving(t, 1, startOpts{})
	code, out, _ := runBinary(t, []string{"SEAMLESS_STATUS_ADDR=" + in.status}, "health")
	if code != 0 || !strings.HasPrefix(out, "200 ok") {
		t.Errorf("healthy: exit %d, %q", code, out)
	}
	in.signal(syscall.SIGTERM)
	in.wait(15 * time.Second)
	if code, _, _ := runBinary(t, []string{"SEAMLESS_STATUS_ADDR=" + in.status}, "health"); code != exitInvalid {
		t.Errorf("nothing listening: exit %d, want %d", code, exitInvalid)
	}
}

// A run directory too long for HAProxy's master CLI socket stops seamless
// before HAProxy starts, naming the variable: HAProxy would only say it
// cannot create the master's CLI, and exit.
func TestARunDirTooLongForTheMasterSocketExits2(t *testing.T) {
	s := newSite(t, startBackend(t))
	s.write(t, 1)
	base := t.TempDir()
	dir := filepath.Join(base, strings.Repeat("r", haproxy.MaxSocketPath-len(base)-len("//master.sock")+1))
	code, _, errOut := runBinary(t, []string{"SEAMLESS_RUN_DIR=" + dir}, "haproxy", "-f", s.path)
	if code != exitUsage || !strings.Contains(errOut, "SEAMLESS_RUN_DIR is too long") {
		t.Errorf("exit %d, want %d naming SEAMLESS_RUN_DIR; stderr:\n%s", code, exitUsage, errOut)
	}
	if strings.Contains(errOut, "haproxy started") {
		t.Error("HAProxy was started on a master socket it cannot create")
	}
}
