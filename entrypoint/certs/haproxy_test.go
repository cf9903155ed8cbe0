package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// These tests run the real HAProxy: what the runtime API accepts and what
// a client is served is HAProxy's to decide.

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// writeAtomic replaces path as deployment tools do: a new file renamed
// over the old one.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startHAProxy runs HAProxy in master-worker mode with an HTTPS frontend
// on crtList, and returns its address and master CLI.
func startHAProxy(t *testing.T, crtList string) (string, *haproxy.MasterCLI) {
	t.Helper()
	bin := testenv.HAProxy(t)
	dir := t.TempDir()
	addr := testenv.Addr(testenv.FreePort(t))
	cfg := `global
    log stderr format raw local0 notice
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
frontend https
    bind ` + addr + ` ssl crt-list ` + crtList + ` alpn h2,http/1.1
    http-request return status 200 content-type text/plain string "ok"
`
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "master.sock")
	cmd := exec.Command(bin, "-W", "-db", "-S", sock, "-f", path)
	var out logBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("HAProxy's output:\n%s", out.String())
		}
	})
	cli := haproxy.NewMasterCLI(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.WaitWorkerReady(ctx); err != nil {
		t.Fatalf("HAProxy did not start: %v\n%s", err, out.String())
	}
	return addr, cli
}

// served does one TLS handshake with sni and returns the leaf's serial and
// the protocol ALPN chose.
func served(addr, sni string) (*big.Int, string, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	st := c.ConnectionState()
	return st.PeerCertificates[0].SerialNumber, st.NegotiatedProtocol, nil
}

func mustServe(t *testing.T, addr, sni string) *big.Int {
	t.Helper()
	s, _, err := served(addr, sni)
	if err != nil {
		t.Fatalf("handshake for %s: %v", sni, err)
	}
	return s
}

func serial(t *testing.T, bundle []byte) *big.Int {
	t.Helper()
	c, err := Check(bundle, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c.Serial
}

func TestCertificatesChangeOverTheRuntimeAPIWithoutAReload(t *testing.T) {
	ca := newCA(t)
	src := t.TempDir()
	state := filepath.Join(t.TempDir(), "certs")
	aPEM := ca.bundle(t, "a.example")
	writeAtomic(t, filepath.Join(src, "a.pem"), aPEM)
	bLeaf, bKey := ca.leaf(t, []string{"b.example"}, time.Now().Add(-time.Hour), time.Now().Add(365*24*time.Hour))
	writeAtomic(t, filepath.Join(src, "b.crt"), join(certPEM(bLeaf), certPEM(ca.inter)))
	writeAtomic(t, filepath.Join(src, "b.key"), keyPEM(t, bKey))

	var logs logBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	d := NewDir(src, time.Hour, nil, log)
	set, problems, err := d.Scan()
	if err != nil || len(problems) > 0 || len(set.Certs) != 2 {
		t.Fatalf("Scan = %d certificates, problems %v, %v", len(set.Certs), problems, err)
	}
	var reloads atomic.Int32
	var cliRef atomic.Pointer[haproxy.MasterCLI]
	inst, err := NewInstaller(InstallerOptions{Dir: state, CLI: cliFunc(func(ctx context.Context, cmd string) (string, error) {
		return cliRef.Load().Do(ctx, cmd)
	}), Reload: func(reason string) { reloads.Add(1); t.Errorf("reload asked for: %s", reason) }, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(set); err != nil {
		t.Fatal(err)
	}
	addr, cli := startHAProxy(t, inst.CrtList())
	cliRef.Store(cli)

	// SNI picks each host's certificate, ALPN offers HTTP/2, and a name
	// no certificate has gets the self-signed default.
	if got := mustServe(t, addr, "a.example"); got.Cmp(serial(t, aPEM)) != 0 {
		t.Fatalf("a.example served serial %x", got)
	}
	if got := mustServe(t, addr, "b.example"); got.Cmp(bLeaf.SerialNumber) != 0 {
		t.Fatalf("b.example served serial %x", got)
	}
	if _, proto, _ := served(addr, "a.example"); proto != "h2" {
		t.Fatalf("ALPN chose %q, want h2", proto)
	}
	if got := mustServe(t, addr, "unknown.example"); got.Cmp(inst.def.Serial) != 0 {
		t.Fatalf("an unknown name was served serial %x, not the default certificate's", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Set)
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx, ch) })
	wg.Go(func() { inst.Run(ctx, ch) })
	defer func() { cancel(); wg.Wait() }()
	before, err := cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	// Replaced on disk: the new serial is served, and handshakes during
	// the swap all succeed.
	a2 := ca.bundle(t, "a.example")
	var handshakes, failures atomic.Int32
	var firstErr atomic.Value
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := served(addr, "a.example"); err != nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			handshakes.Add(1)
		}
	})
	swapped := time.Now()
	writeAtomic(t, filepath.Join(src, "a.pem"), a2)
	testenv.Eventually(t, 10*time.Second, "the replaced certificate is served", func() bool {
		s, _, err := served(addr, "a.example")
		return err == nil && s.Cmp(serial(t, a2)) == 0
	})
	t.Logf("the replaced certificate was served %s after the file was renamed into place", time.Since(swapped).Round(time.Millisecond))
	// A bounded number of handshakes after the swap too.
	after := handshakes.Load() + 50
	testenv.Eventually(t, 10*time.Second, "handshakes go on", func() bool { return handshakes.Load() >= after })
	close(stop)
	load.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d handshakes failed during the swap; first: %v", n, handshakes.Load(), firstErr.Load())
	}
	t.Logf("%d handshakes during the swap, none failed", handshakes.Load())

	// A mismatched key and an expired certificate are refused, naming the
	// file; the last good ones keep serving.
	_, otherKey := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	a3Leaf, _ := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	writeAtomic(t, filepath.Join(src, "a.pem"), join(certPEM(a3Leaf), keyPEM(t, otherKey)))
	expLeaf, expKey := ca.leaf(t, []string{"b.example"}, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	writeAtomic(t, filepath.Join(src, "b.key"), keyPEM(t, expKey))
	writeAtomic(t, filepath.Join(src, "b.crt"), certPEM(expLeaf))
	testenv.Eventually(t, 10*time.Second, "both refusals are logged", func() bool {
		l := logs.String()
		return strings.Contains(l, filepath.Join(src, "a.pem")) && strings.Contains(l, "does not match") &&
			strings.Contains(l, filepath.Join(src, "b.crt")) && strings.Contains(l, "expired on")
	})
	if got := mustServe(t, addr, "a.example"); got.Cmp(serial(t, a2)) != 0 {
		t.Fatalf("after a bad replacement a.example serves %x, not its last good certificate", got)
	}
	if got := mustServe(t, addr, "b.example"); got.Cmp(bLeaf.SerialNumber) != 0 {
		t.Fatalf("after an expired replacement b.example serves %x, not its last good certificate", got)
	}

	// Added, then removed: served, then the default again.
	cPEM := ca.bundle(t, "c.example", "*.c.example")
	writeAtomic(t, filepath.Join(src, "c.pem"), cPEM)
	testenv.Eventually(t, 10*time.Second, "the added certificate is served", func() bool {
		s, _, err := served(addr, "x.c.example")
		return err == nil && s.Cmp(serial(t, cPEM)) == 0
	})
	if err := os.Remove(filepath.Join(src, "c.pem")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the removed certificate is no longer served", func() bool {
		s, _, err := served(addr, "c.example")
		return err == nil && s.Cmp(inst.def.Serial) == 0
	})

	now, err := cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if now.Master.Reloads != before.Master.Reloads || len(now.Workers) != 1 || now.Workers[0].Pid != before.Workers[0].Pid {
		t.Fatalf("HAProxy reloaded: before %+v, after %+v", before, now)
	}

	// The files match what runs: a reload serves the same certificates.
	cancel()
	wg.Wait()
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	if res, err := cli.Reload(rctx); err != nil || !res.OK {
		t.Fatalf("reload: %+v, %v", res, err)
	}
	for sni, want := range map[string]*big.Int{"a.example": serial(t, a2), "b.example": bLeaf.SerialNumber, "c.example": inst.def.Serial} {
		if got := mustServe(t, addr, sni); got.Cmp(want) != 0 {
			t.Errorf("after a reload %s serves %x, want %x", sni, got, want)
		}
	}
}

type cliFunc func(ctx context.Context, cmd string) (string, error)

func (f cliFunc) Do(ctx context.Context, cmd string) (string, error) { return f(ctx, cmd) }
