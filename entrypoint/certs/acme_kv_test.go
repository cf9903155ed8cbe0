package certs

import (
	"context"
	"log/slog"
	"maps"
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// Two replicas, each with its own HAProxy, share one Consul and one
// Pebble, which validates through the first replica's HAProxy only: the
// second's challenges reach it through Consul KV. Exactly one order is
// placed per host and per renewal, and both serve the same certificate.
func TestACMEReplicasPlaceOneOrderPerHostThroughConsul(t *testing.T) {
	consul := testenv.Consul(t)
	c := consul.Client()
	hosts := []string{"app.test", "api.test"}
	// Renewal two thirds into 45 s: 30 s after issuance, after the three
	// first orders (about 5 s each, one at a time under the lock).
	a, peb := newACMERig(t, rigOptions{
		pebble: func(port int) *testenv.PebbleServer {
			return testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: port, Validity: 45 * time.Second})
		},
		hosts: hosts, consul: c, kv: "seamless/acme",
	})
	b, _ := newACMERig(t, rigOptions{pebble: func(int) *testenv.PebbleServer { return peb }, hosts: hosts, consul: c, kv: "seamless/acme"})
	a.run()
	b.run()
	// A host only the second replica routes: its order's challenge is
	// answered by the first replica's HAProxy, through Consul KV.
	b.hosts <- append(hosts, "b-only.test")
	roots := peb.Roots()

	same := func(host string) (*big.Int, bool) {
		sa, errA := verified(a.https, host, roots)
		sb, errB := verified(b.https, host, roots)
		return sa, errA == nil && errB == nil && sa.Cmp(sb) == 0
	}
	first := map[string]*big.Int{}
	for _, h := range hosts {
		testenv.Eventually(t, 30*time.Second, "both replicas serve the same certificate for "+h, func() bool {
			s, ok := same(h)
			first[h] = s
			return ok
		})
	}
	testenv.Eventually(t, 30*time.Second, "the second replica serves b-only.test, validated through the first", func() bool {
		_, err := verified(b.https, "b-only.test", roots)
		return err == nil
	})
	issued := func() float64 {
		return testutil.ToFloat64(a.metrics.orders.WithLabelValues(OrderIssued)) +
			testutil.ToFloat64(b.metrics.orders.WithLabelValues(OrderIssued))
	}
	if n := issued(); n != float64(len(hosts)+1) {
		t.Fatalf("%v orders issued by the two replicas for %d hosts, want one per host", n, len(hosts)+1)
	}
	obtained := func(host string) int {
		n := 0
		for _, l := range strings.Split(a.logs.String()+b.logs.String(), "\n") {
			if strings.Contains(l, `msg="certificate obtained"`) && strings.Contains(l, "host="+host+" ") {
				n++
			}
		}
		return n
	}
	for _, h := range append(hosts, "b-only.test") {
		if n := obtained(h); n != 1 {
			t.Fatalf("%s was ordered %d times", h, n)
		}
	}

	// Renewal: one replica renews, the other installs what it stored.
	testenv.Eventually(t, 45*time.Second, "both replicas serve app.test's renewed certificate", func() bool {
		s, ok := same("app.test")
		return ok && s.Cmp(first["app.test"]) != 0
	})
	if n := obtained("app.test"); n != 2 {
		t.Fatalf("app.test was ordered %d times, want 2: the first certificate and one renewal", n)
	}
	logs := a.logs.String() + b.logs.String()
	if !strings.Contains(logs, "no order placed") {
		t.Fatal("no replica took a certificate the other ordered while it waited for the lock")
	}
	// Every replica served every challenge before the CA was asked.
	if strings.Contains(logs, "not every replica confirmed") || strings.Contains(logs, "cannot serve another replica's") {
		t.Fatal("a challenge was not served by both replicas")
	}
	if n := testutil.ToFloat64(a.metrics.orders.WithLabelValues(OrderFailed)) + testutil.ToFloat64(b.metrics.orders.WithLabelValues(OrderFailed)); n != 0 {
		t.Fatalf("%v orders failed", n)
	}
	t.Logf("orders issued: %v by the replica the CA validates through, %v by the other",
		testutil.ToFloat64(a.metrics.orders.WithLabelValues(OrderIssued)), testutil.ToFloat64(b.metrics.orders.WithLabelValues(OrderIssued)))
}

// What another replica stored is checked like anything from outside: a
// key that names no DNS host or a certificate for another host is not
// used, and logged once.
func TestACMEStoredCertificatesFromKVAreChecked(t *testing.T) {
	consul := testenv.Consul(t)
	c := consul.Client()
	ca := newCA(t)
	for key, v := range map[string][]byte{
		"seamless/acme/certs/app.test.pem":     ca.bundle(t, "app.test"),
		"seamless/acme/certs/other.test.pem":   ca.bundle(t, "app.test"),
		"seamless/acme/certs/bad host!.pem":    ca.bundle(t, "app.test"),
		"seamless/acme/certs/garbage.test.pem": []byte("not PEM"),
	} {
		kvPut(t, c, key, v)
	}
	ch, err := NewChallenges(filepath.Join(t.TempDir(), "challenges.map"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	a, err := NewACME(ACMEOptions{CA: LetsEncryptStaging, Email: "ops@example.com", KV: "seamless/acme", Consul: c, Challenges: ch,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.certs) != 1 || a.certs["app.test"] == nil {
		t.Fatalf("loaded %v, want app.test alone", slices.Collect(maps.Keys(a.certs)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stored := make(chan map[string]*acmeCert)
	go a.watchStored(ctx, stored)
	m := <-stored
	if len(m) != 1 || m["app.test"] == nil {
		t.Fatalf("watched %v, want app.test alone", slices.Collect(maps.Keys(m)))
	}
	kvPut(t, c, "seamless/acme/certs/app.test.pem", ca.bundle(t, "app.test")) // another change: nothing logged again
	<-stored
	if n := strings.Count(logs.String(), "host=other.test"); n != 2 { // once at load, once by the watch
		t.Fatalf("other.test's refusal logged %d times:\n%s", n, logs.String())
	}
}

// A Consul restarted without its data empties PREFIX/certs/: the watch
// of the stored certificates never removes one, so the host keeps its
// certificate, with no reload and no new order.
func TestACMECertificatesSurviveAConsulRestartedEmpty(t *testing.T) {
	consul := testenv.Consul(t)
	r, peb := newACMERig(t, rigOptions{
		pebble: func(port int) *testenv.PebbleServer {
			return testenv.Pebble(t, testenv.PebbleOptions{HTTPPort: port, Validity: time.Hour})
		},
		hosts: []string{"app.test"}, consul: consul.Client(), kv: "seamless/acme",
	})
	before := r.reloads(t)
	r.run()
	roots := peb.Roots()
	var first *big.Int
	testenv.Eventually(t, 30*time.Second, "app.test is served its certificate", func() bool {
		s, err := verified(r.https, "app.test", roots)
		first = s
		return err == nil
	})
	consul.Stop()
	consul.Wipe()
	consul.Start()
	testenv.Eventually(t, 60*time.Second, "the watch of the stored certificates sees the emptied Consul", func() bool {
		for _, l := range strings.Split(r.logs.String(), "\n") {
			if strings.Contains(l, "starting the watch over") && strings.Contains(l, "prefix=seamless/acme/certs/") {
				return true
			}
		}
		return false
	})
	for range 50 {
		if s, err := verified(r.https, "app.test", roots); err != nil || s.Cmp(first) != 0 {
			t.Fatalf("after Consul came back empty app.test serves %v (%v), not its certificate %x", s, err, first)
		}
	}
	if n := testutil.ToFloat64(r.metrics.orders.WithLabelValues(OrderIssued)); n != 1 {
		t.Fatalf("%v orders issued, want the first alone", n)
	}
	if now := r.reloads(t); now != before {
		t.Fatalf("HAProxy reloaded %d times", now-before)
	}
}
