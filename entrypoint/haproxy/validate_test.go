package haproxy

import (
	"bytes"
	"crypto/sha256"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"testing"
)

func TestCleanEnv(t *testing.T) {
	in := []string{"PATH=/bin", "HAPROXY_MWORKER_REEXEC=1", "HAPROXY_STARTUPLOGS_FD=5",
		"HAPROXY_MWORKER=1", "HAPROXY_LOCALPEER=x", "BACKEND_PORT=80", "MY_HAPROXY_MWORKER=keep",
		"HAPROXY_CLIENT_TIMEOUT=30s"}
	want := []string{"PATH=/bin", "BACKEND_PORT=80", "MY_HAPROXY_MWORKER=keep", "HAPROXY_CLIENT_TIMEOUT=30s"}
	if got := CleanEnv(in); !reflect.DeepEqual(got, want) {
		t.Errorf("CleanEnv = %q, want %q", got, want)
	}
}

func TestAlerts(t *testing.T) {
	out := `[NOTICE]   (1) : haproxy version is 2.6.12
[ALERT]    (1443) : config : parsing [h.cfg:12] : unknown keyword 'bogus' in 'frontend' section
[WARNING]  (1443) : something harmless
[ALERT]    (1443) : config : Fatal errors found in configuration.
`
	want := []string{
		"config : parsing [h.cfg:12] : unknown keyword 'bogus' in 'frontend' section",
		"config : Fatal errors found in configuration.",
	}
	if got := Alerts(out); !reflect.DeepEqual(got, want) {
		t.Errorf("Alerts = %q, want %q", got, want)
	}
}

// The digest of files on disk streams them through a buffer kept between
// reloads (the rendered file is megabytes at thousands of services, which
// reading whole allocated at every reload; a new 32 KiB buffer was a
// large share of what a reload allocated at a hundred) and equals the digest of the same contents in memory, a
// vouch's; other contents, or the same split differently, differ.
func TestTheDigestStreamsTheFiles(t *testing.T) {
	dir := t.TempDir()
	big := bytes.Repeat([]byte("    server s 10.0.0.1:80\n"), 4<<20/25)
	small := []byte("global\n")
	paths := []string{filepath.Join(dir, "a.cfg"), filepath.Join(dir, "b.cfg")}
	for i, b := range [][]byte{small, big} {
		if err := os.WriteFile(paths[i], b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := digest(paths); err != nil { // warm
		t.Fatal(err)
	}
	// The least of a few tries: the count is the whole process's, parallel
	// tests allocate too, and two collections between tries empty the pool.
	var sum [sha256.Size]byte
	least := uint64(math.MaxUint64)
	for range 5 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s, err := digest(paths)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		sum, least = s, min(least, after.TotalAlloc-before.TotalAlloc)
		if least <= 16<<10 {
			break
		}
	}
	if least > 16<<10 {
		t.Errorf("hashing %d KiB of files allocated at least %d KiB in each of 5 tries; want under 16", (len(big)+len(small))>>10, least>>10)
	}
	if want := sumContents([][]byte{small, big}); sum != want {
		t.Error("the digest of the files differs from that of their contents")
	}
	moved := append(slices.Clone(small), big[0])
	for _, other := range [][][]byte{{small, big[:len(big)-1]}, {moved, big[1:]}, {big, small}} {
		if sumContents(other) == sum {
			t.Errorf("other contents (%d + %d bytes) have the same digest", len(other[0]), len(other[1]))
		}
	}
}
