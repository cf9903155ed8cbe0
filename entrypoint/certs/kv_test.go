package certs

import (
	"context"
	"log/slog"
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
	kv := NewKV(c, "tls/certs", nil, log)
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
	if !strings.Contains(logs.String(), "the directory's serves") {
		t.Fatalf("the shadowed KV certificate is not logged:\n%s", logs.String())
	}

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

	// Deleted: removed, the default certificate answers.
	if _, err := c.KV().Delete("tls/certs/b", nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the deleted certificate is removed", func() bool {
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
