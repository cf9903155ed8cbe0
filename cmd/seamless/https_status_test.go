package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// leafPEM is a self-signed certificate for hosts, valid for validity from
// an hour ago, with its key as one bundle.
func leafPEM(t *testing.T, validity time.Duration, hosts ...string) ([]byte, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity).Truncate(time.Second)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...), c
}

func findCert(r status.Report, name string) (status.Certificate, bool) {
	i := slices.IndexFunc(r.Certificates, func(c status.Certificate) bool { return c.Name == name })
	if i < 0 {
		return status.Certificate{}, false
	}
	return r.Certificates[i], true
}

// /status, the page and the expiry metric list the certificates HAProxy
// serves, and follow a replacement over the runtime API: the new serial,
// since when it is served, and the flag of one expiring within 30 days.
func TestHTTPSCertificatesOnStatus(t *testing.T) {
	testenv.HAProxy(t)
	services, certsDir := t.TempDir(), t.TempDir()
	writeAtomic(t, filepath.Join(services, "shop.yaml"), fmt.Sprintf(
		"name: shop\ntags: [\"seamless.http.host=shop.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", protoBackend(t)))
	bundle, first := leafPEM(t, 90*24*time.Hour, "shop.test", "www.shop.test")
	writeAtomic(t, filepath.Join(certsDir, "shop.pem"), string(bundle))
	httpsAddr := testenv.Addr(testenv.FreePort(t))
	start := time.Now().Truncate(time.Second)
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
		"SEAMLESS_SERVICES_DIR=" + services, "SEAMLESS_HTTP_BIND=" + testenv.Addr(testenv.FreePort(t)),
		"SEAMLESS_HTTPS_BIND=" + httpsAddr, "SEAMLESS_CERTS_DIR=" + certsDir, "SEAMLESS_STATS_BIND=",
		"SEAMLESS_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SEAMLESS_WAIT=0"}})

	testenv.Eventually(t, 15*time.Second, "shop.test is served over HTTPS", func() bool {
		resp, _, err := httpsGet(httpsAddr, "shop.test", "/")
		return err == nil && resp.StatusCode == 200
	})
	r := getStatus(t, in)
	if len(r.Certificates) != 2 || r.Certificates[0].Source != "default" {
		t.Fatalf("certificates on /status: %+v, want the default one then shop", r.Certificates)
	}
	if d := r.Certificates[0]; !slices.Equal(d.Hosts, []string{"seamless.invalid"}) || d.Expiring || d.ServedSince.Before(start) {
		t.Errorf("the default certificate on /status: %+v", d)
	}
	shop, _ := findCert(r, "shop")
	want := status.Certificate{Name: "shop", Source: "dir", Hosts: []string{"shop.test", "www.shop.test"}, Issuer: "CN=shop.test",
		Serial: strings.ToUpper(fmt.Sprintf("%x", first.SerialNumber.Bytes())), NotAfter: first.NotAfter.UTC(),
		ServedSince: shop.ServedSince, File: filepath.Join(certsDir, "shop.pem")}
	if fmt.Sprint(shop) != fmt.Sprint(want) {
		t.Errorf("shop on /status:\n got %+v\nwant %+v", shop, want)
	}
	if shop.ServedSince.Before(start) || shop.ServedSince.After(time.Now()) {
		t.Errorf("shop served since %v, want between the start (%v) and now", shop.ServedSince, start)
	}
	if v := testenv.Metric(t, in.status, `seamless_certificate_expiry_seconds{host="www.shop.test",name="shop",source="dir"}`); v != float64(first.NotAfter.Unix()) {
		t.Errorf("expiry metric for www.shop.test = %v, want %d", v, first.NotAfter.Unix())
	}

	// Replaced by one that ends in 20 days, for shop.test alone.
	bundle, second := leafPEM(t, 20*24*time.Hour, "shop.test")
	replaced := time.Now().Truncate(time.Second)
	writeAtomic(t, filepath.Join(certsDir, "shop.pem"), string(bundle))
	serial := strings.ToUpper(fmt.Sprintf("%x", second.SerialNumber.Bytes()))
	testenv.Eventually(t, 10*time.Second, "/status names the new certificate", func() bool {
		r = getStatus(t, in)
		shop, _ = findCert(r, "shop")
		return shop.Serial == serial
	})
	if !shop.Expiring || !shop.NotAfter.Equal(second.NotAfter) || shop.ServedSince.Before(replaced) || !slices.Equal(shop.Hosts, []string{"shop.test"}) {
		t.Errorf("shop after its replacement: %+v; want expiring, ending %v, served since %v or later", shop, second.NotAfter, replaced)
	}
	resp, _, err := httpsGet(httpsAddr, "shop.test", "/")
	if err != nil || resp.TLS.PeerCertificates[0].SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Errorf("HAProxy does not serve the serial /status names: %v", err)
	}
	if v := testenv.Metric(t, in.status, `seamless_certificate_expiry_seconds{host="shop.test",name="shop",source="dir"}`); v != float64(second.NotAfter.Unix()) {
		t.Errorf("expiry metric for shop.test = %v, want %d", v, second.NotAfter.Unix())
	}
	if _, body := testenv.Get("http://" + in.status + "/metrics"); strings.Contains(body, `host="www.shop.test"`) {
		t.Error("the metric still has a series for www.shop.test, which the new certificate does not name")
	}
	_, page := testenv.Get("http://" + in.status + "/")
	for _, s := range []string{serial[:12], "shop.test", "in 19d"} {
		if !strings.Contains(page, s) {
			t.Errorf("the page does not show %q", s)
		}
	}
}
