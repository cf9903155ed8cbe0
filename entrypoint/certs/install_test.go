package certs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestARuntimeFailureFallsBackToAReloadWithTheFilesWritten(t *testing.T) {
	masterWait = 50 * time.Millisecond // no master answers here
	defer func() { masterWait = 10 * time.Second }()
	ca := newCA(t)
	state := filepath.Join(t.TempDir(), "certs")
	var reasons []string
	var sent []string
	inst, err := NewInstaller(InstallerOptions{Dir: state,
		CLI: cliFunc(func(_ context.Context, cmd string) (string, error) {
			if cmd != "show proc" {
				sent = append(sent, cmd)
			}
			return "", errors.New("master CLI: connection refused")
		}),
		Reload: func(reason string) { reasons = append(reasons, reason) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(Set{}); err != nil {
		t.Fatal(err)
	}
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	err = inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, File: "/src/a.pem", Cert: c}}})
	if err == nil || len(reasons) != 1 {
		t.Fatalf("Install = %v, reloads asked %v: want an error and one reload", err, reasons)
	}
	if len(sent) == 0 || !strings.HasPrefix(sent[0], "@1 new ssl cert ") {
		t.Fatalf("sent %q", sent)
	}
	// The reload loads the files: they must already hold the new set.
	list, err := os.ReadFile(inst.CrtList())
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(state, "default.pem") + "\n" + filepath.Join(state, "live", "a.pem") + "\n"
	if string(list) != want {
		t.Fatalf("crt-list = %q, want %q", list, want)
	}
	if b, err := os.ReadFile(filepath.Join(state, "live", "a.pem")); err != nil || string(b) != string(c.PEM) {
		t.Fatalf("the certificate file does not hold the bundle: %v", err)
	}
	// Removed: the file goes, the crt-list holds the default alone.
	reasons = nil
	_ = inst.Install(context.Background(), Set{})
	if _, err := os.Stat(filepath.Join(state, "live", "a.pem")); !os.IsNotExist(err) || len(reasons) != 1 {
		t.Fatalf("after removal: stat %v, reloads %v", err, reasons)
	}
}

func TestDirNamesAreSafeForACrtList(t *testing.T) {
	for _, stem := range []string{"web", "a b", "x;y", "é", strings.Repeat("l", 200)} {
		n := installName(stem)
		if !safePath.MatchString("/" + n) {
			t.Errorf("installName(%q) = %q", stem, n)
		}
	}
	if installName("a b") == installName("a_b") {
		t.Error("two names map to one file")
	}
}

// transcript answers commands with what HAProxy 2.6 answered them (recorded
// from 2.6.12), by the command's start; it records what was sent.
type transcript struct {
	answers map[string]string
	sent    []string
}

func (tr *transcript) Do(_ context.Context, cmd string) (string, error) {
	// The master's own commands: one worker, pid 2969, that has loaded.
	if ans, ok := masterAnswers(cmd, 2969); ok {
		return ans, nil
	}
	cmd = strings.TrimPrefix(cmd, "@1 ")
	tr.sent = append(tr.sent, cmd)
	for prefix, ans := range tr.answers {
		if strings.HasPrefix(cmd, prefix) {
			return ans, nil
		}
	}
	return "", errors.New("unexpected command " + cmd)
}

// masterAnswers answers the master's "show proc" (as 2.6.12 did) with one
// worker, pid, and "show version" sent to it; ok is false for other
// commands.
func masterAnswers(cmd string, pid int) (ans string, ok bool) {
	switch cmd {
	case "show proc":
		return fmt.Sprintf("#<PID>          <type>          <reloads>       <uptime>        <version>\n"+
			"2716            master          1 [failed: 0]   0d00h10m10s     2.6.12-1+deb12u4\n"+
			"# workers\n%d            worker          0               0d00h00m00s     2.6.12-1+deb12u4\n"+
			"# programs\n\n", pid), true
	case fmt.Sprintf("@!%d show version", pid):
		return "2.6.12-1+deb12u4\n", true
	}
	return "", false
}

// A reload that lands between "new ssl cert" and "add ssl crt-list" starts
// a worker that loaded the certificate from the files; one that lands
// before a removal leaves a worker that never had it. Neither is a
// failure, and neither must cost another reload.
func TestAReloadInTheMiddleOfAChangeNeedsNoOther(t *testing.T) {
	ca := newCA(t)
	state := filepath.Join(t.TempDir(), "certs")
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(state, "live", "a.pem")
	tr := &transcript{answers: installAnswers(state, true, map[string]string{
		"show ssl cert":    "Filename: " + p + "\nStatus: Used\nSerial: " + strings.ToUpper(c.Serial.Text(16)) + "\n",
		"del ssl crt-list": "Can't delete the entry: certificate '" + p + "' does not exist!\n",
		"del ssl cert":     "Can't remove the certificate: certificate '" + p + "' doesn't exist!\n",
	})}
	reloads := 0
	inst, err := NewInstaller(InstallerOptions{Dir: state, CLI: tr, Reload: func(string) { reloads++ }})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c}}}); err != nil {
		t.Fatalf("Install = %v; sent %q", err, tr.sent)
	}
	for _, cmd := range tr.sent {
		if strings.HasPrefix(cmd, "add ssl crt-list") {
			t.Fatalf("the certificate was listed already, yet added again: %q", tr.sent)
		}
	}
	if err := inst.Install(context.Background(), Set{}); err != nil || reloads != 0 {
		t.Fatalf("removal = %v, %d reloads; sent %q", err, reloads, tr.sent)
	}
}

// The master CLI's errors quote the command; the command of "set ssl cert"
// carries the private key, which must reach no log line.
func TestNoPrivateKeyInErrorsOrLogs(t *testing.T) {
	ca := newCA(t)
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	inst, err := NewInstaller(InstallerOptions{Dir: filepath.Join(t.TempDir(), "certs"),
		CLI: cliFunc(func(_ context.Context, cmd string) (string, error) {
			if ans, ok := masterAnswers(cmd, 2969); ok {
				return ans, nil
			}
			if strings.Contains(cmd, "new ssl cert") {
				return "New empty certificate store!\n", nil
			}
			// As haproxy.MasterCLI.Do words a failed write.
			return "", fmt.Errorf("master CLI %q: %w", cmd, errors.New("write unix ->master.sock: broken pipe"))
		}),
		Reload: func(string) {}, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	err = inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c}}})
	if err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("Install = %v, want the cause", err)
	}
	for what, s := range map[string]string{"error": err.Error(), "logs": logs.String()} {
		if strings.Contains(s, "PRIVATE KEY") || strings.Contains(s, "BEGIN") {
			t.Errorf("the %s carry the bundle:\n%s", what, s)
		}
	}
}

// Files that cannot be written leave everything as it was; Run tries the
// same set again until it is written.
func TestRunRetriesASetItCouldNotWrite(t *testing.T) {
	retryMin = 10 * time.Millisecond
	defer func() { retryMin = time.Second }()
	ca := newCA(t)
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "certs")
	p := filepath.Join(state, "live", "a.pem")
	list := filepath.Join(state, "crt-list")
	tr := &transcript{answers: installAnswers(state, false, map[string]string{
		"add ssl crt-list": "Inserting certificate '" + p + "' in crt-list '" + list + "'.\nSuccess!\n",
		"show ssl cert":    "Filename: " + p + "\nStatus: Used\nSerial: " + strings.ToUpper(c.Serial.Text(16)) + "\n",
	})}
	var mu sync.Mutex
	cli := cliFunc(func(ctx context.Context, cmd string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		return tr.Do(ctx, cmd)
	})
	inst, err := NewInstaller(InstallerOptions{Dir: state, CLI: cli, Reload: func(r string) { t.Errorf("reload: %s", r) }})
	if err != nil {
		t.Fatal(err)
	}
	// A file where the directory of the certificates goes.
	if err := os.WriteFile(filepath.Join(state, "live"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Set)
	done := make(chan struct{})
	go func() { defer close(done); inst.Run(ctx, ch) }()
	defer func() { cancel(); <-done }()
	ch <- Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c}}}
	sentCount := func() int { mu.Lock(); defer mu.Unlock(); return len(tr.sent) }
	if sentCount() != 0 {
		t.Fatal("runtime commands sent for files that were not written")
	}
	if err := os.Remove(filepath.Join(state, "live")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the set is written and installed", func() bool {
		_, err := os.Stat(p)
		return err == nil && sentCount() > 0
	})
}

// A stop that cancels an install half-way (the master CLI then answers
// "context canceled") is no runtime failure: asking for a reload while
// seamless shuts down would start a worker for nothing.
func TestACancelledInstallAsksForNoReload(t *testing.T) {
	ca := newCA(t)
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "certs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &transcript{answers: installAnswers(state, true, nil)}
	cli := cliFunc(func(ctx context.Context, cmd string) (string, error) {
		if strings.Contains(cmd, "show ssl cert ") {
			cancel() // the stop lands here, as in the ACME test that saw it
			<-ctx.Done()
			return "", fmt.Errorf("master CLI: %w", ctx.Err())
		}
		return tr.Do(ctx, cmd)
	})
	var reasons []string
	inst, err := NewInstaller(InstallerOptions{Dir: state, CLI: cli, Reload: func(r string) { reasons = append(reasons, r) }})
	if err != nil {
		t.Fatal(err)
	}
	err = inst.Install(ctx, Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c}}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Install = %v, want the cancellation", err)
	}
	if len(reasons) != 0 {
		t.Fatalf("a cancelled install asked for reloads: %q", reasons)
	}
}

// A SIGHUP that lands during a rotation: the reload's master re-executes
// while the commands are sent, so they fail, and a new worker, started
// after the files were written, serves the new set. TestAReloadInTheMiddle
// OfAChangeNeedsNoOther covers a worker that answers, having loaded the
// files; here the commands fail outright, which cost one more reload per
// SIGHUP (39 reloads for 26 rotations and HUPs in seamless-bench tls (c)).
// The installer sees the new worker, checks it serves the set, and
// reloads no more.
func TestAReloadThatReplacesTheWorkerMidInstallCostsNoOther(t *testing.T) {
	ca := newCA(t)
	c1, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "certs")
	p := filepath.Join(state, "live", "a.pem")
	list := filepath.Join(state, "crt-list")
	// The new worker loaded a.pem from the files: c2, listed.
	newWorker := &transcript{answers: map[string]string{
		"new ssl cert":      "Certificate '" + p + "' already exists!\n",
		"set ssl cert":      "Transaction created for certificate " + p + "!\n",
		"commit ssl cert":   "Committing " + p + "\nSuccess!\n",
		"show ssl crt-list": "# " + list + "\n" + filepath.Join(state, "default.pem") + "\n" + p + "\n",
		"show ssl cert":     "Filename: " + p + "\nStatus: Used\nSerial: " + strings.ToUpper(c2.Serial.Text(16)) + "\n",
	}}
	var (
		mu       sync.Mutex
		pid      = 100
		reloaded bool
		sent     []string
	)
	cli := cliFunc(func(ctx context.Context, cmd string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if ans, ok := masterAnswers(cmd, pid); ok {
			return ans, nil
		}
		if !reloaded {
			if strings.HasPrefix(cmd, "@1 set ssl cert") {
				// The HUP: the master re-executes under this command.
				reloaded, pid = true, 200
				return "", errors.New("master CLI: read unix ->master.sock: connection reset by peer")
			}
			return "Transaction created for certificate " + p + "!\n", nil
		}
		sent = append(sent, strings.TrimPrefix(cmd, "@1 "))
		return newWorker.Do(ctx, cmd)
	})
	var reasons []string
	var logs logBuffer
	inst, err := NewInstaller(InstallerOptions{Dir: state, CLI: cli, Reload: func(r string) { reasons = append(reasons, r) },
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c1}}}); err != nil {
		t.Fatal(err)
	}
	err = inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c2}}})
	if err != nil || len(reasons) != 0 {
		t.Fatalf("Install = %v, reloads asked %q: want neither", err, reasons)
	}
	if !slices.ContainsFunc(sent, func(s string) bool { return strings.HasPrefix(s, "show ssl cert ") }) {
		t.Fatalf("the new worker's certificate was not verified; sent to it %q", sent)
	}
	if !strings.Contains(logs.String(), "a reload replaced HAProxy's worker during the certificate install") {
		t.Fatalf("not logged:\n%s", logs.String())
	}
	// The new worker serving an older serial is a failure: then a reload.
	newWorker.answers["show ssl cert"] = "Filename: " + p + "\nStatus: Used\nSerial: " + strings.ToUpper(c1.Serial.Text(16)) + "\n"
	mu.Lock()
	reloaded, pid = false, 100
	mu.Unlock()
	c3, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c3}}}); err == nil || len(reasons) != 1 {
		t.Fatalf("Install = %v, reloads asked %q: want an error and a reload", err, reasons)
	}
}

// A rotation that starts while a SIGHUP's reload is in flight: the master
// re-executes (its CLI refuses connections), then a new worker loads. The
// install waits for it rather than failing into one more reload.
func TestAnInstallDuringAReloadWaitsForTheNewWorker(t *testing.T) {
	ca := newCA(t)
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "certs")
	p := filepath.Join(state, "live", "a.pem")
	tr := &transcript{answers: installAnswers(state, false, map[string]string{
		"add ssl crt-list": "Inserting certificate '" + p + "' in crt-list '" + filepath.Join(state, "crt-list") + "'.\nSuccess!\n",
		"show ssl cert":    "Filename: " + p + "\nStatus: Used\nSerial: " + strings.ToUpper(c.Serial.Text(16)) + "\n",
	})}
	refusals := 0
	cli := cliFunc(func(ctx context.Context, cmd string) (string, error) {
		if refusals < 5 { // the master re-executes
			refusals++
			return "", errors.New("master CLI: dial unix master.sock: connect: connection refused")
		}
		return tr.Do(ctx, cmd)
	})
	var reasons []string
	inst, err := NewInstaller(InstallerOptions{Dir: state, CLI: cli, Reload: func(r string) { reasons = append(reasons, r) }})
	if err != nil {
		t.Fatal(err)
	}
	err = inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, Cert: c}}})
	if err != nil || len(reasons) != 0 {
		t.Fatalf("Install = %v, reloads asked %q: want neither", err, reasons)
	}
}

// installAnswers is what HAProxy answers to an install of state's live
// a.pem: a new store, its transaction and commit, and the crt-list with
// the default certificate (and a.pem when listed); more, or other,
// answers override these.
func installAnswers(state string, listed bool, more map[string]string) map[string]string {
	p := filepath.Join(state, "live", "a.pem")
	crtList := "# " + filepath.Join(state, "crt-list") + "\n" + filepath.Join(state, "default.pem") + "\n"
	if listed {
		crtList += p + "\n"
	}
	a := map[string]string{
		"new ssl cert":      "New empty certificate store '" + p + "'!\n",
		"set ssl cert":      "Transaction created for certificate " + p + "!\n",
		"commit ssl cert":   "Committing " + p + "\nSuccess!\n",
		"show ssl crt-list": crtList,
	}
	maps.Copy(a, more)
	return a
}
