package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// With SEAMLESS_ACME_EMAIL a routed host gets a certificate from the CA
// (Pebble), the HTTP-01 challenge answered by the built-in configuration's
// HTTP frontend even for a host whose plain HTTP is redirected, without a
// reload; a host SEAMLESS_CERTS_DIR covers is not ordered.
func TestACMEForRoutedHosts(t *testing.T) {
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
	apiPEM, apiSerial := selfSignedPEM(t, "api.test")
	writeAtomic(t, filepath.Join(certsDir, "api.pem"), string(apiPEM))
	httpPort := testenv.FreePort(t)
	httpAddr, httpsAddr := testenv.Addr(httpPort), testenv.Addr(testenv.FreePort(t))
	peb := testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: httpPort})
	state := filepath.Join(t.TempDir(), "state")
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
		"SEAMLESS_SERVICES_DIR=" + services, "SEAMLESS_HTTP_BIND=" + httpAddr, "SEAMLESS_HTTPS_BIND=" + httpsAddr,
		"SEAMLESS_CERTS_DIR=" + certsDir, "SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + state, "SEAMLESS_WAIT=0",
		"SEAMLESS_ACME_EMAIL=ops@example.com", "SEAMLESS_ACME_CA=" + peb.Directory(), "SEAMLESS_ACME_CA_BUNDLE=" + peb.CABundle()}})

	roots := peb.Roots()
	var resp *http.Response
	testenv.Eventually(t, 30*time.Second, "shop.test is served over HTTPS with a certificate Pebble issued", func() bool {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{ServerName: "shop.test", RootCAs: roots}, DisableKeepAlives: true}}
		req, _ := http.NewRequest("GET", "https://"+httpsAddr+"/", nil)
		req.Host = "shop.test"
		r, err := c.Do(req)
		if err != nil {
			return false
		}
		r.Body.Close()
		resp = r
		return r.StatusCode == 200
	})
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(iss, "Pebble") {
		t.Errorf("shop.test's certificate is issued by %q", iss)
	}
	r, _, err := httpsGet(httpsAddr, "api.test", "/")
	if err != nil || r.TLS.PeerCertificates[0].SerialNumber.Cmp(apiSerial) != 0 {
		t.Fatalf("api.test: %v, want its file's certificate", err)
	}
	if v := testenv.Metric(t, in.status, `seamless_acme_orders_total{result="issued"}`); v != 1 {
		t.Errorf("orders issued = %v, want 1 (shop.test alone)", v)
	}
	if v := testenv.Metric(t, in.status, `seamless_reloads_total{result="success"}`); v != 0 {
		t.Errorf("%v reloads", v)
	}
}
