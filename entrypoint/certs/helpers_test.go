package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

// testCA issues certificates for the tests: a root and an intermediate.
type testCA struct {
	root, inter       *x509.Certificate
	rootKey, interKey *ecdsa.PrivateKey
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var serials = big.NewInt(1000)

func nextSerial() *big.Int { serials.Add(serials, big.NewInt(1)); return new(big.Int).Set(serials) }

func issue(t testing.TB, tmpl, parent *x509.Certificate, pub any, signer *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newCA(t testing.TB) *testCA {
	ca := &testCA{rootKey: newKey(t), interKey: newKey(t)}
	now := time.Now()
	ca.root = issue(t, &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, nil, &ca.rootKey.PublicKey, ca.rootKey)
	ca.inter = issue(t, &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "test intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(5 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, ca.root, &ca.interKey.PublicKey, ca.rootKey)
	return ca
}

// leaf issues a leaf for names valid from notBefore to notAfter.
func (ca *testCA) leaf(t testing.TB, names []string, notBefore, notAfter time.Time) (*x509.Certificate, *ecdsa.PrivateKey) {
	k := newKey(t)
	cn := "no name"
	if len(names) > 0 {
		cn = names[0]
	}
	c := issue(t, &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: cn}, DNSNames: names,
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca.inter, &k.PublicKey, ca.interKey)
	return c, k
}

// bundle issues a leaf valid for a year and returns leaf, intermediate and
// key as PEM.
func (ca *testCA) bundle(t testing.TB, names ...string) []byte {
	c, k := ca.leaf(t, names, time.Now().Add(-time.Hour), time.Now().Add(365*24*time.Hour))
	return join(certPEM(c), certPEM(ca.inter), keyPEM(t, k))
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyPEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func join(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
