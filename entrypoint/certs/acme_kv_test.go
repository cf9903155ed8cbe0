package certs

import (
	"math/big"
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
