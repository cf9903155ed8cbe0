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
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The TLS benchmark's certificates, probes and tables.

// handshakeSerial is the serial a TLS handshake for tlsHost is served.
func handshakeSerial(addr string) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{ServerName: tlsHost, InsecureSkipVerify: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return strings.ToUpper(c.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)), nil
}

// benchCert is a self-signed certificate for tlsHost with its key, and its
// serial as /status shows it.
func benchCert() ([]byte, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, "", err
	}
	serial.Add(serial, big.NewInt(1<<56)) // 8 bytes, no leading zero byte
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: tlsHost}, DNSNames: []string{tlsHost},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, "", err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, "", err
	}
	b := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...)
	return b, strings.ToUpper(serial.Text(16)), nil
}

// replaceFile writes path as a deployment tool does: a hidden temporary
// file (which the directory source ignores) renamed over it.
func replaceFile(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func printTLSTables(w io.Writer, o tlsOptions, results []tlsResult) {
	var base *tlsResult
	for i := range results {
		if results[i].v.key == "a" && results[i].err == nil {
			base = &results[i]
		}
	}
	for _, mode := range []struct {
		title, rate string
		load        func(r tlsResult) *tlsLoad
	}{
		{"New connections: a full TLS handshake per request", "handshakes/s", func(r tlsResult) *tlsLoad { return r.fresh }},
		{"Keep-alive connections", "requests/s", func(r tlsResult) *tlsLoad { return r.keep }},
	} {
		fmt.Fprintf(w, "%s\n\n", mode.title)
		rows := [][]string{{"variant", mode.rate, "vs a", "handshakes", "failed handshakes", "requests", "failed requests", "p50", "p99", "rotations served", "rotation to served p50/max", "reloads"}}
		var notes []string
		for _, r := range results {
			l := mode.load(r)
			if r.err != nil || l == nil {
				rows = append(rows, []string{r.v.key + " " + r.v.name, "failed", "", "", "", "", "", "", "", "", "", ""})
				continue
			}
			secs := r.elapsed.Seconds()
			rate := float64(l.handshakes) / secs
			if l.keepAlive {
				rate = float64(l.requests) / secs
			}
			vs := "-"
			if base != nil {
				b := base.fresh
				brate := float64(b.handshakes) / base.elapsed.Seconds()
				if l.keepAlive {
					b = base.keep
					brate = float64(b.requests) / base.elapsed.Seconds()
				}
				if brate > 0 {
					vs = fmt.Sprintf("%.2f", rate/brate)
				}
			}
			rot, took := "-", "-"
			if r.v.rotate {
				rot = fmt.Sprintf("%d/%d", len(r.served), r.rotations)
				if len(r.served) > 0 {
					took = fmtPct(r.served, 50) + "/" + fmtPct(r.served, 100)
				}
			}
			reloads := fmt.Sprintf("%.0f", r.reloads)
			if r.other > 0 {
				reloads += fmt.Sprintf(" (+%.0f failed)", r.other)
			}
			rows = append(rows, []string{r.v.key + " " + r.v.name, fmt.Sprintf("%.0f", rate), vs,
				fmt.Sprint(l.handshakes), fmt.Sprint(l.hsFailed), fmt.Sprint(l.requests), fmt.Sprint(l.reqFailed),
				fmtPct(l.lat, 50), fmtPct(l.lat, 99), rot, took, reloads})
			if len(l.errs) > 0 {
				notes = append(notes, fmt.Sprintf("%s: %s", r.v.key, errorSummary(l.errs)))
			}
		}
		writeTable(w, rows, 1)
		for _, n := range notes {
			fmt.Fprintf(w, "  failures %s\n", n)
		}
		fmt.Fprintln(w)
	}
}
