package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-acme/lego/v5/acme"
	"github.com/go-acme/lego/v5/certcrypto"
	"github.com/go-acme/lego/v5/certificate"
	"github.com/go-acme/lego/v5/challenge"
	"github.com/go-acme/lego/v5/lego"
	"github.com/go-acme/lego/v5/registration"
	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/internal/regular"
)

// SourceACME is the source label of certificates ACME obtained.
const SourceACME = "acme"

// CA directory URLs for SEAMLESS_ACME_CA.
const (
	LetsEncrypt        = "https://acme-v02.api.letsencrypt.org/directory"
	LetsEncryptStaging = "https://acme-staging-v02.api.letsencrypt.org/directory"
)

// ACMEOptions configure ACME.
type ACMEOptions struct {
	// CA is the ACME directory URL (https).
	CA string
	// Email is the account's contact.
	Email string
	// CABundle is a PEM file of roots the CA's HTTPS is verified with
	// (a private ACME server); "" uses the system's roots.
	CABundle string
	// EABKeyID and EABHMAC bind the account to an external account
	// (RFC 8555 7.3.4), for CAs that require it; both or neither.
	EABKeyID, EABHMAC string
	// Dir holds the account and the certificates (SEAMLESS_STATE_DIR/acme)
	// when KV is empty.
	Dir string
	// KV is a Consul KV prefix (SEAMLESS_ACME_KV) that holds the account
	// and the certificates instead of Dir, shared by every replica: orders
	// are placed under a Consul lock, and challenges answered by all.
	KV string
	// Consul is the client of KV.
	Consul *api.Client
	// Challenges answers HTTP-01 through HAProxy.
	Challenges *Challenges
	// Metrics counts orders; nil: none.
	Metrics *ACMEMetrics
	// RetryMin and RetryMax bound the backoff after a failed order
	// (defaults 1m and 6h); a rate limit's Retry-After is waited out when
	// longer.
	RetryMin, RetryMax time.Duration
	Now                func() time.Time
	Log                *slog.Logger
}

// ACME obtains and renews certificates for the exact hosts the routes
// name that no certificate of SEAMLESS_CERTS_DIR covers, one order at a
// time, answering HTTP-01 through HAProxy. Renewal starts two thirds into
// a certificate's lifetime; a failed order is retried with backoff, and
// meanwhile the host keeps what it has (its previous certificate until it
// ends, else the default one).
type ACME struct {
	o      ACMEOptions
	log    *slog.Logger
	http   *http.Client
	client *lego.Client // made by the first order; only the ordering goroutine uses it
	store  acmeStore
	// replica is this replica's Consul session while it is announced
	// under SEAMLESS_ACME_KV, else "".
	replica atomic.Value
	certs   map[string]*acmeCert
	dir     Set
}

// NewACME checks the options: errors name the variable at fault.
func NewACME(o ACMEOptions) (*ACME, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.RetryMin <= 0 {
		o.RetryMin = time.Minute
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(6*time.Hour, o.RetryMin)
	}
	if u, err := url.Parse(o.CA); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("SEAMLESS_ACME_CA: %s is not an https:// URL of an ACME directory", describe(o.CA))
	}
	if at := strings.IndexByte(o.Email, '@'); at < 1 || at == len(o.Email)-1 || strings.ContainsAny(o.Email, " \t\r\n<>,;") {
		return nil, fmt.Errorf("SEAMLESS_ACME_EMAIL: %s is not an email address", describe(o.Email))
	}
	if (o.EABKeyID == "") != (o.EABHMAC == "") {
		return nil, errors.New("SEAMLESS_ACME_EAB_KID and SEAMLESS_ACME_EAB_HMAC: set both or neither")
	}
	if o.Challenges == nil || o.Dir == "" && o.KV == "" || o.KV != "" && o.Consul == nil {
		return nil, errors.New("ACME: no challenge map, state directory or Consul client (internal error)")
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	if o.CABundle != "" {
		pem, err := regular.ReadFile(o.CABundle)
		if err != nil {
			return nil, fmt.Errorf("SEAMLESS_ACME_CA_BUNDLE: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("SEAMLESS_ACME_CA_BUNDLE: %s holds no PEM certificate", o.CABundle)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	a := &ACME{o: o, log: o.Log.With("component", "acme"), http: &http.Client{Timeout: 2 * time.Minute, Transport: tr}}
	a.store = fileStore{dir: o.Dir}
	if o.KV != "" {
		a.store = kvStore{c: o.Consul, prefix: a.kvPrefix()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	var err error
	if a.certs, err = a.loadCerts(ctx); err != nil {
		// Consul down at start: the watch brings them when it answers.
		a.log.Warn("the stored certificates cannot be read now", "err", err)
	}
	return a, nil
}

// Initial returns dir with the stored certificates that dir does not
// cover, for the files HAProxy starts with: the hosts routed are not
// known yet, and a host routed before is likely routed again.
func (a *ACME) Initial(dir Set) Set {
	a.dir = dir
	return a.merged(nil, false)
}

// covered reports whether a certificate of set serves host.
func covered(host string, set Set) bool {
	for _, e := range set.Certs {
		for _, n := range e.Names {
			n = strings.ToLower(n)
			if n == host {
				return true
			}
			if rest, ok := strings.CutPrefix(n, "*."); ok {
				if _, parent, ok := strings.Cut(host, "."); ok && parent == rest {
					return true
				}
			}
		}
	}
	return false
}

// wanted lists the routed hosts ACME serves: those SEAMLESS_CERTS_DIR does
// not cover.
func (a *ACME) wanted(hosts []string) []string {
	var out []string
	for _, h := range hosts {
		if !covered(h, a.dir) {
			out = append(out, h)
		}
	}
	return out
}

// merged is the set to install: the directory's certificates, and ACME's
// unexpired ones for the wanted hosts (every stored one while the hosts
// are not known).
func (a *ACME) merged(hosts []string, known bool) Set {
	out := Set{Certs: maps.Clone(a.dir.Certs)}
	if out.Certs == nil {
		out.Certs = map[string]*Entry{}
	}
	if !known {
		hosts = slices.Collect(maps.Keys(a.certs))
	}
	now := a.o.Now()
	for _, h := range a.wanted(hosts) {
		if c, ok := a.certs[h]; ok && now.Before(c.NotAfter) {
			out.Certs[c.Name] = c.Entry
		}
	}
	return out
}

type orderResult struct {
	host    string
	cert    *acmeCert
	adopted bool // stored by another replica while this one waited for the lock
	err     error
}

// Run keeps out supplied with the certificates to serve: every set from
// dirs (SEAMLESS_CERTS_DIR) with ACME's for the hosts last received from
// hosts, ordering and renewing as needed, until ctx ends. The first set
// it compares with is Initial's.
func (a *ACME) Run(ctx context.Context, dirs <-chan Set, hosts <-chan []string, out chan<- Set) {
	var (
		routed  []string
		known   bool
		busy    string // the host being ordered
		results = make(chan orderResult, 1)
		stored  = make(chan map[string]*acmeCert)
		watches sync.WaitGroup
		next    = map[string]time.Time{} // no order for the host before
		backoff = map[string]time.Duration{}
		last    = a.merged(nil, false)
		pending *Set
		timer   = time.NewTimer(time.Hour)
	)
	if a.o.KV != "" {
		wctx, cancel := context.WithCancel(ctx)
		watches.Go(func() { a.watchStored(wctx, stored) })
		watches.Go(func() { a.syncChallenges(wctx) })
		watches.Go(func() { a.presence(wctx) })
		defer func() { cancel(); watches.Wait() }()
	}
	defer func() {
		timer.Stop()
		if busy != "" {
			<-results // the order ends with ctx
		}
	}()
	for {
		now := a.o.Now()
		wanted := a.wanted(routed)
		if busy == "" {
			for _, h := range wanted {
				if c := a.certs[h]; (c == nil || !now.Before(c.renewAt)) && !now.Before(next[h]) {
					busy = h
					go func() {
						c, adopted, err := a.order(ctx, h)
						results <- orderResult{h, c, adopted, err}
					}()
					break
				}
			}
		}
		if m := a.merged(routed, known); !m.equal(last) {
			last, pending = m, &m
		}
		var wake time.Time
		soonest := func(t time.Time) {
			if t.After(now) && (wake.IsZero() || t.Before(wake)) {
				wake = t
			}
		}
		for _, h := range wanted {
			c := a.certs[h]
			if c != nil {
				soonest(c.NotAfter) // dropped when it ends
			}
			if busy == "" {
				t := next[h]
				if c != nil && c.renewAt.After(t) {
					t = c.renewAt
				}
				soonest(t)
			}
		}
		timer.Stop()
		if !wake.IsZero() {
			timer.Reset(wake.Sub(now))
		}
		var send chan<- Set
		var ps Set
		if pending != nil {
			send, ps = out, *pending
		}
		select {
		case <-ctx.Done():
			return
		case s := <-dirs:
			a.dir = s
		case h := <-hosts:
			routed, known = h, true
		case r := <-results:
			busy = ""
			a.result(r, next, backoff)
		case m := <-stored:
			for h, c := range m {
				if cur := a.certs[h]; cur == nil || !bytes.Equal(cur.PEM, c.PEM) && c.NotAfter.After(cur.NotAfter) {
					a.certs[h] = c
					delete(next, h)
					delete(backoff, h)
					a.log.Info("certificate taken from Consul KV", "host", h, "serial", c.Serial.Text(16),
						"not_after", c.NotAfter.UTC().Format(time.RFC3339))
				}
			}
		case <-timer.C:
		case send <- ps:
			pending = nil
		}
	}
}

// result records an order's end: the certificate, or when to try again.
func (a *ACME) result(r orderResult, next map[string]time.Time, backoff map[string]time.Duration) {
	if r.err == nil && r.adopted {
		a.certs[r.host] = r.cert
		delete(next, r.host)
		delete(backoff, r.host)
		a.log.Info("certificate ordered by another replica; no order placed", "host", r.host, "serial", r.cert.Serial.Text(16))
		return
	}
	if r.err == nil {
		a.certs[r.host] = r.cert
		delete(next, r.host)
		delete(backoff, r.host)
		a.o.Metrics.order(OrderIssued)
		a.log.Info("certificate obtained", "host", r.host, "serial", r.cert.Serial.Text(16), "issuer", r.cert.Issuer,
			"not_after", r.cert.NotAfter.UTC().Format(time.RFC3339), "renew_at", r.cert.renewAt.UTC().Format(time.RFC3339))
		return
	}
	b := min(max(2*backoff[r.host], a.o.RetryMin), a.o.RetryMax)
	backoff[r.host] = b
	wait := b
	result := OrderFailed
	var rl *acme.RateLimitedError
	if errors.As(r.err, &rl) {
		result = OrderRateLimited
		wait = max(wait, rl.RetryAfter)
	}
	next[r.host] = a.o.Now().Add(wait)
	a.o.Metrics.order(result)
	serving := "the default certificate keeps serving it"
	if c := a.certs[r.host]; c != nil && a.o.Now().Before(c.NotAfter) {
		serving = "its current certificate keeps serving it until " + c.NotAfter.UTC().Format(time.RFC3339)
	}
	a.log.Error("ACME order failed; "+serving, "host", r.host, "result", result, "retry_in", wait.String(), "err", r.err)
}

// order obtains a certificate for host and stores it. With
// SEAMLESS_ACME_KV it does so under the Consul lock, and returns the
// stored certificate instead (adopted) when another replica ordered it
// meanwhile.
func (a *ACME) order(ctx context.Context, host string) (_ *acmeCert, adopted bool, _ error) {
	if a.o.KV != "" {
		lctx, unlock, err := a.lock(ctx)
		if err != nil {
			return nil, false, err
		}
		defer unlock()
		ctx = lctx
		if c, err := a.loadCert(ctx, host); err == nil && a.o.Now().Before(c.renewAt) {
			return c, true, nil
		}
	}
	c, err := a.obtain(ctx, host)
	return c, false, err
}

func (a *ACME) obtain(ctx context.Context, host string) (*acmeCert, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := a.legoClient(ctx)
	if err != nil {
		return nil, err
	}
	a.log.Info("ordering a certificate", "host", host, "ca", a.o.CA)
	res, err := c.Certificate.Obtain(ctx, certificate.ObtainRequest{Domains: []string{host}, Bundle: true, KeyType: certcrypto.EC256})
	var pd *acme.ProblemDetails
	if errors.As(err, &pd) && pd.Type == acme.AccountDoesNotExistErrorType {
		// The CA forgot the account (a reset test CA, a deactivation):
		// the next attempt registers again with the same key.
		a.client = nil
		a.forgetAccount(ctx)
	}
	if err != nil {
		return nil, err
	}
	bundle := append(append(append([]byte{}, res.Certificate...), '\n'), res.PrivateKey...)
	ac, err := a.entry(host, bundle)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate is refused: %w", err)
	}
	if err := a.store.put(ctx, certName(host), ac.PEM); err != nil {
		return nil, fmt.Errorf("storing the certificate: %w", err)
	}
	return ac, nil
}

// provider answers HTTP-01: through every replica with SEAMLESS_ACME_KV.
func (a *ACME) provider() challenge.Provider {
	if a.o.KV != "" {
		return sharedChallenges{a}
	}
	return a.o.Challenges
}

// legoClient returns the ACME client, registering the account at the
// first use.
func (a *ACME) legoClient(ctx context.Context) (*lego.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	u, err := a.loadAccount(ctx)
	if err != nil {
		return nil, err
	}
	cfg := lego.NewConfig(u)
	cfg.CADirURL = a.o.CA
	cfg.HTTPClient = a.http
	cfg.UserAgent = "seamless"
	c, err := lego.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("ACME directory %s: %w", a.o.CA, err)
	}
	if err := c.Challenge.SetHTTP01Provider(a.provider()); err != nil {
		return nil, err
	}
	if u.reg == nil {
		if a.o.EABKeyID != "" {
			u.reg, err = c.Registration.RegisterWithExternalAccountBinding(ctx, registration.RegisterEABOptions{
				TermsOfServiceAgreed: true, Kid: a.o.EABKeyID, HmacEncoded: a.o.EABHMAC})
		} else {
			u.reg, err = c.Registration.Register(ctx, registration.RegisterOptions{TermsOfServiceAgreed: true})
		}
		if err != nil {
			return nil, fmt.Errorf("ACME account registration: %w", err)
		}
		if err := a.saveAccount(ctx, u); err != nil {
			return nil, err
		}
		a.log.Info("ACME account registered", "ca", a.o.CA, "email", a.o.Email, "account", u.reg.Location)
		// The client signs with the account URL from now on.
		if c, err = lego.NewClient(cfg); err != nil {
			return nil, err
		}
		if err := c.Challenge.SetHTTP01Provider(a.provider()); err != nil {
			return nil, err
		}
	}
	a.client = c
	return c, nil
}
