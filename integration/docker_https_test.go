//go:build docker

package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/integration/loadgen"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// shopBundle is a self-signed certificate for shop.test with its key.
func shopBundle(t *testing.T) ([]byte, *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "shop.test"}, DNSNames: []string{"shop.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...), serial
}

// startHTTPSBox starts image in discovery mode with the built-in template:
// a services directory routing shop.test to seamless's own status endpoint
// in the container, and a certificates directory holding bundle as
// shop.pem, both mounted read-only. front is the HTTPS frontend.
func startHTTPSBox(t *testing.T, c *client.Client, image string, bundle []byte) *box {
	t.Helper()
	dir, err := os.MkdirTemp("", "seamless-docker-https-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	certs, services := filepath.Join(dir, "certs"), filepath.Join(dir, "services")
	for _, d := range []string{dir, certs, services} {
		// The container runs as the image's haproxy user.
		if err := os.MkdirAll(d, 0o755); err != nil || os.Chmod(d, 0o755) != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(certs, "shop.pem"), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	svc := "name: shop\ntags: [\"seamless.http.host=shop.test\"]\ninstances:\n  - address: 127.0.0.1\n    port: 8405\n"
	if err := os.WriteFile(filepath.Join(services, "shop.yaml"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	fe, st := network.MustParsePort("8443/tcp"), network.MustParsePort("8405/tcp")
	res, err := c.ContainerCreate(context.Background(), client.ContainerCreateOptions{
		Config: &container.Config{
			Image:        image,
			ExposedPorts: network.PortSet{fe: {}, st: {}},
			Labels:       map[string]string{"seamless.test": t.Name()},
			Env: []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=/etc/seamless/services",
				"SEAMLESS_CERTS_DIR=/etc/seamless/certs", "SEAMLESS_HTTPS_BIND=:8443", "SEAMLESS_HTTP_BIND=:8080",
				"SEAMLESS_WAIT=0"},
		},
		HostConfig: &container.HostConfig{
			Binds:        []string{certs + ":/etc/seamless/certs:ro", services + ":/etc/seamless/services:ro"},
			PortBindings: network.PortMap{fe: {{HostIP: loopback}}, st: {{HostIP: loopback}}},
		},
	})
	if err != nil {
		t.Fatalf("create %s: %v", image, err)
	}
	b := &box{t: t, c: c, id: res.ID, dir: dir}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("container logs:\n%s", b.logs())
		}
		_, _ = c.ContainerRemove(context.Background(), b.id, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := c.ContainerStart(context.Background(), b.id, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("start: %v", err)
	}
	insp := b.inspect()
	b.front = hostAddr(t, insp.NetworkSettings.Ports[fe])
	b.status = hostAddr(t, insp.NetworkSettings.Ports[st])
	return b
}

// servedSerial shakes hands with front for shop.test and returns the
// certificate's serial.
func servedSerial(front string) (*big.Int, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", front,
		&tls.Config{ServerName: "shop.test", InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func (b *box) statusReport() status.Report {
	b.t.Helper()
	code, body := testenv.Get("http://" + b.status + "/status")
	var r status.Report
	if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil {
		b.t.Fatalf("/status: %d %v", code, err)
	}
	return r
}

func shopOnStatus(r status.Report) (status.Certificate, bool) {
	for _, c := range r.Certificates {
		if c.Name == "shop" {
			return c, true
		}
	}
	return status.Certificate{}, false
}

// TestDockerHUPKeepsTheCertificates: `docker kill -s HUP` to a container
// serving HTTPS from a mounted certificates directory, whose certificate
// was replaced over the runtime API, reloads HAProxy, and the reloaded
// HAProxy serves the same certificate (the files seamless keeps are what
// a reload loads), with no TLS handshake or request failing during it, on
// new connections or keep-alive ones.
func TestDockerHUPKeepsTheCertificates(t *testing.T) {
	c := dockerClient(t)
	for _, image := range images() {
		t.Run(image, func(t *testing.T) {
			bundleA, serialA := shopBundle(t)
			b := startHTTPSBox(t, c, image, bundleA)
			testenv.Eventually(t, 30*time.Second, "shop.test served over HTTPS with its certificate", func() bool {
				s, err := servedSerial(b.front)
				return err == nil && s.Cmp(serialA) == 0
			})
			// Replaced over the runtime API: the HUP must reload the
			// files seamless kept equal to what runs, not the first ones.
			ok0 := b.metric(`seamless_reloads_total{result="success"}`)
			bundle, serial := shopBundle(t)
			p := filepath.Join(b.dir, "certs", "shop.pem")
			if err := os.WriteFile(p+".tmp", bundle, 0o644); err != nil || os.Rename(p+".tmp", p) != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 10*time.Second, "the replacement served", func() bool {
				s, err := servedSerial(b.front)
				return err == nil && s.Cmp(serial) == 0
			})
			if n := b.metric(`seamless_reloads_total{result="success"}`); n != ok0 {
				t.Fatalf("the replacement reloaded HAProxy (%v reloads, %v before); it goes over the runtime API", n, ok0)
			}
			before := b.statusReport()
			shop, ok := shopOnStatus(before)
			if !ok || shop.Serial != fmt.Sprintf("%X", serial.Bytes()) || before.HAProxy.Master == nil {
				t.Fatalf("/status before the HUP: shop %+v, master %+v", shop, before.HAProxy.Master)
			}

			// The load's backend is seamless's own /healthz, which answers
			// 503 "haproxy starting" until the first worker has answered
			// the master CLI: a handshake can succeed before that.
			testenv.Eventually(t, 30*time.Second, "seamless healthy", func() bool {
				code, _ := testenv.Get("http://" + b.status + "/healthz")
				return code == 200
			})
			tlsCfg := &tls.Config{ServerName: "shop.test", InsecureSkipVerify: true}
			var loads []*loadgen.Load
			for _, m := range []loadgen.Mode{loadgen.NewConn, loadgen.KeepAlive} {
				l, err := loadgen.Start(context.Background(), loadgen.Config{Target: b.front, Mode: m, Workers: 4,
					Path: "/healthz", MaxRequests: 1_000_000, MaxDuration: 2 * time.Minute, TLS: tlsCfg})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Stop() })
				loads = append(loads, l)
			}
			served := func(n int64) func() bool {
				return func() bool {
					for _, l := range loads {
						if l.Snapshot().Requests < n {
							return false
						}
					}
					return true
				}
			}
			testenv.Eventually(t, 30*time.Second, "both loads running", served(50))

			b.kill("HUP")
			testenv.Eventually(t, 30*time.Second, "the reload confirmed, a new master generation", func() bool {
				return b.metric(`seamless_reloads_total{result="success"}`) > ok0
			})
			after := b.statusReport()
			if after.HAProxy.Master == nil || after.HAProxy.Master.Reloads <= before.HAProxy.Master.Reloads {
				t.Errorf("HAProxy's master counts %+v reloads after the HUP, before %+v", after.HAProxy.Master, before.HAProxy.Master)
			}
			// Requests through the reloaded worker too.
			n := loads[0].Snapshot().Requests + 200
			testenv.Eventually(t, 30*time.Second, "200 more requests after the reload", served(n))
			for i, l := range loads {
				r := l.Stop()
				t.Logf("%s over TLS: %d requests, %d failed %v", []string{"new connection", "keep-alive"}[i], r.Requests, r.Failed, r.Errors)
				if r.Failed != 0 {
					t.Errorf("%d of %d TLS requests failed across the reload: %v", r.Failed, r.Requests, r.Errors)
				}
			}
			for range 5 {
				s, err := servedSerial(b.front)
				if err != nil || s.Cmp(serial) != 0 {
					t.Fatalf("after the reload shop.test is served serial %v (%v), want %X", s, err, serial)
				}
			}
			if shop2, _ := shopOnStatus(after); shop2.Serial != shop.Serial || !shop2.ServedSince.Equal(shop.ServedSince) {
				t.Errorf("/status after the reload: %+v, want the same serial served since the same time as before: %+v", shop2, shop)
			}
		})
	}
}
