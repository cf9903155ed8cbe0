package routes

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// withFDLimit makes the renderer see limit as the hard RLIMIT_NOFILE.
func withFDLimit(t *testing.T, limit uint64) {
	old := fdLimit
	fdLimit = func() (uint64, error) { return limit, nil }
	t.Cleanup(func() { fdLimit = old })
}

// A rendering whose servers and listeners need more file descriptors
// than the limit is refused with an error that names the need, the limit
// and what to change; the renderer's committed slots are untouched, so
// the running configuration keeps serving. The estimate is checked against
// the real HAProxy 2.6: run under the limit just below it, HAProxy refuses
// to start asking for at most the estimate; under the estimate it starts.
func TestARenderingBeyondTheFileDescriptorLimitIsRefused(t *testing.T) {
	var insts []model.Instance
	for s := range 100 {
		insts = append(insts, inst(fmt.Sprintf("svc%02d", s), "i1", fmt.Sprintf("10.0.%d.1", s), 8080,
			fmt.Sprintf("seamless.http.host=svc%02d.example", s)))
	}
	ports := testenv.FreePorts(t, 2)
	opts := Options{HTTPBind: testenv.Addr(ports[0]), StatsBind: testenv.Addr(ports[1]), Slots: 16}

	withFDLimit(t, 1<<20)
	table := NewSlotTable()
	opts.Table = table
	fits := render(t, mustNew(t, opts), catalog(insts[:1]...))

	withFDLimit(t, 1000)
	_, err := mustNew(t, opts).Render(catalog(insts...))
	var fe *FDError
	if !errors.As(err, &fe) {
		t.Fatalf("100 backends × 16 slots under a limit of 1000: err = %v, want an *FDError", err)
	}
	for _, want := range []string{"1000", strconv.FormatUint(fe.Need, 10), "SEAMLESS_SERVER_SLOTS (now 16", "ulimit -n", "SEAMLESS_HEALTH_CHECKS=false"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if fe.Servers != 1600 || fe.Binds != 2 {
		t.Errorf("counted %d servers and %d listeners, want 1600 and 2", fe.Servers, fe.Binds)
	}
	if table.Len() != 1 {
		t.Errorf("the refused rendering changed the slot table: %d backends", table.Len())
	}
	if again := render(t, mustNew(t, opts), catalog(insts[:1]...)); !bytes.Equal(again.Config, fits.Config) {
		t.Error("the configuration that fits renders differently after the refusal")
	}

	// The real HAProxy's own count, for the same configuration.
	withFDLimit(t, 1<<20)
	big, err := mustNew(t, Options{HTTPBind: opts.HTTPBind, StatsBind: opts.StatsBind, Slots: 16}).Render(catalog(insts...))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, big.Config, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := haproxyUnder(t, 100, path).CombinedOutput()
	m := regexp.MustCompile(`Cannot raise FD limit to (\d+), limit is 100`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("HAProxy under a limit of 100 did not say what it needs:\n%s", out)
	}
	asked, _ := strconv.ParseUint(string(m[1]), 10, 64)
	if asked > fe.Need || fe.Need-asked > fdsSpare {
		t.Errorf("HAProxy asks %d descriptors, seamless estimates %d: want the estimate at most %d above", asked, fe.Need, fdsSpare)
	}
	t.Logf("HAProxy 2.6 asks %d file descriptors for 1600 servers and 2 listeners; seamless estimates %d", asked, fe.Need)

	// Under the estimate as its limit, HAProxy starts and serves.
	servesUnder(t, fe.Need, path, opts.HTTPBind)
}

// servesUnder starts HAProxy on path under an open-files limit of limit,
// waits until it listens on bind, stops it, and fails the test if it
// complained about its limit.
func servesUnder(t *testing.T, limit uint64, path, bind string) {
	t.Helper()
	cmd := haproxyUnder(t, limit, path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	testenv.Eventually(t, 10*time.Second, "HAProxy listens under a limit of the estimate", func() bool {
		c, err := net.Dial("tcp", bind)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	// stderr is read only once Wait has copied all of it.
	stop()
	if bytes.Contains(stderr.Bytes(), []byte("FD limit")) {
		t.Errorf("HAProxy complains about its limit:\n%s", stderr.String())
	}
}

// haproxyUnder is HAProxy in the foreground on path with an open-files
// limit of limit (soft and hard).
func haproxyUnder(t *testing.T, limit uint64, path string) *exec.Cmd {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is not installed")
	}
	l := strconv.FormatUint(limit, 10)
	cmd := exec.Command(prlimit, "--nofile="+l+":"+l, testenv.HAProxy(t), "-db", "-f", path)
	cmd.Env = cleanEnv()
	return cmd
}
