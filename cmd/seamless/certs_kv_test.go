package main

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// With SEAMLESS_CERTS_KV the HTTPS frontend serves what the KV prefix holds
// at start and what is put there later, without a reload, next to
// SEAMLESS_CERTS_DIR; a bad value is refused naming its key.
func TestHTTPSCertsFromConsulKV(t *testing.T) {
	testenv.HAProxy(t)
	consul := testenv.Consul(t)
	kv := consul.Client().KV()
	put := func(key string, v []byte) {
		t.Helper()
		if _, err := kv.Put(&api.KVPair{Key: key, Value: v}, nil); err != nil {
			t.Fatal(err)
		}
	}
	services, certsDir := t.TempDir(), t.TempDir()
	port := protoBackend(t)
	for _, name := range []string{"shop", "api", "dir"} {
		writeAtomic(t, filepath.Join(services, name+".yaml"), fmt.Sprintf(
			"name: %s\ntags: [\"seamless.http.host=%s.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", name, name, port))
	}
	dirPEM, dirSerial := selfSignedPEM(t, "dir.test")
	writeAtomic(t, filepath.Join(certsDir, "dir.pem"), string(dirPEM))
	shopPEM, shopSerial := selfSignedPEM(t, "shop.test")
	put("tls/shop", shopPEM)
	httpsAddr := testenv.Addr(testenv.FreePort(t))
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
		"SEAMLESS_SERVICES_DIR=" + services, "SEAMLESS_HTTP_BIND=" + testenv.Addr(testenv.FreePort(t)), "SEAMLESS_HTTPS_BIND=" + httpsAddr,
		"SEAMLESS_CERTS_DIR=" + certsDir, "SEAMLESS_CERTS_KV=tls", "CONSUL_HTTP_ADDR=" + consul.Addr(),
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SEAMLESS_WAIT=0"}})

	serves := func(host string, serial fmt.Stringer) bool {
		r, _, err := httpsGet(httpsAddr, host, "/")
		return err == nil && r.StatusCode == 200 && r.TLS.PeerCertificates[0].SerialNumber.String() == serial.String()
	}
	testenv.Eventually(t, 15*time.Second, "shop.test is served with the certificate KV held at start", func() bool {
		return serves("shop.test", shopSerial)
	})
	if !serves("dir.test", dirSerial) {
		t.Fatal("dir.test is not served with its file's certificate")
	}
	apiPEM, apiSerial := selfSignedPEM(t, "api.test")
	put("tls/api", apiPEM)
	testenv.Eventually(t, 10*time.Second, "api.test is served with the certificate put into KV", func() bool {
		return serves("api.test", apiSerial)
	})
	otherPEM, _ := selfSignedPEM(t, "shop.test")
	put("tls/shop", append(shopPEM[:strings.Index(string(shopPEM), "-----BEGIN PRIVATE KEY")], otherPEM[strings.Index(string(otherPEM), "-----BEGIN PRIVATE KEY"):]...))
	testenv.Eventually(t, 10*time.Second, "the mismatched key is refused, naming its key", func() bool {
		return strings.Contains(in.out.String(), "certificate refused") && strings.Contains(in.out.String(), "key=tls/shop")
	})
	if !serves("shop.test", shopSerial) {
		t.Fatal("shop.test no longer serves its last good certificate")
	}
	if v := testenv.Metric(t, in.status, `seamless_certificate_expiry_seconds{host="api.test",name="api",source="kv"}`); v < float64(time.Now().Unix()) {
		t.Errorf("expiry metric = %v", v)
	}
	if v := testenv.Metric(t, in.status, `seamless_reloads_total{result="success"}`); v != 0 {
		t.Errorf("%v reloads", v)
	}
}

// Two seamless processes with SEAMLESS_ACME_KV against one Consul and one
// Pebble, which validates through the first one's HTTP frontend only: one
// order in all, and both serve the same certificate.
func TestACMESharedKV(t *testing.T) {
	testenv.HAProxy(t)
	consul := testenv.Consul(t)
	services := t.TempDir()
	port := protoBackend(t)
	writeAtomic(t, filepath.Join(services, "shop.yaml"), fmt.Sprintf(
		"name: shop\ntags: [\"seamless.http.host=shop.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: %d\n", port))
	httpPort := testenv.FreePort(t)
	peb := testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: httpPort})
	start := func(httpAddr string) (*instance, string) {
		httpsAddr := testenv.Addr(testenv.FreePort(t))
		return startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: []string{"SEAMLESS_SOURCES=file",
			"SEAMLESS_SERVICES_DIR=" + services, "SEAMLESS_HTTP_BIND=" + httpAddr, "SEAMLESS_HTTPS_BIND=" + httpsAddr,
			"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SEAMLESS_WAIT=0",
			"SEAMLESS_ACME_EMAIL=ops@example.com", "SEAMLESS_ACME_CA=" + peb.Directory(), "SEAMLESS_ACME_CA_BUNDLE=" + peb.CABundle(),
			"SEAMLESS_ACME_KV=seamless/acme", "CONSUL_HTTP_ADDR=" + consul.Addr()}}), httpsAddr
	}
	a, aHTTPS := start(testenv.Addr(httpPort))
	b, bHTTPS := start(testenv.Addr(testenv.FreePort(t)))

	roots := peb.Roots()
	serial := func(addr string) string {
		c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "shop.test", RootCAs: roots})
		if err != nil {
			return ""
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	testenv.Eventually(t, 40*time.Second, "both replicas serve the same certificate Pebble issued", func() bool {
		sa := serial(aHTTPS)
		return sa != "" && sa == serial(bHTTPS)
	})
	issued := testenv.Metric(t, a.status, `seamless_acme_orders_total{result="issued"}`) +
		testenv.Metric(t, b.status, `seamless_acme_orders_total{result="issued"}`)
	if issued != 1 {
		t.Errorf("%v orders issued by the two replicas, want 1", issued)
	}
	for _, in := range []*instance{a, b} {
		if v := testenv.Metric(t, in.status, `seamless_reloads_total{result="success"}`); v != 0 {
			t.Errorf("%v reloads", v)
		}
	}
	if p, _, err := consul.Client().KV().Get("seamless/acme/certs/shop.test.pem", nil); err != nil || p == nil {
		t.Errorf("the certificate is not stored in Consul KV: %v", err)
	}
}
