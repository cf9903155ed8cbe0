package routes

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// hasCheck reports whether a configuration puts a health check on a
// server (a "check" keyword on a default-server or server line).
func hasCheck(cfg []byte) bool {
	return regexp.MustCompile(`(?m)^\s*(default-)?server .*\bcheck\b`).Match(cfg)
}

// SEAMLESS_HEALTH_CHECKS=false: the built-in configuration checks no
// server, free slots included, and says so to the applier; the default
// checks every one.
func TestWithoutHealthChecksNoServerIsChecked(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	checked := render(t, mustNew(t, slotOpts(&now)), catalog(webs(2)...))
	if !hasCheck(checked.Config) || checked.NoHealthChecks {
		t.Fatalf("the default rendering: check %v, NoHealthChecks %v; want checks on every server", hasCheck(checked.Config), checked.NoHealthChecks)
	}
	o := slotOpts(&now)
	o.NoHealthChecks = true
	out := render(t, mustNew(t, o), catalog(webs(2)...))
	golden(t, "slots-unchecked.cfg", out.Config)
	haproxyCheck(t, out.Config)
	if hasCheck(out.Config) {
		t.Errorf("a server is checked:\n%s", out.Config)
	}
	if !out.NoHealthChecks {
		t.Error("the rendering does not tell the applier that its servers have no check")
	}
	if got, want := slotStates(out), "s1=web1:ready s2=web2:ready s3=:maint s4=:maint "; got != want {
		t.Errorf("slots %s, want %s", got, want)
	}
}

// Without checks, servers cost HAProxy no file descriptor: 100 backends ×
// 16 slots that the estimate refuses under a limit of 1000 with checks fit
// in 226 without, HAProxy 2.6 asks no more than that, starts and serves
// under it, and refuses to start the checked configuration there.
func TestWithoutHealthChecksServersNeedNoFileDescriptors(t *testing.T) {
	var insts []model.Instance
	for s := range 100 {
		insts = append(insts, inst(fmt.Sprintf("svc%02d", s), "i1", fmt.Sprintf("10.0.%d.1", s), 8080,
			fmt.Sprintf("seamless.http.host=svc%02d.example", s)))
	}
	ports := testenv.FreePorts(t, 2)
	on := Options{HTTPBind: testenv.Addr(ports[0]), StatsBind: testenv.Addr(ports[1]), Slots: 16}
	off := on
	off.NoHealthChecks = true

	withFDLimit(t, 1000)
	_, err := mustNew(t, on).Render(catalog(insts...))
	var fe *FDError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "SEAMLESS_HEALTH_CHECKS=false") {
		t.Fatalf("checked, under 1000: err = %v, want an *FDError that names SEAMLESS_HEALTH_CHECKS=false", err)
	}
	// 2 listeners and HAProxy's own share: 226.
	const need = 2 + fdsFixed + fdsSpare
	withFDLimit(t, need)
	unchecked := render(t, mustNew(t, off), catalog(insts...))
	withFDLimit(t, need-1)
	_, err = mustNew(t, off).Render(catalog(insts...))
	if !errors.As(err, &fe) || fe.Need != need || fe.Servers != 0 {
		t.Fatalf("unchecked, under %d: err = %v, want an *FDError needing %d for no server", need-1, err, need)
	}
	if strings.Contains(err.Error(), "SEAMLESS_HEALTH_CHECKS") {
		t.Errorf("the error suggests turning off checks that are off: %v", err)
	}
	withFDLimit(t, 1<<20)
	checkedCfg := render(t, mustNew(t, on), catalog(insts...)).Config

	// HAProxy's own count.
	path := writeConfig(t, unchecked.Config)
	out, _ := haproxyUnder(t, 100, path).CombinedOutput()
	m := regexp.MustCompile(`Cannot raise FD limit to (\d+), limit is 100`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("HAProxy under a limit of 100 did not say what it needs:\n%s", out)
	}
	if asked, _ := strconv.ParseUint(string(m[1]), 10, 64); asked > need || need-asked > fdsSpare {
		t.Errorf("HAProxy asks %d descriptors for 1600 unchecked servers, seamless estimates %d", asked, need)
	} else {
		t.Logf("HAProxy 2.6 asks %d file descriptors for 1600 servers without checks and 2 listeners; seamless estimates %d", asked, need)
	}

	// The checked configuration cannot start under that limit...
	out, _ = haproxyUnder(t, need, writeConfig(t, checkedCfg)).CombinedOutput()
	if !bytes.Contains(out, []byte("Cannot raise FD limit")) {
		t.Errorf("the checked configuration under a limit of %d: want HAProxy to refuse it, got:\n%s", need, out)
	}
	// ...the unchecked one starts and serves: 503, no instance answers.
	servesUnder(t, need, path, on.HTTPBind)
}

// writeConfig writes cfg to a file of its own and returns its path.
func writeConfig(t *testing.T, cfg []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
