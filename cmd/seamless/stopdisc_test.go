package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// holdingBackend answers "web" at once, and on /hold only once release
// is closed; started receives a value as a /hold arrives.
func holdingBackend(t *testing.T) (port int, started <-chan struct{}, release chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st, rel := make(chan struct{}, 1), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			select {
			case st <- struct{}{}:
			default: // one is enough
			}
			select {
			case <-rel:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "web\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port, st, rel
}

// TestAStopEndsDiscoveryBeforeTheDrain: once a stop begins, discovery
// applies nothing more while HAProxy drains: its loop ends before the
// drain does. A 10,000-service benchmark caught it at work then: a
// runtime change to the worker that soft-stops did not read back as sent,
// and its fallback, a reload refused while stopping, first spent seconds
// of haproxy -c and 100 MB.
func TestAStopEndsDiscoveryBeforeTheDrain(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	port, started, release := holdingBackend(t)
	other := namedBackend(t, "other")
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(port)))
	r := &discoveryRig{http: testenv.Addr(testenv.FreePort(t)), stateDir: filepath.Join(t.TempDir(), "state")}
	env := []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + r.http,
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + r.stateDir, "SEAMLESS_WAIT=0", "SEAMLESS_STOP_GRACE=60s"}
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: env})
	r.eventuallyServedBy(t, "127.0.0.1", "web")
	cfg := filepath.Join(r.stateDir, "haproxy.cfg")
	before, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}

	held := make(chan int, 1)
	go func() {
		req, err := http.NewRequest(http.MethodGet, "http://"+r.http+"/hold", nil)
		if err != nil {
			held <- 0
			return
		}
		req.Host = "127.0.0.1"
		resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	receive(t, started, "the held request reached the backend")
	in.signal(syscall.SIGTERM)
	// The applier's loop has ended: nothing after this can apply a change.
	testenv.Eventually(t, 10*time.Second, "discovery stopped while HAProxy drains the held request", func() bool {
		return strings.Contains(in.out.String(), "discovery stopped: changes are no longer applied")
	})
	select {
	case code := <-held:
		t.Fatalf("the held request ended (%d) before discovery stopped", code)
	default:
	}
	stopAt := len(in.out.String())
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(other)))

	close(release)
	if code := receive(t, held, "the held request answered"); code != 200 {
		t.Errorf("the held request got %d, want 200", code)
	}
	if code := in.wait(30 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	after, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("the configuration changed during the drain")
	}
	for _, s := range []string{"applied", "runtime update failed", "reloading", "cannot validate", "did not take"} {
		if strings.Contains(in.out.String()[stopAt:], s) {
			t.Errorf("after the stop began, the log says %q:\n%s", s, in.out.String()[stopAt:])
		}
	}
}
