// Package certs serves HTTPS certificates to the built-in configuration:
// it checks PEM bundles before use, reads them from a directory
// (SEAMLESS_CERTS_DIR) and a Consul KV prefix (SEAMLESS_CERTS_KV), obtains
// them with ACME (alone, or shared by replicas through Consul KV), and
// installs, replaces and removes them over HAProxy's runtime API without a
// reload, keeping the files HAProxy loads at its next reload identical to
// what runs.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// ExpiryWarning is how close to its end a certificate is reported as
// expiring soon (a warning and the expiry metric; it is still served).
const ExpiryWarning = 30 * 24 * time.Hour

// maxBundle bounds a bundle's size: a chain of a few certificates and a key
// takes a few KiB.
const maxBundle = 1 << 20

// Cert is a checked certificate: leaf first, its chain in order, and its
// key, re-encoded as one PEM bundle (only the blocks HAProxy needs, without
// PEM headers) so that nothing else of the input reaches HAProxy.
type Cert struct {
	PEM      []byte
	Names    []string // the leaf's DNS names
	Serial   *big.Int
	Subject  string
	Issuer   string
	NotAfter time.Time
}

// Expiring reports whether the certificate ends within ExpiryWarning of now.
func (c *Cert) Expiring(now time.Time) bool { return c.NotAfter.Sub(now) < ExpiryWarning }

// Check reads a PEM bundle: one or more CERTIFICATE blocks, the leaf first
// and each following one the issuer of the one before, and exactly one
// private key (PKCS#8, EC or RSA) that matches the leaf. The leaf must be
// valid at now and name at least one DNS name. Errors say what is wrong in
// words for an operator; the caller adds which file.
func Check(data []byte, now time.Time) (*Cert, error) {
	if len(data) > maxBundle {
		return nil, fmt.Errorf("larger than %d bytes", maxBundle)
	}
	var (
		chain  []*x509.Certificate
		keyBlk *pem.Block
		key    crypto.Signer
	)
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("certificate %d does not parse: %v", len(chain)+1, err)
			}
			chain = append(chain, c)
		case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY":
			if keyBlk != nil {
				return nil, errors.New("more than one private key")
			}
			k, err := parseKey(b)
			if err != nil {
				return nil, fmt.Errorf("the private key does not parse: %v", err)
			}
			keyBlk, key = b, k
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("the private key is encrypted: HAProxy cannot load it without a passphrase; decrypt it (openssl pkey)")
		default:
			return nil, fmt.Errorf("unexpected PEM block %s (only CERTIFICATE and one private key are accepted)", describe(b.Type))
		}
	}
	switch {
	case len(chain) == 0:
		return nil, errors.New("no certificate (no PEM block CERTIFICATE)")
	case keyBlk == nil:
		return nil, errors.New("no private key (put it in the same file, or in NAME.key beside NAME.crt)")
	}
	leaf := chain[0]
	if pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		return nil, fmt.Errorf("the private key does not match the certificate %s (the first certificate must be the leaf)", describeCert(leaf))
	}
	for i := 0; i+1 < len(chain); i++ {
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return nil, fmt.Errorf("chain out of order: certificate %d (%s) is not signed by certificate %d (%s) after it; order: leaf, then each issuer",
				i+1, describeCert(chain[i]), i+2, describeCert(chain[i+1]))
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		return nil, fmt.Errorf("certificate %s expired on %s", describeCert(leaf), leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("certificate %s is not valid before %s", describeCert(leaf), leaf.NotBefore.UTC().Format(time.RFC3339))
	case len(leaf.DNSNames) == 0:
		return nil, fmt.Errorf("certificate %s has no DNS names (subjectAltName): clients would refuse it", describeCert(leaf))
	}
	for _, n := range leaf.DNSNames {
		if !model.IsDNSName(strings.TrimPrefix(n, "*."), false) {
			return nil, fmt.Errorf("certificate %s names %s, which is not a DNS name", describeCert(leaf), describe(n))
		}
	}
	var out []byte
	for _, c := range chain {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: keyBlk.Type, Bytes: keyBlk.Bytes})...)
	return &Cert{PEM: out, Names: leaf.DNSNames, Serial: leaf.SerialNumber,
		Subject: leaf.Subject.String(), Issuer: leaf.Issuer.String(), NotAfter: leaf.NotAfter}, nil
}

func parseKey(b *pem.Block) (crypto.Signer, error) {
	var (
		k   any
		err error
	)
	switch b.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, err
	}
	switch k := k.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("unsupported key type %T", k)
}

// describeCert names a certificate by its subject (or serial) for a message.
func describeCert(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return describe(s)
	}
	return "serial " + c.SerialNumber.Text(16)
}

// describe quotes untrusted text for a message: no control character
// reaches a log line.
func describe(s string) string {
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return fmt.Sprintf("%q", s)
}
