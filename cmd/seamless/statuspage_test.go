package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/status"
)

func sha(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// The provider against a real seamless and HAProxy: the processes are the
// ones `show proc` lists, the file is the one HAProxy loaded.
func TestStatusProviderReadsTheRunningHAProxy(t *testing.T) {
	_, s, in := serving(t, 1, startOpts{})
	want := in.showProc()
	r := statusProvider(nil, in.cli(), []string{s.path}, nil, nil)(context.Background())

	if r.Mode != status.ModeDropIn || r.Version != version || len(r.Sources) != 0 || len(r.Applies) != 0 {
		t.Errorf("drop-in report: mode %q version %q sources %v applies %v", r.Mode, r.Version, r.Sources, r.Applies)
	}
	h := r.HAProxy
	if h.Error != "" || h.Master == nil {
		t.Fatalf("no processes: %+v", h)
	}
	if h.Master.Pid != want.Master.Pid || h.Version == "" || h.Version != want.Master.Version {
		t.Errorf("master %+v version %q, show proc says %+v", *h.Master, h.Version, want.Master)
	}
	var pids []int
	for _, w := range h.Workers {
		pids = append(pids, w.Pid)
	}
	if len(pids) == 0 || !slices.Equal(pids, []int{want.Workers[0].Pid}) {
		t.Errorf("workers %v, show proc says %+v", pids, want.Workers)
	}
	if len(r.ConfigFiles) != 1 || r.ConfigFiles[0].Path != s.path || r.ConfigFiles[0].SHA256 != sha(t, s.path) {
		t.Errorf("config files %+v, want %s with sha256 %s", r.ConfigFiles, s.path, sha(t, s.path))
	}

	// After a reload the worker that served before is old or gone, and
	// the counts moved.
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := in.cli().WaitShowProc(ctx, func(p haproxy.Procs) bool {
		return len(p.Workers) == 1 && p.Workers[0].Pid != want.Workers[0].Pid
	}); err != nil {
		t.Fatal(err)
	}
	r = statusProvider(nil, in.cli(), []string{s.path}, nil, nil)(context.Background())
	if len(r.HAProxy.Workers) != 1 || r.HAProxy.Workers[0].Pid == want.Workers[0].Pid || r.HAProxy.Master.Reloads < 1 {
		t.Errorf("after a reload: %+v", r.HAProxy)
	}
	if r.ConfigFiles[0].SHA256 != sha(t, s.path) {
		t.Error("the digest is not the new file's")
	}
}

func TestStatusProviderReportsAMasterCLIThatFails(t *testing.T) {
	dir := t.TempDir()
	hung := filepath.Join(dir, "hung.sock")
	ln, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Accepts and never answers, as a master stuck in a reload might.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, tc := range []struct {
		name, socket string
		want         []string // one of them
	}{
		{"no master", filepath.Join(dir, "absent.sock"), []string{"no such file"}},
		// The socket's deadline or the context's, whichever is seen first.
		{"a master that does not answer", hung, []string{"i/o timeout", "deadline exceeded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &statusPage{procs: haproxy.NewMasterCLI(tc.socket), files: []string{filepath.Join(dir, "gone.cfg")},
				now: time.Now, timeout: 200 * time.Millisecond}
			r := p.report(context.Background())
			if r.HAProxy.Master != nil || !slices.ContainsFunc(tc.want, func(w string) bool { return strings.Contains(r.HAProxy.Error, w) }) {
				t.Errorf("haproxy: %+v, want an error with one of %q", r.HAProxy, tc.want)
			}
			if len(r.ConfigFiles) != 1 || !strings.Contains(r.ConfigFiles[0].Error, "no such file") {
				t.Errorf("a missing file: %+v", r.ConfigFiles)
			}
		})
	}
}

type fakeApplier struct {
	sts  []model.SourceStatus
	hist []apply.Record
}

func (f fakeApplier) Statuses() []model.SourceStatus { return f.sts }
func (f fakeApplier) History() []apply.Record        { return f.hist }
func (f fakeApplier) Running() apply.Running         { return apply.Running{} }

type fakeProcs struct{}

func (fakeProcs) ShowProc(context.Context) (haproxy.Procs, error) {
	return haproxy.Procs{}, errors.New("not asked in this test")
}

func TestStatusProviderInDiscoveryMode(t *testing.T) {
	t0 := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	a := fakeApplier{
		sts: []model.SourceStatus{{Name: "consul", Up: false, LastSuccess: t0, LastError: "connection refused", LastErrorAt: t0.Add(time.Minute)}},
		hist: []apply.Record{ // newest last, as apply keeps them
			{Time: t0, Reason: "consul", Change: "web: +1 instance", How: metrics.Runtime, Duration: 1500 * time.Microsecond},
			{Time: t0.Add(time.Minute), Reason: "SIGHUP", How: metrics.Refused, Duration: 2 * time.Second, Error: "template: bad"},
		},
	}
	dir := t.TempDir()
	for _, f := range []string{"b.cfg", "a.cfg", ".hidden.cfg", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.cfg"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &statusPage{applier: a, procs: fakeProcs{}, files: []string{dir}, now: func() time.Time { return t0 }, timeout: time.Second}
	r := p.report(context.Background())

	if r.Mode != status.ModeDiscovery || !r.Time.Equal(t0) {
		t.Errorf("mode %q time %v", r.Mode, r.Time)
	}
	if want := []status.Source{{Name: "consul", LastSuccess: t0, LastError: "connection refused", LastErrorAt: t0.Add(time.Minute)}}; !slices.Equal(r.Sources, want) {
		t.Errorf("sources %+v\nwant %+v", r.Sources, want)
	}
	want := []status.Apply{
		{Time: t0.Add(time.Minute), Reason: "SIGHUP", How: metrics.Refused, DurationSeconds: 2, Error: "template: bad"},
		{Time: t0, Reason: "consul", Change: "web: +1 instance", How: metrics.Runtime, DurationSeconds: 0.0015},
	}
	if !slices.Equal(r.Applies, want) {
		t.Errorf("applies (newest first) %+v\nwant %+v", r.Applies, want)
	}
	var names []string
	for _, f := range r.ConfigFiles {
		names = append(names, filepath.Base(f.Path))
		if f.Error != "" || f.SHA256 != sha(t, f.Path) || f.Size != int64(len(filepath.Base(f.Path))) {
			t.Errorf("config file %+v", f)
		}
	}
	if !slices.Equal(names, []string{"a.cfg", "b.cfg"}) {
		t.Errorf("a directory stands for %v, want its .cfg files in order as HAProxy loads them", names)
	}
}

// A FIFO in the configuration's place is reported, not waited on: opening
// it for reading would block until a writer comes.
func TestConfigFilesDoNotBlockOnAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan []status.ConfigFile, 1)
	go func() { done <- configFiles([]string{path}) }()
	select {
	case fs := <-done:
		if len(fs) != 1 || !strings.Contains(fs[0].Error, "not a regular file") {
			t.Errorf("a FIFO: %+v", fs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading the configuration files blocks on a FIFO")
	}
}

// In discovery mode the rendered file is what runs, also after a change
// applied over the runtime API, which rewrites it without a reload: it is
// never flagged as differing.
func TestTheRenderedFileIsWhatRuns(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte("v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := newReloadLog([]string{path}, false)
	if err := os.WriteFile(path, []byte("v2, over the runtime API\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		applier applierView
		differs bool
	}{
		{"drop-in: an edit not reloaded differs", nil, true},
		{"discovery: the file is what runs", fakeApplier{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &statusPage{applier: tc.applier, procs: fakeProcs{}, reloads: log, files: []string{path}, now: time.Now, timeout: time.Second}
			f := p.report(context.Background()).ConfigFiles[0]
			if differs := f.DiffersReason != "" || f.RunningSHA256 != f.SHA256; differs != tc.differs {
				t.Errorf("%+v: differs %v, want %v", f, differs, tc.differs)
			}
		})
	}
}

// A reload reads the files it checks for /status in drop-in mode only: in
// discovery mode the rendered file is what runs, and reading and hashing
// it once more at each reload was a share of every change's cost. In
// both, what the reloader says HAProxy loaded reaches the checker.
func TestOnlyADropInReloadReadsTheFilesForStatus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte("v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, discovery := range []bool{false, true} {
		l := newReloadLog([]string{path}, discovery)
		reads := 0
		l.read = func(paths []string) []status.ConfigFile { reads++; return configFiles(paths) }
		inner := &loadedChecker{}
		check := l.checker(inner)
		if err := check.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		want := 1
		if discovery {
			want = 0
		}
		if reads != want || inner.checks != 1 {
			t.Errorf("discovery %v: the files read %d times at a check, want %d; checked %d times, want 1", discovery, reads, want, inner.checks)
		}
		check.Loaded(true)
		if !slices.Equal(inner.loaded, []bool{true}) {
			t.Errorf("discovery %v: the checker was told %v, want [true]", discovery, inner.loaded)
		}
	}
}

// loadedChecker counts checks and records what it is told was loaded, as
// the validator's bind guard learns it.
type loadedChecker struct {
	checks int
	loaded []bool
}

func (c *loadedChecker) Check(context.Context) error { c.checks++; return nil }
func (c *loadedChecker) Loaded(certain bool)         { c.loaded = append(c.loaded, certain) }

// A FIFO swapped in for a config file, given as a file or found in a
// directory, is named on the page without being opened: opening it would
// block the request until a writer comes.
func TestStatusProviderNamesAFIFOWithoutOpeningIt(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "haproxy.cfg")
	confd := filepath.Join(dir, "conf.d")
	if err := os.Mkdir(confd, 0o755); err != nil {
		t.Fatal(err)
	}
	entry, after := filepath.Join(confd, "a.cfg"), filepath.Join(confd, "b.cfg")
	for _, p := range []string{pipe, entry} {
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(after, []byte("global\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &statusPage{procs: fakeProcs{}, files: []string{pipe, confd}, now: time.Now, timeout: time.Second}
	done := make(chan status.Report, 1)
	go func() { done <- p.report(context.Background()) }()
	var r status.Report
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the report blocks on a FIFO")
	}
	if len(r.ConfigFiles) != 3 {
		t.Fatalf("config files %+v, want the two FIFOs and %s", r.ConfigFiles, after)
	}
	for i, want := range []string{pipe, entry} {
		if f := r.ConfigFiles[i]; f.Path != want || !strings.Contains(f.Error, "a FIFO") || f.SHA256 != "" {
			t.Errorf("entry %d: %+v, want %s named as a FIFO", i, f, want)
		}
	}
	if f := r.ConfigFiles[2]; f.Path != after || f.SHA256 != sha(t, after) {
		t.Errorf("the file after the FIFO: %+v", f)
	}
}
