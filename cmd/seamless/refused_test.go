package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/template"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// badTemplate writes a directive HAProxy refuses on template line 7, which
// renders as line 4 of the configuration.
const badTemplate = `{{- /* a comment
over three lines */ -}}
global
    maxconn {{ env "MAXCONN" | or "100" }}
{{- range $i := loop 3 }}{{ end }}
defaults
    bogus-directive here
`

// refusedLocation finds HAProxy's "[file:line]" in text and returns the
// file's line, checking that the file exists.
func refusedLocation(t *testing.T, text string) (file string, line string) {
	t.Helper()
	m := regexp.MustCompile(`\[([^\]:]+):(\d+)\]`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no [file:line] in:\n%s", text)
	}
	b, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatalf("the error names %s, which cannot be read: %v\n%s", m[1], err, text)
	}
	n, _ := strconv.Atoi(m[2])
	lines := strings.Split(string(b), "\n")
	if n < 1 || n > len(lines) {
		t.Fatalf("%s has no line %d", m[1], n)
	}
	return m[1], lines[n-1]
}

// `seamless check` in discovery mode named a temporary file it had already
// deleted: the file is kept, and the template line is named too.
func TestCheckKeepsTheRefusedFileAndNamesTheTemplateLine(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "haproxy.cfg.tmpl")
	if err := os.WriteFile(tmpl, []byte(badTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runBinary(t, []string{"SEAMLESS_TEMPLATE=" + tmpl, "SEAMLESS_STATE_DIR=" + dir}, "check")
	if code != exitInvalid {
		t.Fatalf("exit %d, want %d:\n%s", code, exitInvalid, errOut)
	}
	file, line := refusedLocation(t, errOut)
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(file)) })
	if !strings.Contains(line, "bogus-directive") {
		t.Errorf("the line named in %s is %q", file, line)
	}
	if !strings.Contains(errOut, "(template "+tmpl+":7)") {
		t.Errorf("the template line is not named:\n%s", errOut)
	}
}

// In discovery mode, a refused candidate is kept as haproxy.cfg.refused
// (the candidate itself is overwritten by the next rendering) and the
// error, which /status and the log show, names it and the template line.
func TestRefusedCandidateIsKeptBesideTheRenderedFile(t *testing.T) {
	bin := testenv.HAProxy(t)
	dir := t.TempDir()
	tmplPath := filepath.Join(dir, "haproxy.cfg.tmpl")
	if err := os.WriteFile(tmplPath, []byte(badTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := template.Parse(tmplPath, template.Options{LookupEnv: func(string) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	rend, err := tmpl.Render(model.NewState(nil))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "haproxy.cfg")
	cand := path + ".new"
	if err := os.WriteFile(cand, rend.Config, 0o640); err != nil {
		t.Fatal(err)
	}
	rp, stop := startReaper(nil)
	defer stop()
	v := &haproxy.Validator{Bin: bin, Args: []string{"-c", "-f", path}, Run: rp.Output}
	cur := &currentTemplate{}
	cur.set(tmpl)
	err = keepRefused(candidateValidator(v, path), path, cur, slog.New(slog.DiscardHandler))(context.Background(), cand)
	var ce *haproxy.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want a *haproxy.ConfigError", err)
	}
	// The next rendering replaces the candidate.
	if err := os.WriteFile(cand, []byte("global\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	file, line := refusedLocation(t, err.Error())
	if file != path+".refused" || !strings.Contains(line, "bogus-directive") {
		t.Errorf("the error names %s, line %q; want %s.refused and the bogus line", file, line, path)
	}
	if !strings.Contains(err.Error(), "(template "+tmplPath+":7)") {
		t.Errorf("the template line is not named: %v", err)
	}
}

// The daemon: a template edited into something HAProxy refuses, on SIGHUP.
// The log names haproxy.cfg.refused, which holds the refused line, and the
// template line; the last good configuration keeps serving.
func TestDiscoveryKeepsTheRefusedConfiguration(t *testing.T) {
	testenv.HAProxy(t)
	addr := testenv.Addr(testenv.FreePort(t))
	tmpl := filepath.Join(t.TempDir(), "haproxy.cfg.tmpl")
	state := filepath.Join(t.TempDir(), "state")
	const base = `defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend www
    bind %s
{{- range $i := loop 2 }}
{{- end }}
%s    http-request return status 200 content-type text/plain string "%s"
`
	writeAtomic(t, tmpl, fmt.Sprintf(base, addr, "", "v1"))
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_TEMPLATE=" + tmpl,
		"SEAMLESS_STATE_DIR=" + state, "SEAMLESS_DISCOVERY_TIMEOUT=1s"}})
	get := func() string { _, body := testenv.Get("http://" + addr + "/"); return body }
	testenv.Eventually(t, 20*time.Second, "v1 serves", func() bool { return get() == "v1" })

	writeAtomic(t, tmpl, fmt.Sprintf(base, addr, "    bogus-directive here\n", "v2"))
	in.signal(syscall.SIGHUP)
	kept := filepath.Join(state, "haproxy.cfg.refused")
	// The metric counts the refusal just before the log line says it.
	testenv.Eventually(t, 30*time.Second, "the refusal logged", func() bool {
		return in.metric("seamless_config_errors_total") > 0 && strings.Contains(in.out.String(), "new configuration refused")
	})
	log := in.out.String()
	// Line 10 of the template is line 8 of the rendered file.
	i := strings.Index(log, "["+kept+":8] (template "+tmpl+":10)")
	if i < 0 {
		t.Fatalf("the refusal does not name %s:8 and the template line:\n%s", kept, log)
	}
	if _, line := refusedLocation(t, log[i:]); !strings.Contains(line, "bogus-directive") {
		t.Errorf("line 8 of %s is %q", kept, line)
	}
	if v := get(); v != "v1" {
		t.Errorf("serving %q, want v1", v)
	}
}
