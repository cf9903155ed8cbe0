package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-acme/lego/v5/acme"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/regular"
)

// ACME's files under SEAMLESS_STATE_DIR/acme, every one 0600:
//
//	accounts/HASH/key.pem       the account key of the CA whose directory URL hashes to HASH
//	accounts/HASH/account.json  its registration (the account URL)
//	certs/HOST.pem              the latest certificate of HOST: leaf, chain, key

// acmeUser is lego's registration.User.
type acmeUser struct {
	email string
	key   crypto.Signer
	reg   *acme.ExtendedAccount
}

func (u *acmeUser) GetEmail() string                       { return u.email }
func (u *acmeUser) GetRegistration() *acme.ExtendedAccount { return u.reg }
func (u *acmeUser) GetPrivateKey() crypto.Signer           { return u.key }

func (a *ACME) accountDir() string {
	h := sha256.Sum256([]byte(a.o.CA))
	return filepath.Join(a.o.Dir, "accounts", hex.EncodeToString(h[:8]))
}

// loadAccount reads the stored account of the CA, or makes a key for a new
// one (registered by the caller, then saved with saveAccount).
func (a *ACME) loadAccount() (*acmeUser, error) {
	dir := a.accountDir()
	u := &acmeUser{email: a.o.Email}
	data, err := regular.ReadFile(filepath.Join(dir, "key.pem"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		u.key = k
		return u, nil
	case err != nil:
		return nil, fmt.Errorf("ACME account key: %w", err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("ACME account key %s: no PEM block", filepath.Join(dir, "key.pem"))
	}
	if u.key, err = parseKey(b); err != nil {
		return nil, fmt.Errorf("ACME account key %s: %w", filepath.Join(dir, "key.pem"), err)
	}
	if data, err = regular.ReadFile(filepath.Join(dir, "account.json")); err == nil {
		var reg acme.ExtendedAccount
		if json.Unmarshal(data, &reg) == nil && reg.Location != "" {
			u.reg = &reg
		}
	}
	return u, nil
}

func (a *ACME) saveAccount(u *acmeUser) error {
	der, err := x509.MarshalPKCS8PrivateKey(u.key)
	if err != nil {
		return err
	}
	dir := a.accountDir()
	if err := writeFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return fmt.Errorf("ACME account key: %w", err)
	}
	reg, err := json.MarshalIndent(u.reg, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "account.json"), reg); err != nil {
		return fmt.Errorf("ACME account: %w", err)
	}
	return nil
}

// forgetAccount drops the stored registration, keeping the key.
func (a *ACME) forgetAccount() {
	if err := os.Remove(filepath.Join(a.accountDir(), "account.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("cannot remove the ACME account's registration", "err", err)
	}
}

// acmeCert is a certificate ACME obtained for one host.
type acmeCert struct {
	*Entry
	renewAt time.Time // two thirds into its lifetime
}

func (a *ACME) certFile(host string) string { return filepath.Join(a.o.Dir, "certs", host+".pem") }

// entry checks a bundle obtained for host.
func (a *ACME) entry(host string, bundle []byte) (*acmeCert, error) {
	c, err := Check(bundle, a.o.Now())
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(bundle)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, err
	}
	if leaf.VerifyHostname(host) != nil {
		return nil, fmt.Errorf("the certificate does not name %s", host)
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return &acmeCert{Entry: &Entry{Name: acmeName(host), Source: SourceACME, File: a.certFile(host), Cert: c},
		renewAt: leaf.NotBefore.Add(life * 2 / 3)}, nil
}

// acmeName is the installed name of host's certificate: a leading '.'
// never comes from SEAMLESS_CERTS_DIR, whose hidden files are ignored.
func acmeName(host string) string { return ".acme-" + host }

// loadCerts reads the stored certificates that are still valid.
func (a *ACME) loadCerts() map[string]*acmeCert {
	out := map[string]*acmeCert{}
	ents, _ := os.ReadDir(filepath.Join(a.o.Dir, "certs"))
	for _, de := range ents {
		host, ok := strings.CutSuffix(de.Name(), ".pem")
		if !ok || !model.IsDNSName(host, false) {
			continue
		}
		data, err := regular.ReadFile(a.certFile(host))
		if err == nil {
			var c *acmeCert
			if c, err = a.entry(host, data); err == nil {
				out[host] = c
				continue
			}
		}
		a.log.Warn("stored ACME certificate not used; a new one is ordered when the host is routed", "host", host,
			"file", a.certFile(host), "err", err)
	}
	return out
}
