package certs

import (
	"context"
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

// What ACME stores, as files under SEAMLESS_STATE_DIR/acme (every one
// 0600) or as keys under SEAMLESS_ACME_KV:
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

// acmeStore keeps ACME's account and certificates by name
// ("accounts/HASH/key.pem", "certs/HOST.pem"): files under
// SEAMLESS_STATE_DIR/acme, or keys under SEAMLESS_ACME_KV shared by the
// replicas.
type acmeStore interface {
	// get returns errNotStored when name holds nothing.
	get(ctx context.Context, name string) ([]byte, error)
	put(ctx context.Context, name string, data []byte) error
	del(ctx context.Context, name string) error
	// list returns the base names under dir ("certs").
	list(ctx context.Context, dir string) ([]string, error)
	// where says where name is kept, for messages.
	where(name string) string
}

var errNotStored = errors.New("not stored")

// fileStore is acmeStore in a directory, every file 0600.
type fileStore struct{ dir string }

func (s fileStore) where(name string) string { return filepath.Join(s.dir, filepath.FromSlash(name)) }

func (s fileStore) get(_ context.Context, name string) ([]byte, error) {
	b, err := regular.ReadFile(s.where(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNotStored
	}
	return b, err
}

func (s fileStore) put(_ context.Context, name string, data []byte) error {
	return writeFile(s.where(name), data)
}

func (s fileStore) del(_ context.Context, name string) error {
	if err := os.Remove(s.where(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (s fileStore) list(_ context.Context, dir string) ([]string, error) {
	ents, err := os.ReadDir(s.where(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, err
}

// storeTimeout bounds one store operation outside an order.
const storeTimeout = 10 * time.Second

func (a *ACME) accountDir() string {
	h := sha256.Sum256([]byte(a.o.CA))
	return "accounts/" + hex.EncodeToString(h[:8])
}

// loadAccount reads the stored account of the CA, or makes a key for a new
// one (registered by the caller, then saved with saveAccount).
func (a *ACME) loadAccount(ctx context.Context) (*acmeUser, error) {
	keyName := a.accountDir() + "/key.pem"
	u := &acmeUser{email: a.o.Email}
	data, err := a.store.get(ctx, keyName)
	switch {
	case errors.Is(err, errNotStored):
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		u.key = k
		return u, nil
	case err != nil:
		return nil, fmt.Errorf("ACME account key %s: %w", a.store.where(keyName), err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("ACME account key %s: no PEM block", a.store.where(keyName))
	}
	if u.key, err = parseKey(b); err != nil {
		return nil, fmt.Errorf("ACME account key %s: %w", a.store.where(keyName), err)
	}
	if data, err = a.store.get(ctx, a.accountDir()+"/account.json"); err == nil {
		var reg acme.ExtendedAccount
		if json.Unmarshal(data, &reg) == nil && reg.Location != "" {
			u.reg = &reg
		}
	}
	return u, nil
}

func (a *ACME) saveAccount(ctx context.Context, u *acmeUser) error {
	der, err := x509.MarshalPKCS8PrivateKey(u.key)
	if err != nil {
		return err
	}
	if err := a.store.put(ctx, a.accountDir()+"/key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return fmt.Errorf("ACME account key: %w", err)
	}
	reg, err := json.MarshalIndent(u.reg, "", "  ")
	if err != nil {
		return err
	}
	if err := a.store.put(ctx, a.accountDir()+"/account.json", reg); err != nil {
		return fmt.Errorf("ACME account: %w", err)
	}
	return nil
}

// forgetAccount drops the stored registration, keeping the key.
func (a *ACME) forgetAccount(ctx context.Context) {
	if err := a.store.del(ctx, a.accountDir()+"/account.json"); err != nil {
		a.log.Warn("cannot remove the ACME account's registration", "err", err)
	}
}

// acmeCert is a certificate ACME obtained for one host.
type acmeCert struct {
	*Entry
	renewAt time.Time // two thirds into its lifetime
}

func certName(host string) string { return "certs/" + host + ".pem" }

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
	return &acmeCert{Entry: &Entry{Name: acmeName(host), Source: SourceACME, File: a.store.where(certName(host)), Cert: c},
		renewAt: leaf.NotBefore.Add(life * 2 / 3)}, nil
}

// acmeName is the installed name of host's certificate: a leading '.'
// never comes from SEAMLESS_CERTS_DIR, whose hidden files are ignored.
func acmeName(host string) string { return ".acme-" + host }

// loadCerts reads the stored certificates that are still valid.
func (a *ACME) loadCerts(ctx context.Context) (map[string]*acmeCert, error) {
	names, err := a.store.list(ctx, "certs")
	if err != nil {
		return map[string]*acmeCert{}, fmt.Errorf("stored ACME certificates: %w", err)
	}
	out := map[string]*acmeCert{}
	for _, n := range names {
		host, ok := strings.CutSuffix(n, ".pem")
		if !ok || !model.IsDNSName(host, false) {
			continue
		}
		c, err := a.loadCert(ctx, host)
		if err != nil {
			a.log.Warn("stored ACME certificate not used; a new one is ordered when the host is routed", "host", host,
				"stored", a.store.where(certName(host)), "err", err)
			continue
		}
		out[host] = c
	}
	return out, nil
}

// loadCert reads host's stored certificate; errNotStored when none.
func (a *ACME) loadCert(ctx context.Context, host string) (*acmeCert, error) {
	data, err := a.store.get(ctx, certName(host))
	if err != nil {
		return nil, err
	}
	return a.entry(host, data)
}
