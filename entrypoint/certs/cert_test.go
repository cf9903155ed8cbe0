package certs

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

func TestCheckRefusesEachWayABundleIsWrong(t *testing.T) {
	ca := newCA(t)
	now := time.Now()
	year := 365 * 24 * time.Hour
	leaf, key := ca.leaf(t, []string{"a.example"}, now.Add(-time.Hour), now.Add(year))
	_, other := ca.leaf(t, []string{"b.example"}, now.Add(-time.Hour), now.Add(year))
	expired, expiredKey := ca.leaf(t, []string{"a.example"}, now.Add(-2*year), now.Add(-time.Hour))
	future, futureKey := ca.leaf(t, []string{"a.example"}, now.Add(time.Hour), now.Add(year))
	noName, noNameKey := ca.leaf(t, nil, now.Add(-time.Hour), now.Add(year))
	badName, badNameKey := ca.leaf(t, []string{"bad_name.example"}, now.Add(-time.Hour), now.Add(year))
	ecKey, _ := x509.MarshalECPrivateKey(key)
	tests := []struct {
		name string
		data []byte
		want string // in the error
	}{
		{"nothing", []byte("not PEM at all"), "no certificate"},
		{"a key alone", keyPEM(t, key), "no certificate"},
		{"a certificate without its key", certPEM(leaf), "no private key"},
		{"two keys", join(certPEM(leaf), keyPEM(t, key), keyPEM(t, key)), "more than one private key"},
		{"an encrypted key", join(certPEM(leaf), pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}})), "encrypted"},
		{"a block of another kind", join(certPEM(leaf), keyPEM(t, key), pem.EncodeToMemory(&pem.Block{Type: "DH PARAMETERS", Bytes: []byte{1}})), `unexpected PEM block "DH PARAMETERS"`},
		{"a certificate that does not parse", join(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}}), keyPEM(t, key)), "certificate 1 does not parse"},
		{"a key that does not parse", join(certPEM(leaf), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})), "private key does not parse"},
		{"the key of another certificate", join(certPEM(leaf), keyPEM(t, other)), `does not match the certificate "CN=a.example"`},
		{"the chain before the leaf", join(certPEM(ca.inter), certPEM(leaf), keyPEM(t, key)), "does not match"},
		{"a chain out of order", join(certPEM(leaf), certPEM(ca.root), certPEM(ca.inter), keyPEM(t, key)), `chain out of order: certificate 1 ("CN=a.example") is not signed by certificate 2 ("CN=test root")`},
		{"expired", join(certPEM(expired), keyPEM(t, expiredKey)), "expired on"},
		{"not valid yet", join(certPEM(future), keyPEM(t, futureKey)), "is not valid before"},
		{"no DNS name", join(certPEM(noName), keyPEM(t, noNameKey)), "has no DNS names"},
		{"a DNS name that is not one", join(certPEM(badName), keyPEM(t, badNameKey)), `names "bad_name.example", which is not a DNS name`},
		{"too large", make([]byte, maxBundle+1), "larger than"},
		{"good, EC key", join(certPEM(leaf), certPEM(ca.inter), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecKey})), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Check(tt.data, now)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Check = %v, want it accepted", err)
				}
				if c.Serial.Cmp(leaf.SerialNumber) != 0 || strings.Join(c.Names, ",") != "a.example" {
					t.Fatalf("Check = serial %v names %v", c.Serial, c.Names)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestCheckKeepsOnlyTheBlocksHAProxyNeeds(t *testing.T) {
	ca := newCA(t)
	in := join([]byte("Bag Attributes: text openssl prints\n"), ca.bundle(t, "a.example", "*.a.example"), []byte("trailing words\n"))
	c, err := Check(in, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(c.PEM), "Bag") || strings.Contains(string(c.PEM), "trailing") {
		t.Fatalf("text around the blocks reached the bundle:\n%s", c.PEM)
	}
	if n := strings.Count(string(c.PEM), "BEGIN CERTIFICATE"); n != 2 || !strings.Contains(string(c.PEM), "BEGIN PRIVATE KEY") {
		t.Fatalf("bundle has %d certificates:\n%s", n, c.PEM)
	}
	if strings.Contains(string(c.PEM), "\n\n") {
		t.Fatal("an empty line would end a runtime API payload")
	}
	if c.Expiring(time.Now()) || !c.Expiring(c.NotAfter.Add(-ExpiryWarning/2)) {
		t.Fatal("Expiring is wrong")
	}
}

func TestEnsureDefaultIsKeptAcrossRestarts(t *testing.T) {
	path := t.TempDir() + "/default.pem"
	now := time.Now()
	c1, created, err := EnsureDefault(path, now)
	if err != nil || !created {
		t.Fatalf("first EnsureDefault = %v, created %v", err, created)
	}
	c2, created, err := EnsureDefault(path, now)
	if err != nil || created || c2.Serial.Cmp(c1.Serial) != 0 {
		t.Fatalf("second EnsureDefault = %v, created %v: the certificate must be kept", err, created)
	}
	// Close to its end it is made again.
	c3, created, err := EnsureDefault(path, c1.NotAfter.Add(-time.Hour))
	if err != nil || !created || c3.Serial.Cmp(c1.Serial) == 0 {
		t.Fatalf("EnsureDefault near the end = %v, created %v", err, created)
	}
}
