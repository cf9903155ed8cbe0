package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// selfSignedPEM is a certificate for host with its key, as one bundle.
func selfSignedPEM(t *testing.T, host string) ([]byte, *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...), serial
}

// protoBackend answers with the X-Forwarded-Proto it was sent.
func protoBackend(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proto=%s", r.Header.Get("X-Forwarded-Proto"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// httpsGet requests path from addr with sni as the TLS server name and the
// Host header, offering HTTP/2.
func httpsGet(addr, sni, path string) (*http.Response, string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{ServerName: sni, InsecureSkipVerify: true}, ForceAttemptHTTP2: true, DisableKeepAlives: true}}
	req, _ := http.NewRequest("GET", "https://"+addr+path, nil)
	req.Host = sni
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

// The HTTPS frontend serves the certificates of SEAMLESS_CERTS_DIR by SNI
// (the default one otherwise), routes like HTTP, and redirects tagged
// services. (A short name: the master socket path has a length limit.)
func TestHTTPSAndRedirect(t *testing.T) {
	testenv.HAProxy(t)
	services, certsDir := t.TempDir(), t.TempDir()
	port := protoBackend(t)
	for name, tags := range map[string]string{
		"shop": `["seamless.http.host=shop.test", "seamless.http.tls=redirect"]`,
		"api":  `["seamless.http.host=api.test"]`,
	} {
		writeAtomic(t, filepath.Join(services, name+".yaml"),
			fmt.Sprintf("name: %s\ntags: %s\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", name, tags, port))
	}
	shopPEM, shopSerial := selfSignedPEM(t, "shop.test")
	writeAtomic(t, filepath.Join(certsDir, "shop.pem"), string(shopPEM))
	httpAddr, httpsAddr := testenv.Addr(testenv.FreePort(t)), testenv.Addr(testenv.FreePort(t))
	state := filepath.Join(t.TempDir(), "state")
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
		"SEAMLESS_SERVICES_DIR=" + services, "SEAMLESS_HTTP_BIND=" + httpAddr, "SEAMLESS_HTTPS_BIND=" + httpsAddr,
		"SEAMLESS_CERTS_DIR=" + certsDir, "SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + state, "SEAMLESS_WAIT=0"}})

	var resp *http.Response
	var body string
	testenv.Eventually(t, 15*time.Second, "shop.test is served over HTTPS", func() bool {
		var err error
		resp, body, err = httpsGet(httpsAddr, "shop.test", "/")
		return err == nil && resp.StatusCode == 200
	})
	if got := resp.TLS.PeerCertificates[0].SerialNumber; got.Cmp(shopSerial) != 0 {
		t.Errorf("shop.test served serial %x, want the directory's %x", got, shopSerial)
	}
	if resp.Proto != "HTTP/2.0" || body != "proto=https" {
		t.Errorf("over HTTPS: %s, backend saw %q; want HTTP/2.0 (ALPN) and proto=https", resp.Proto, body)
	}
	// A host without a certificate routes alike, with the default one.
	resp, body, err := httpsGet(httpsAddr, "api.test", "/")
	if err != nil || resp.StatusCode != 200 || body != "proto=https" {
		t.Fatalf("api.test over HTTPS: %v %v %q", resp, err, body)
	}
	if cn := resp.TLS.PeerCertificates[0].Subject.CommonName; cn != "seamless.invalid" {
		t.Errorf("api.test (no certificate) was served %q, want the self-signed default", cn)
	}

	// Plain HTTP: shop.test is redirected with 308, api.test is served.
	noFollow := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("POST", "http://"+httpAddr+"/cart?id=1", strings.NewReader("x"))
	req.Host = "shop.test"
	r2, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusPermanentRedirect || r2.Header.Get("Location") != "https://shop.test/cart?id=1" {
		t.Errorf("HTTP shop.test: %d Location %q, want 308 to https://shop.test/cart?id=1", r2.StatusCode, r2.Header.Get("Location"))
	}
	req, _ = http.NewRequest("GET", "http://"+httpAddr+"/", nil)
	req.Host = "api.test"
	r3, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r3.Body)
	r3.Body.Close()
	if r3.StatusCode != 200 || string(b) != "proto=http" {
		t.Errorf("HTTP api.test: %d %q, want 200 and proto=http", r3.StatusCode, b)
	}

	// The expiry metric, and the default certificate kept for the next start.
	if v := testenv.Metric(t, in.status, `seamless_certificate_expiry_seconds{host="shop.test",name="shop",source="dir"}`); v < float64(time.Now().Unix()) {
		t.Errorf("expiry metric = %v", v)
	}
	if _, err := os.Stat(filepath.Join(state, "certs", "default.pem")); err != nil {
		t.Error(err)
	}
}
