package certs

import (
	"context"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// A Kubernetes Secret volume: tls.crt and tls.key are symlinks through
// ..data, which is swapped atomically to a new timestamped directory.
func TestDirFollowsADataSwap(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	version := func(name string, crt, key []byte) {
		t.Helper()
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "tls.crt"), crt, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "tls.key"), key, 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	leaf1, key1 := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour*24*90))
	version("..2026_1", join(certPEM(leaf1), certPEM(ca.inter)), keyPEM(t, key1))
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	var last Set
	d := NewDir(dir, time.Hour, nil, nil) // no rescan: only the notifications
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Set)
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx, ch) })
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-ch:
				mu.Lock()
				last = s
				mu.Unlock()
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()
	servedSerial := func() *big.Int {
		mu.Lock()
		defer mu.Unlock()
		if e := last.Certs["tls"]; e != nil {
			return e.Serial
		}
		return nil
	}
	testenv.Eventually(t, 5*time.Second, "the first certificate is read", func() bool {
		s := servedSerial()
		return s != nil && s.Cmp(leaf1.SerialNumber) == 0
	})

	leaf2, key2 := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour*24*90))
	version("..2026_2", join(certPEM(leaf2), certPEM(ca.inter)), keyPEM(t, key2))
	if err := os.RemoveAll(filepath.Join(dir, "..2026_1")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the swapped certificate is read", func() bool {
		s := servedSerial()
		return s != nil && s.Cmp(leaf2.SerialNumber) == 0
	})
}
