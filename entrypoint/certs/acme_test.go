package certs

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-acme/lego/v5/acme"
	legolog "github.com/go-acme/lego/v5/log"
	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// These tests obtain certificates from a real ACME server (Pebble) whose
// HTTP-01 validation reaches the built-in configuration's HTTP frontend on
// a real HAProxy: nothing else listens for the challenge.

// acmeRig is HAProxy running the built-in configuration for a catalog,
// with ACME and the Installer wired as cmd/seamless wires them.
type acmeRig struct {
	https, http string
	cli         *haproxy.MasterCLI
	inst        *Installer
	acme        *ACME
	metrics     *ACMEMetrics
	logs        *logBuffer
	haproxyOut  *logBuffer
	state       string
	hosts       chan []string // what the renderer reports
	run         func()        // starts ACME and the Installer
}

type rigOptions struct {
	pebble   func(httpPort int) *testenv.PebbleServer
	hosts    []string // routed hosts
	dir      Set      // SEAMLESS_CERTS_DIR's certificates
	retryMin time.Duration
	consul   *api.Client // with kv: ACME shared through Consul KV
	kv       string
	backend  int // the port of the routed instances; 0: 9, where nothing answers
}

func newACMERig(t *testing.T, o rigOptions) (*acmeRig, *testenv.PebbleServer) {
	t.Helper()
	bin := testenv.HAProxy(t)
	ports := testenv.FreePorts(t, 2)
	r := &acmeRig{http: testenv.Addr(ports[0]), https: testenv.Addr(ports[1]), logs: &logBuffer{}, haproxyOut: &logBuffer{},
		state: t.TempDir(), metrics: NewACMEMetrics()}
	peb := o.pebble(ports[0])
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	legolog.SetDefault(log.With("component", "lego"))
	var cliRef atomic.Pointer[haproxy.MasterCLI]
	cli := cliFunc(func(ctx context.Context, cmd string) (string, error) { return cliRef.Load().Do(ctx, cmd) })
	var reloads atomic.Int32
	inst, err := NewInstaller(InstallerOptions{Dir: filepath.Join(r.state, "certs"), CLI: cli,
		Reload: func(reason string) { reloads.Add(1); t.Errorf("reload asked for: %s", reason) }, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := NewChallenges(filepath.Join(r.state, "acme-challenges.map"), cli)
	if err != nil {
		t.Fatal(err)
	}
	retryMin := o.retryMin
	if retryMin == 0 {
		retryMin = time.Second
	}
	a, err := NewACME(ACMEOptions{CA: peb.Directory(), Email: "ops@example.com", CABundle: peb.CABundle(),
		Dir: filepath.Join(r.state, "acme"), KV: o.kv, Consul: o.consul, Challenges: ch, Metrics: r.metrics, RetryMin: retryMin, RetryMax: 2 * retryMin, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(a.Initial(o.dir)); err != nil {
		t.Fatal(err)
	}
	r.inst, r.acme = inst, a

	// The built-in configuration routing every host to a backend.
	hostsCh := make(chan []string, 1)
	r.hosts = hostsCh
	rend, err := routes.New(routes.Options{HTTPBind: r.http, HTTPSBind: r.https, CrtList: inst.CrtList(), ACMEMap: ch.File(),
		Hosts: func(h []string) { hostsCh <- h }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var insts []model.Instance
	backend := o.backend
	if backend == 0 {
		backend = 9
	}
	for i, h := range o.hosts {
		insts = append(insts, model.Instance{Source: "test", Name: "web" + string(rune('a'+i)), ID: "1", Node: "n", Address: "127.0.0.1",
			Port: backend, Tags: []string{"seamless.http.host=" + h}, Status: model.StatusPassing})
	}
	out, err := rend.Render(model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: insts}}}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(r.state, "haproxy.cfg")
	if err := os.WriteFile(cfg, out.Config, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(r.state, "master.sock")
	cmd := exec.Command(bin, "-W", "-db", "-S", sock, "-f", cfg)
	cmd.Stdout, cmd.Stderr = r.haproxyOut, r.haproxyOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("seamless's log:\n%s\nHAProxy's output:\n%s", r.logs.String(), r.haproxyOut.String())
		}
	})
	r.cli = haproxy.NewMasterCLI(sock)
	cliRef.Store(r.cli)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.cli.WaitWorkerReady(ctx); err != nil {
		t.Fatalf("HAProxy did not start: %v\n%s", err, r.haproxyOut.String())
	}
	out.Commit() // HAProxy runs it: the hosts are reported

	r.run = func() {
		ctx, cancel := context.WithCancel(context.Background())
		sets := make(chan Set)
		var wg sync.WaitGroup
		wg.Go(func() { a.Run(ctx, nil, hostsCh, sets) })
		wg.Go(func() { inst.Run(ctx, sets) })
		t.Cleanup(func() { cancel(); wg.Wait() })
	}
	return r, peb
}

// keepAlive is one HTTPS connection that requests are sent on in turn,
// written by hand so that nothing is retried behind the test's back.
type keepAlive struct {
	c    *tls.Conn
	r    *bufio.Reader
	host string
}

func dialKeepAlive(addr, host string, roots *x509.CertPool) (*keepAlive, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, err
	}
	return &keepAlive{c: c, r: bufio.NewReader(c), host: host}, nil
}

// get sends one request and reads its answer, which must be a 200; again
// is false when the server closes the connection after it.
func (k *keepAlive) get() (again bool, err error) {
	_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(k.c, "GET / HTTP/1.1\r\nHost: "+k.host+"\r\n\r\n"); err != nil {
		return false, err
	}
	res, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return false, err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", res.Status)
	}
	return !res.Close, err
}

func (k *keepAlive) close() {
	if k != nil {
		k.c.Close()
	}
}

// verified does a TLS handshake for host that must verify against roots,
// and returns the leaf's serial.
func verified(addr, host string, roots *x509.CertPool) (*big.Int, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: host, RootCAs: roots})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func (r *acmeRig) reloads(t *testing.T) int {
	t.Helper()
	p, err := r.cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p.Master.Reloads
}

// frontend2xx is the number of 2xx answers of a frontend (show stat).
func (r *acmeRig) frontend2xx(t *testing.T, name string) int {
	t.Helper()
	ans, err := r.cli.Do(context.Background(), "@1 show stat")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(ans, "\n")
	col := slices.Index(strings.Split(strings.TrimPrefix(lines[0], "# "), ","), "hrsp_2xx")
	for _, l := range lines[1:] {
		if f := strings.Split(l, ","); len(f) > col && col >= 0 && f[0] == name && f[1] == "FRONTEND" {
			n, _ := strconv.Atoi(f[col])
			return n
		}
	}
	t.Fatalf("no frontend %s in show stat:\n%s", name, ans)
	return 0
}

func TestACMECertificateObtainedThroughHAProxyAndRenewedWithoutAReload(t *testing.T) {
	ca := newCA(t)
	covered := ca.bundle(t, "files.test")
	dirCert, err := Check(covered, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := Set{Certs: map[string]*Entry{"files": {Name: "files", Source: SourceDir, File: "/certs/files.pem", Cert: dirCert}}}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer backend.Close()
	backendPort, _ := strconv.Atoi(backend.URL[strings.LastIndexByte(backend.URL, ':')+1:])
	// Renewal two thirds into 36 s, 24 s after issuance: an order takes
	// about 5 s with Pebble (lego polls a challenge after 5 s when the CA
	// sends no Retry-After), and under a full make test it took 7.8 s once,
	// longer than the 8 s a validity of 24 s left before expiry.
	r, peb := newACMERig(t, rigOptions{
		pebble: func(port int) *testenv.PebbleServer {
			return testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: port, Validity: 36 * time.Second})
		},
		hosts: []string{"app.test", "files.test"}, dir: dir, backend: backendPort,
	})
	before := r.reloads(t)
	r.run()
	roots := peb.Roots()

	var first *big.Int
	testenv.Eventually(t, 20*time.Second, "app.test serves a certificate that verifies against Pebble's root", func() bool {
		s, err := verified(r.https, "app.test", roots)
		first = s
		return err == nil
	})
	// The challenge was answered by HAProxy's HTTP frontend: its only
	// backend is down, so a 200 there came from the challenge map.
	if n := r.frontend2xx(t, "http"); n < 1 {
		t.Fatalf("HAProxy's HTTP frontend answered %d requests with 2xx, want the challenge's", n)
	}
	// The host SEAMLESS_CERTS_DIR covers is not ordered, and keeps its file.
	if got := mustServe(t, r.https, "files.test"); got.Cmp(dirCert.Serial) != 0 {
		t.Fatalf("files.test serves %x, not its file's certificate", got)
	}
	if strings.Contains(r.logs.String(), "host=files.test") {
		t.Fatalf("files.test was ordered:\n%s", r.logs.String())
	}
	// Stored with private keys readable by seamless alone; the challenge
	// map is empty again.
	for _, f := range []string{filepath.Join(r.state, "acme", "certs", "app.test.pem"), r.acme.store.where(r.acme.accountDir() + "/key.pem")} {
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v, want 0600", f, err, st.Mode())
		}
	}
	if b, err := os.ReadFile(filepath.Join(r.state, "acme-challenges.map")); err != nil || len(b) != 0 {
		t.Fatalf("challenge map after the order: %q, %v", b, err)
	}

	// Renewal under a loop of new handshakes and a loop of keep-alive
	// requests (one per iteration on one connection): none fails, the new
	// serial is served, no reload. Each loop ends at stop, at the
	// deadline or after its most iterations (above what 60 s gave here:
	// 700 handshakes/s, 4,500 keep-alive requests/s), whichever is first.
	const maxHandshakes, maxRequests = 100_000, 500_000
	deadline := time.Now().Add(60 * time.Second)
	var handshakes, failures, requests, reqFailures, conns atomic.Int32
	var firstErr, firstReqErr atomic.Value
	stop := make(chan struct{})
	running := func(i, most int) bool {
		select {
		case <-stop:
			return false
		default:
			return i < most && time.Now().Before(deadline)
		}
	}
	var load sync.WaitGroup
	load.Go(func() {
		for i := 0; running(i, maxHandshakes); i++ {
			if _, err := verified(r.https, "app.test", roots); err != nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			handshakes.Add(1)
		}
	})
	load.Go(func() {
		var ka *keepAlive
		defer func() { ka.close() }()
		for i := 0; running(i, maxRequests); i++ {
			if ka == nil {
				var err error
				if ka, err = dialKeepAlive(r.https, "app.test", roots); err != nil {
					reqFailures.Add(1)
					firstReqErr.CompareAndSwap(nil, err)
					continue
				}
				conns.Add(1)
			}
			again, err := ka.get()
			requests.Add(1)
			if err != nil {
				reqFailures.Add(1)
				firstReqErr.CompareAndSwap(nil, err)
			}
			if err != nil || !again {
				ka.close()
				ka = nil
			}
		}
	})
	testenv.Eventually(t, 45*time.Second, "app.test serves a renewed certificate", func() bool {
		s, err := verified(r.https, "app.test", roots)
		return err == nil && s.Cmp(first) != 0
	})
	after, afterReq := handshakes.Load()+50, requests.Load()+50
	testenv.Eventually(t, 10*time.Second, "handshakes and requests go on", func() bool {
		return handshakes.Load() >= after && requests.Load() >= afterReq
	})
	close(stop)
	load.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d handshakes failed during the renewal; first: %v", n, handshakes.Load(), firstErr.Load())
	}
	if n := reqFailures.Load(); n > 0 {
		t.Fatalf("%d of %d keep-alive requests failed during the renewal; first: %v", n, requests.Load(), firstReqErr.Load())
	}
	if requests.Load() <= conns.Load() {
		t.Fatalf("%d requests on %d connections: the connection was not kept alive", requests.Load(), conns.Load())
	}
	t.Logf("during the renewal: %d handshakes and %d keep-alive requests on %d connections, none failed",
		handshakes.Load(), requests.Load(), conns.Load())
	if got := testutil.ToFloat64(r.metrics.orders.WithLabelValues(OrderIssued)); got < 2 {
		t.Fatalf("orders issued = %v, want 2 (the certificate and its renewal)", got)
	}
	if now := r.reloads(t); now != before {
		t.Fatalf("HAProxy reloaded %d times", now-before)
	}
}

func TestACMEErrorsAreRetriedWithBackoffWhileTheDefaultCertificateServes(t *testing.T) {
	r, peb := newACMERig(t, rigOptions{
		pebble: func(port int) *testenv.PebbleServer {
			p := testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: port})
			p.Stop() // down when seamless starts
			return p
		},
		hosts: []string{"app.test"}, retryMin: 200 * time.Millisecond,
	})
	before := r.reloads(t)
	r.run()
	testenv.Eventually(t, 20*time.Second, "three failed orders", func() bool {
		return testutil.ToFloat64(r.metrics.orders.WithLabelValues(OrderFailed)) >= 3
	})
	l := r.logs.String()
	if !strings.Contains(l, "ACME order failed; the default certificate keeps serving it") || !strings.Contains(l, "host=app.test") ||
		!strings.Contains(l, "retry_in=") {
		t.Fatalf("the failure is not logged with its host and retry:\n%s", l)
	}
	if got := mustServe(t, r.https, "app.test"); got.Cmp(r.inst.def.Serial) != 0 {
		t.Fatalf("app.test serves %x while the CA is down, not the default certificate", got)
	}

	// The CA is back: the next attempt obtains the certificate.
	peb.Start()
	roots := peb.Roots()
	testenv.Eventually(t, 20*time.Second, "app.test serves a certificate once the CA is back", func() bool {
		_, err := verified(r.https, "app.test", roots)
		return err == nil
	})
	if now := r.reloads(t); now != before {
		t.Fatalf("HAProxy reloaded %d times", now-before)
	}
}

func TestACMERegistersAgainWhenTheCAForgetsTheAccount(t *testing.T) {
	r, peb := newACMERig(t, rigOptions{
		pebble: func(port int) *testenv.PebbleServer { return testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: port}) },
		hosts:  []string{"app.test"}, retryMin: 200 * time.Millisecond,
	})
	r.run()
	roots := peb.Roots()
	testenv.Eventually(t, 20*time.Second, "app.test is served", func() bool {
		_, err := verified(r.https, "app.test", roots)
		return err == nil
	})
	// A restarted Pebble knows no account: the stored one is refused.
	peb.Stop()
	peb.Start()
	roots = peb.Roots()
	r.hosts <- []string{"app.test", "new.test"}
	testenv.Eventually(t, 20*time.Second, "new.test is served by the restarted CA", func() bool {
		_, err := verified(r.https, "new.test", roots)
		return err == nil
	})
	if n := strings.Count(r.logs.String(), "ACME account registered"); n != 2 {
		t.Fatalf("%d registrations, want 2", n)
	}
}

func TestACMEBackoffDoublesAndRespectsRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ch, err := NewChallenges(filepath.Join(t.TempDir(), "challenges.map"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := NewACMEMetrics()
	a, err := NewACME(ACMEOptions{CA: LetsEncryptStaging, Email: "ops@example.com", Dir: t.TempDir(), Challenges: ch,
		Metrics: m, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	next, backoff := map[string]time.Time{}, map[string]time.Duration{}
	fail := func(err error) time.Duration {
		a.result(orderResult{host: "app.test", err: err}, next, backoff)
		return next["app.test"].Sub(now)
	}
	plain := errors.New("connection refused")
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		if got := fail(plain); got != want {
			t.Fatalf("failure %d: retry in %s, want %s", i+1, got, want)
		}
	}
	limited := &acme.RateLimitedError{ProblemDetails: &acme.ProblemDetails{Type: acme.RateLimitedErrorType, HTTPStatus: 429},
		RetryAfter: 3 * time.Hour}
	if got := fail(fmt.Errorf("new order: %w", limited)); got != 3*time.Hour {
		t.Fatalf("rate limited: retry in %s, want the CA's Retry-After 3h", got)
	}
	for range 10 {
		fail(plain)
	}
	if got := fail(plain); got != 6*time.Hour {
		t.Fatalf("backoff grows to %s, want at most 6h", got)
	}
	if got := testutil.ToFloat64(m.orders.WithLabelValues(OrderRateLimited)); got != 1 {
		t.Fatalf("rate-limited orders = %v", got)
	}
	if got := testutil.ToFloat64(m.orders.WithLabelValues(OrderFailed)); got != 14 {
		t.Fatalf("failed orders = %v", got)
	}
}
