package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"time"

	"github.com/seamless-lb/seamless/internal/regular"
)

// DefaultName is the DNS name of the self-signed default certificate: in
// the reserved .invalid domain, so that it never matches a real host.
const DefaultName = "seamless.invalid"

// defaultLifetime is the self-signed certificate's validity. No client
// trusts it anyway; it is made again when it comes within ExpiryWarning of
// its end.
const defaultLifetime = 10 * 365 * 24 * time.Hour

// EnsureDefault returns the self-signed default certificate kept at path,
// served to clients whose SNI no certificate names (or who send none), so
// that the HTTPS frontend always starts. A file that is missing, does not
// pass Check or is expiring is replaced by a new ECDSA P-256 certificate;
// a good one is kept across restarts.
func EnsureDefault(path string, now time.Time) (c *Cert, created bool, err error) {
	data, err := regular.ReadFile(path)
	if err == nil {
		if c, err := Check(data, now); err == nil && !c.Expiring(now) {
			return c, false, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("default certificate %s: %w", path, err)
	}
	data, err = selfSigned(now)
	if err != nil {
		return nil, false, fmt.Errorf("default certificate: %w", err)
	}
	c, err = Check(data, now)
	if err != nil {
		return nil, false, fmt.Errorf("default certificate: %w", err)
	}
	if err := writeFile(path, c.PEM); err != nil {
		return nil, false, fmt.Errorf("default certificate: %w", err)
	}
	return c, true, nil
}

func selfSigned(now time.Time) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: DefaultName, Organization: []string{"seamless default certificate"}},
		DNSNames:     []string{DefaultName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(defaultLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...), nil
}
