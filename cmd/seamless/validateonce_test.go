package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/reaper"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// A discovery apply validates its candidate once: the reloader's check of
// the file the candidate was renamed to does not run haproxy -c again on
// the same bytes. Any other check (a SIGHUP, other bytes) runs in full.
func TestAnAppliedCandidateIsValidatedOnce(t *testing.T) {
	bin, path, runs, run := validateRig(t)
	cfg := func(port int) []byte {
		return []byte(fmt.Sprintf(checkDefaults+"frontend fe\n    bind 127.0.0.1:%d\n", port))
	}
	if err := os.WriteFile(path, cfg(testenv.FreePort(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	v := &haproxy.Validator{Bin: bin, Args: []string{"-c", "-f", path}, Env: os.Environ(), Run: run}
	v.GuardBinds()
	validateOnce(v)
	candidate := candidateValidator(v, path)
	ctx := context.Background()

	applyOnce := func(data []byte) {
		t.Helper()
		cand := path + ".new"
		if err := apply.WriteFile(cand, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := candidate(ctx, cand); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cand, path); err != nil {
			t.Fatal(err)
		}
		if err := v.Check(ctx); err != nil { // the reloader's
			t.Fatal(err)
		}
	}
	applyOnce(cfg(testenv.FreePort(t)))
	if n := runs.Load(); n != 1 {
		t.Errorf("one apply ran haproxy -c %d times, want 1", n)
	}
	// A SIGHUP: the same bytes, checked in full.
	if err := v.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("a check of bytes no candidate passed just before ran haproxy -c %d times in all, want 2", n)
	}
	// Bytes other than the candidate's: checked in full.
	cand := path + ".new"
	if err := apply.WriteFile(cand, cfg(testenv.FreePort(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := candidate(ctx, cand); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("bogus-keyword\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(ctx); err == nil {
		t.Error("bytes other than the candidate's passed without haproxy -c")
	}
}

// vouchRig is the reloader's validator on a configuration of one
// frontend and one server, written with the server on port 8080, and
// validating once (validateOnce); cfg gives the configuration with the
// server on another port.
func vouchRig(t *testing.T) (v *haproxy.Validator, path string, runs *atomic.Int32, cfg func(server int) []byte) {
	t.Helper()
	bin, path, runs, run := validateRig(t)
	port := testenv.FreePort(t)
	cfg = func(server int) []byte {
		return fmt.Appendf(nil, checkDefaults+
			"frontend fe\n    bind 127.0.0.1:%d\n    default_backend be\nbackend be\n    server s1 127.0.0.1:%d\n", port, server)
	}
	if err := os.WriteFile(path, cfg(8080), 0o644); err != nil {
		t.Fatal(err)
	}
	v = &haproxy.Validator{Bin: bin, Args: []string{"-c", "-f", path}, Env: os.Environ(), Run: run}
	v.GuardBinds()
	validateOnce(v)
	return v, path, runs, cfg
}

// A candidate the applier vouches for (only servers moved) is not
// checked by the reloader either: no haproxy -c at all for the apply.
// The voucher passes those bytes only, and only once.
func TestAVouchedCandidateIsNotCheckedAtTheReload(t *testing.T) {
	v, path, runs, cfg := vouchRig(t)
	vouch := candidateVoucher(v, path)
	ctx := context.Background()

	// As the applier does: the file in place, vouched for there.
	if err := apply.WriteFile(path, cfg(8081), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := vouch(path, cfg(8081)); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(ctx); err != nil { // the reloader's
		t.Fatal(err)
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("a vouched apply ran haproxy -c %d times, want 0", n)
	}
	if err := v.Check(ctx); err != nil { // a SIGHUP after it: in full
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("a check after the vouched one ran haproxy -c %d times in all, want 1", n)
	}
	// Vouched bytes that are not what the reloader then reads: checked.
	if err := apply.WriteFile(path, cfg(8082), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := vouch(path, cfg(8082)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("bogus-keyword\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(ctx); err == nil {
		t.Error("bytes other than the vouched ones passed without haproxy -c")
	}
}

// The voucher vouches for the bytes the applier wrote, not for what the
// file holds by then: the applier decided those need no check, and it
// was given them rather than made to read the file back (tens of
// megabytes at 10,000 services). Anything else on disk at the reload is
// checked.
func TestAVoucherVouchesForTheBytesItIsGiven(t *testing.T) {
	v, path, runs, cfg := vouchRig(t)
	// The file was replaced between the applier's write and its vouch.
	if err := candidateVoucher(v, path)(path, cfg(8081)); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("bytes other than the vouched ones ran haproxy -c %d times, want 1", n)
	}

	// A path spelled otherwise than the one HAProxy loads: the bytes
	// handed over are not known to be that file's, so nothing is vouched
	// for (the file on disk was, before).
	other := filepath.Dir(path) + "/./" + filepath.Base(path)
	if err := candidate(v, path, path).Vouch(other, cfg(8080)); err == nil {
		t.Errorf("vouching for %s, which HAProxy does not load by that name: no error", other)
	}
	if err := v.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("after a vouch for another path, haproxy -c ran %d times in all, want 2", n)
	}
}

// A reload HAProxy refused leaves the bind guard with that candidate's
// binds as passed; a vouched reload after it must not record them as
// running, or a later candidate adding the same address would not be
// probed and its reload would fail to bind.
func TestAVouchedReloadDoesNotTakeARefusedCandidatesBinds(t *testing.T) {
	bin, path, _, run := validateRig(t)
	ports := testenv.FreePorts(t, 2)
	cfg := func(server int, extraBind bool) []byte {
		b := fmt.Appendf(nil, checkDefaults+
			"frontend fe\n    bind 127.0.0.1:%d\n", ports[0])
		if extraBind {
			b = fmt.Appendf(b, "    bind 127.0.0.1:%d\n", ports[1])
		}
		return fmt.Appendf(b, "    default_backend be\nbackend be\n    server s1 127.0.0.1:%d\n", server)
	}
	if err := os.WriteFile(path, cfg(8080, false), 0o644); err != nil {
		t.Fatal(err)
	}
	v := &haproxy.Validator{Bin: bin, Args: []string{"-c", "-f", path}, Env: os.Environ(), Run: run}
	v.GuardBinds()
	validateOnce(v)
	check, vouch := candidateValidator(v, path), candidateVoucher(v, path)
	ctx := context.Background()
	cand := path + ".new"

	// A candidate with a second bind passes, and HAProxy refuses its
	// reload: the file goes back, Loaded is not called.
	if err := apply.WriteFile(cand, cfg(8080, true), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := check(ctx, cand); err != nil {
		t.Fatal(err)
	}
	// A move, in place, vouched for there and reloaded.
	if err := apply.WriteFile(path, cfg(8081, false), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := vouch(path, cfg(8081, false)); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(ctx); err != nil {
		t.Fatal(err)
	}
	v.Loaded(true)
	// Another process takes the second address; the candidate that binds
	// it must now be refused.
	ln, err := net.Listen("tcp", testenv.Addr(ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := apply.WriteFile(cand, cfg(8081, true), 0o644); err != nil {
		t.Fatal(err)
	}
	var be *haproxy.BindError
	if err := check(ctx, cand); !errors.As(err, &be) {
		t.Errorf("a candidate binding a taken address: %v, want a *haproxy.BindError", err)
	}
}

// checkDefaults is a defaults section haproxy -c takes without warnings.
const checkDefaults = "defaults\n    mode http\n    timeout client 5s\n    timeout server 5s\n    timeout connect 5s\n"

// validateRig is what the validate-once tests share: the haproxy binary,
// the configuration's path in a directory of the test's own, and a
// runner counting its runs.
func validateRig(t *testing.T) (bin, path string, runs *atomic.Int32, run haproxy.Runner) {
	runs = new(atomic.Int32)
	return testenv.HAProxy(t), filepath.Join(t.TempDir(), "haproxy.cfg"), runs, countingRunner(runs)
}

// countingRunner runs haproxy as the reaper would, counting the runs.
func countingRunner(runs *atomic.Int32) haproxy.Runner {
	return func(ctx context.Context, argv, env []string) ([]byte, reaper.Status, error) {
		runs.Add(1)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState == nil {
			return out, reaper.Status{}, err
		}
		return out, reaper.Status{Pid: cmd.ProcessState.Pid(), Wait: cmd.ProcessState.Sys().(syscall.WaitStatus)}, nil
	}
}
