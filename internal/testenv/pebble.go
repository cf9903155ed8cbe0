package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// PebbleVersion is the Pebble `make pebble` builds.
const PebbleVersion = "2.10.3"

// pebbleBin returns $env, else the binary `make pebble` builds under
// /var/cache/seamless/pebble. Without it the test is skipped, or fails
// under CI.
func pebbleBin(t testing.TB, env, name string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		bin = "/var/cache/seamless/pebble/" + name + "-" + PebbleVersion
	}
	if _, err := os.Stat(bin); err != nil {
		if CI() {
			t.Fatalf("%s not found under CI (make pebble builds it): %v", name, err)
		}
		t.Skipf("%s not found: %v (run make pebble)", name, err)
	}
	return bin
}

// PebbleOptions configure a Pebble ACME server.
type PebbleOptions struct {
	// HTTPPort is where Pebble's validation authority sends HTTP-01
	// requests, on 127.0.0.1 (every name resolves to it).
	HTTPPort int
	// Validity of the certificates it issues; 0: 90 days.
	Validity time.Duration
}

// PebbleServer is Pebble, Let's Encrypt's ACME test server, with its
// challenge test server as DNS (every name is 127.0.0.1).
type PebbleServer struct {
	t                  testing.TB
	bin                string
	dir                string
	listen, management string
	cmd                *exec.Cmd
	done               chan struct{}
	client             *http.Client
	caBundle, dnsAddr  string
}

// Pebble starts Pebble for t; Stop and Start stop it and start it again on
// the same addresses.
func Pebble(t testing.TB, o PebbleOptions) *PebbleServer {
	t.Helper()
	p := &PebbleServer{t: t, bin: pebbleBin(t, "SEAMLESS_PEBBLE_BIN", "pebble"), dir: t.TempDir()}
	chall := pebbleBin(t, "SEAMLESS_CHALLTESTSRV_BIN", "pebble-challtestsrv")
	ports := FreePorts(t, 5)
	p.listen, p.management = Addr(ports[0]), Addr(ports[1])
	dns := Addr(ports[3])

	// Pebble's own HTTPS certificate, from a root the client trusts
	// (SEAMLESS_ACME_CA_BUNDLE in seamless's terms).
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pebble test listener"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p.caBundle = filepath.Join(p.dir, "listener.pem")
	keyFile := filepath.Join(p.dir, "listener.key")
	writeFile(t, p.caBundle, certPEM)
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	p.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	validity := int64(90 * 24 * 3600)
	if o.Validity > 0 {
		validity = int64(o.Validity / time.Second)
	}
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": p.listen, "managementListenAddress": p.management,
		"certificate": p.caBundle, "privateKey": keyFile,
		"httpPort": o.HTTPPort, "tlsPort": ports[2],
		"ocspResponderURL": "", "externalAccountBindingRequired": false,
		"retryAfter":   map[string]int{"authz": 1, "order": 1},
		"keyAlgorithm": "ecdsa",
		"profiles":     map[string]any{"default": map[string]any{"description": "test", "validityPeriod": validity}},
	}}
	b, _ := json.Marshal(cfg)
	writeFile(t, filepath.Join(p.dir, "pebble.json"), b)

	cs := exec.Command(chall, "-dnsserver", dns, "-management", Addr(ports[4]),
		"-http01", "", "-https01", "", "-doh", "", "-tlsalpn01", "", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "")
	clog, err := os.Create(filepath.Join(p.dir, "challtestsrv.log"))
	if err != nil {
		t.Fatal(err)
	}
	cs.Stdout, cs.Stderr = clog, clog
	// Killed with the test process, whose cleanup a timeout's panic skips.
	cs.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Process.Kill(); _ = cs.Wait(); clog.Close() })
	p.dnsAddr = dns
	p.Start()
	t.Cleanup(func() {
		if p.cmd != nil {
			p.Stop()
		}
		if t.Failed() {
			for _, f := range []string{"pebble.log", "challtestsrv.log"} {
				if b, err := os.ReadFile(filepath.Join(p.dir, f)); err == nil {
					t.Logf("%s (last 8 KiB):\n%s", f, tail(b, 8<<10))
				}
			}
		}
	})
	return p
}

// Start starts Pebble (again) and waits until its directory and its
// management API answer: Pebble opens the second listener on a goroutine
// of its own, so the directory answering says nothing of it.
func (p *PebbleServer) Start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, "-config", filepath.Join(p.dir, "pebble.json"), "-dnsserver", p.dnsAddr)
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	log, err := os.OpenFile(filepath.Join(p.dir, "pebble.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	for what, url := range map[string]string{"directory": p.Directory(), "management API": p.rootsURL()} {
		Eventually(p.t, 30*time.Second, "Pebble's "+what+" answers", func() bool {
			resp, err := p.client.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
}

func (p *PebbleServer) rootsURL() string { return "https://" + p.management + "/roots/0" }

// Stop stops Pebble: it forgets every account and order.
func (p *PebbleServer) Stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

// Directory is the ACME directory URL.
func (p *PebbleServer) Directory() string { return "https://" + p.listen + "/dir" }

// CABundle is the PEM file of the root of Pebble's own HTTPS listener.
func (p *PebbleServer) CABundle() string { return p.caBundle }

// Roots returns the roots of the certificates Pebble issues (they change
// at every start).
func (p *PebbleServer) Roots() *x509.CertPool {
	p.t.Helper()
	resp, err := p.client.Get(p.rootsURL())
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		p.t.Fatalf("Pebble's root: %d %v", resp.StatusCode, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		p.t.Fatalf("Pebble's root is not PEM: %q", b)
	}
	return pool
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
