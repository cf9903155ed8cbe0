package certs

import (
	"context"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func kvPut(t *testing.T, c *api.Client, key string, value []byte) {
	t.Helper()
	if _, err := c.KV().Put(&api.KVPair{Key: key, Value: value}, nil); err != nil {
		t.Fatal(err)
	}
}

// Certificates put into, replaced in and deleted from a Consul KV prefix
// reach a real HAProxy over the runtime API, merged with the directory's;
// a bad value is refused naming its key while the last good one serves.
func TestKVCertificatesAreServedWithoutAReload(t *testing.T) {
	consul := testenv.Consul(t)
	c := consul.Client()
	ca := newCA(t)
	dirPEM := ca.bundle(t, "shared.example")
	dirCert, err := Check(dirPEM, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := Set{Certs: map[string]*Entry{"shared": {Name: "shared", Source: SourceDir, File: "/certs/shared.pem", Cert: dirCert}}}
	aPEM := ca.bundle(t, "a.example")
	kvPut(t, c, "tls/certs/a", aPEM)
	kvPut(t, c, "tls/certs/shared", ca.bundle(t, "shared.example")) // the directory's name: the directory wins

	var logs logBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	kv := NewKV(c, "tls/certs", 30*time.Second, nil, log)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	first, err := kv.Read(ctx)
	cancel()
	if err != nil || len(first.Certs) != 2 {
		t.Fatalf("Read = %d certificates, %v", len(first.Certs), err)
	}
	set, _ := Merge(dir, first)
	var cliRef atomic.Pointer[haproxy.MasterCLI]
	inst, err := NewInstaller(InstallerOptions{Dir: t.TempDir() + "/certs", CLI: cliFunc(func(ctx context.Context, cmd string) (string, error) {
		return cliRef.Load().Do(ctx, cmd)
	}), Reload: func(reason string) { t.Errorf("reload asked for: %s", reason) }, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(set); err != nil {
		t.Fatal(err)
	}
	addr, cli := startHAProxy(t, inst.CrtList())
	cliRef.Store(cli)
	if got := mustServe(t, addr, "a.example"); got.Cmp(serial(t, aPEM)) != 0 {
		t.Fatalf("a.example serves %x at start, not the KV's certificate", got)
	}
	if got := mustServe(t, addr, "shared.example"); got.Cmp(dirCert.Serial) != 0 {
		t.Fatalf("shared.example serves %x, not the directory's certificate", got)
	}

	rctx, stop := context.WithCancel(context.Background())
	kvSets, merged := make(chan Set), make(chan Set)
	var wg sync.WaitGroup
	wg.Go(func() { kv.Run(rctx, first, kvSets) })
	wg.Go(func() { RunMerge(rctx, dir, first, nil, kvSets, merged, log) })
	wg.Go(func() { inst.Run(rctx, merged) })
	defer func() { stop(); wg.Wait() }()
	before, err := cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// RunMerge logs the shadowed name from its own goroutine.
	testenv.Eventually(t, 10*time.Second, "the shadowed KV certificate is logged", func() bool {
		return strings.Contains(logs.String(), "the directory's serves")
	})

	// Put: served, and how soon is measured.
	bPEM := ca.bundle(t, "b.example")
	put := time.Now()
	kvPut(t, c, "tls/certs/b", bPEM)
	testenv.Eventually(t, 10*time.Second, "the certificate put into KV is served", func() bool {
		s, _, err := served(addr, "b.example")
		return err == nil && s.Cmp(serial(t, bPEM)) == 0
	})
	t.Logf("the certificate put into KV was served %s after the put", time.Since(put).Round(time.Millisecond))

	// A mismatched key: refused naming the key, never the key material;
	// the old certificate keeps serving.
	leaf, _ := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	_, otherKey := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	badKey := keyPEM(t, otherKey)
	kvPut(t, c, "tls/certs/a", join(certPEM(leaf), badKey))
	kvPut(t, c, "tls/certs/deeper/x", bPEM)
	testenv.Eventually(t, 10*time.Second, "the refusals are logged with their keys", func() bool {
		l := logs.String()
		return strings.Contains(l, "key=tls/certs/a ") && strings.Contains(l, "does not match") &&
			strings.Contains(l, "key=tls/certs/deeper/x ")
	})
	keyBody := strings.Split(string(badKey), "\n")[1]
	if strings.Contains(logs.String(), keyBody) {
		t.Fatal("the log holds the private key")
	}
	if got := mustServe(t, addr, "a.example"); got.Cmp(serial(t, aPEM)) != 0 {
		t.Fatalf("after a bad value a.example serves %x, not its last good certificate", got)
	}

	// Consul down: the set in use stays; back, a change applies again.
	consul.Stop()
	testenv.Eventually(t, 10*time.Second, "the failure is logged", func() bool {
		return strings.Contains(logs.String(), "cannot read Consul KV")
	})
	if got := mustServe(t, addr, "b.example"); got.Cmp(serial(t, bPEM)) != 0 {
		t.Fatalf("with Consul down b.example serves %x", got)
	}
	consul.Start()

	// Deleted: removed, the default certificate answers. Right after the
	// restart the watch may have seen Consul's index go back, and then
	// holds removals for the 30 s hold (by design): allow for it.
	if _, err := c.KV().Delete("tls/certs/b", nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 45*time.Second, "the deleted certificate is removed", func() bool {
		s, _, err := served(addr, "b.example")
		return err == nil && s.Cmp(inst.def.Serial) == 0
	})
	now, err := cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if now.Master.Reloads != before.Master.Reloads {
		t.Fatalf("HAProxy reloaded %d times", now.Master.Reloads-before.Master.Reloads)
	}
}

// A Consul that comes back without its data (its index goes backwards)
// removes no certificate for the hold: they keep serving, with no reload;
// one put again meanwhile is served at once; one still missing when the
// hold ends is removed. One answer that empties the prefix of more than
// one certificate is held the same way.
func TestKVCertificatesSurviveAConsulRestartedEmpty(t *testing.T) {
	const hold = 10 * time.Second
	consul := testenv.Consul(t)
	c := consul.Client()
	ca := newCA(t)
	aPEM, bPEM := ca.bundle(t, "a.example"), ca.bundle(t, "b.example")
	kvPut(t, c, "tls/certs/a", aPEM)
	kvPut(t, c, "tls/certs/b", bPEM)

	var logs logBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	kv := NewKV(c, "tls/certs", hold, nil, log)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	first, err := kv.Read(ctx)
	cancel()
	if err != nil || len(first.Certs) != 2 {
		t.Fatalf("Read = %d certificates, %v", len(first.Certs), err)
	}
	var cliRef atomic.Pointer[haproxy.MasterCLI]
	inst, err := NewInstaller(InstallerOptions{Dir: t.TempDir() + "/certs", CLI: cliFunc(func(ctx context.Context, cmd string) (string, error) {
		return cliRef.Load().Do(ctx, cmd)
	}), Reload: func(reason string) { t.Errorf("reload asked for: %s", reason) }, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(first); err != nil {
		t.Fatal(err)
	}
	addr, cli := startHAProxy(t, inst.CrtList())
	cliRef.Store(cli)
	rctx, stop := context.WithCancel(context.Background())
	sets := make(chan Set)
	var wg sync.WaitGroup
	wg.Go(func() { kv.Run(rctx, first, sets) })
	wg.Go(func() { inst.Run(rctx, sets) })
	defer func() { stop(); wg.Wait() }()
	before, err := cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	serves := func(host string, want *big.Int) bool {
		s, _, err := served(addr, host)
		return err == nil && s.Cmp(want) == 0
	}

	// Restarted empty: the index goes backwards, the removals are held.
	consul.Stop()
	consul.Wipe()
	consul.Start()
	// The watch's backoff while Consul was away reaches 30 s.
	testenv.Eventually(t, 60*time.Second, "the hold is logged", func() bool {
		return strings.Contains(logs.String(), "removals of certificates held") &&
			strings.Contains(logs.String(), "certificates gone from Consul KV keep serving until the hold ends")
	})
	heldAt := time.Now()
	if !serves("a.example", serial(t, aPEM)) || !serves("b.example", serial(t, bPEM)) {
		t.Fatal("during the hold the certificates of the emptied Consul are not served")
	}
	// Put again during the hold: served at once.
	a2PEM := ca.bundle(t, "a.example")
	kvPut(t, consul.Client(), "tls/certs/a", a2PEM)
	testenv.Eventually(t, hold/2, "the certificate put again during the hold is served", func() bool {
		return serves("a.example", serial(t, a2PEM))
	})
	if time.Since(heldAt) >= hold {
		t.Fatalf("the machine is too slow for this test: the checks took %s of the %s hold", time.Since(heldAt), hold)
	}
	if !serves("b.example", serial(t, bPEM)) {
		t.Fatal("b.example lost its certificate during the hold")
	}
	// After the hold: the listing is taken as it is.
	testenv.Eventually(t, 2*hold, "the certificate still missing after the hold is removed", func() bool {
		return serves("b.example", inst.def.Serial)
	})
	if !serves("a.example", serial(t, a2PEM)) {
		t.Fatal("the certificate put again is not served after the hold")
	}
	if !strings.Contains(logs.String(), "hold over: certificates still gone from Consul KV are removed") ||
		!strings.Contains(logs.String(), "names=b") {
		t.Fatalf("the removal after the hold is not logged:\n%s", logs.String())
	}

	// The whole prefix emptied in one answer, with no reset: held too.
	cPEM := ca.bundle(t, "c.example")
	kvPut(t, consul.Client(), "tls/certs/c", cPEM)
	testenv.Eventually(t, 10*time.Second, "c is served", func() bool { return serves("c.example", serial(t, cPEM)) })
	if _, err := consul.Client().KV().DeleteTree("tls/certs/", nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the emptied prefix is held", func() bool {
		return strings.Contains(logs.String(), "one answer removed all 2 certificates")
	})
	if !serves("a.example", serial(t, a2PEM)) || !serves("c.example", serial(t, cPEM)) {
		t.Fatal("the certificates of the emptied prefix are not held")
	}
	testenv.Eventually(t, 2*hold, "the emptied prefix is applied after the hold", func() bool {
		return serves("a.example", inst.def.Serial) && serves("c.example", inst.def.Serial)
	})
	now, err := cli.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if now.Master.Reloads != before.Master.Reloads {
		t.Fatalf("HAProxy reloaded %d times", now.Master.Reloads-before.Master.Reloads)
	}
}
