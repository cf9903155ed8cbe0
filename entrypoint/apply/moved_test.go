package apply

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// movedBase is a configuration HAProxy takes, with the shapes of server
// line a template writes; %s stands for the lines under test.
const movedBase = `global
    maxconn 100

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend http-in
    bind 127.0.0.1:18000
    default_backend web

backend web
    balance roundrobin
    server web-1 10.0.0.1:8080 check inter 2s
    server web-2 10.0.0.2:8080
%s
backend api
    server api-1 [fd00::1]:9000
`

// movedCases: (taken, next) pairs of the lines under test, whether
// movedOnly may skip next's check, and whether real HAProxy takes next.
var movedCases = []struct {
	name       string
	taken      string
	next       string
	moved      bool
	haproxyOK  bool // next, by haproxy -c
	onlyString bool // taken is no configuration HAProxy takes: not run
}{
	{"a port moves", "    server web-3 10.0.0.3:8080 check", "    server web-3 10.0.0.3:8081 check", true, true, false},
	{"an address moves", "    server web-3 10.0.0.3:8080", "    server web-3 192.168.7.9:8080", true, true, false},
	{"IPv6 moves", "    server web-3 [fd00::3]:80", "    server web-3 [fd00::9]:81", true, true, false},
	{"unchanged", "    server web-3 10.0.0.3:8080", "    server web-3 10.0.0.3:8080", false, true, false},
	{"a renamed server may collide", "    server web-3 10.0.0.3:8080", "    server web-2 10.0.0.3:8080", false, false, false},
	{"a host name is resolved by the check", "    server web-3 10.0.0.3:8080", "    server web-3 no-such-host.invalid:8080", false, false, false},
	{"a family change", "    server web-3 10.0.0.3:8080", "    server web-3 [fd00::3]:8080", false, true, false},
	{"a zero port with a check", "    server web-3 10.0.0.3:8080 check", "    server web-3 10.0.0.3:0 check", false, false, false},
	{"a wildcard address", "    server web-3 10.0.0.3:8080", "    server web-3 0.0.0.0:8080", false, true, false},
	{"a keyword changes", "    server web-3 10.0.0.3:8080", "    server web-3 10.0.0.3:8081 weight 300", false, false, false},
	{"a line is added", "", "    server web-3 10.0.0.3:8080", false, true, false},
	{"a quote before the address", `    server "web-3" 10.0.0.3:8080`, `    server "web-3" 10.0.0.4:8080`, false, true, false},
	{"a comment before the address", "    server web-3#10.0.0.3:8080 10.0.0.4:80", "    server web-3#10.0.0.5:8080 10.0.0.4:80", false, false, true},
	// HAProxy does not split words on a no-break space: here the name
	// would be "web-3\u00a010.0.0.3:8080", with the address after it (2.6
	// refuses the character in a name, so this is a string case).
	{"a no-break space in the name", "    server web-3\u00a010.0.0.3:8080 10.0.0.4:80", "    server web-3\u00a010.0.0.5:8080 10.0.0.4:80", false, false, true},
	// HAProxy splits words on \f too: the address would be "id"'s value.
	{"a form feed before the address", "    server a\f10.0.0.9:80\fid 10.0.0.1:80", "    server a\f10.0.0.9:80\fid 0.0.0.1:80", false, false, false},
	{"not a server line", "    # was 10.0.0.3:8080", "    # was 10.0.0.4:8080", false, true, false},
	{"a bind moves", "    server web-3 10.0.0.3:8080\nfrontend f\n    bind 127.0.0.1:18080", "    server web-3 10.0.0.3:8080\nfrontend f\n    bind 127.0.0.1:18081", false, true, false},
}

func TestMovedOnlySkipsTheCheckOnlyForMovedAddresses(t *testing.T) {
	for _, c := range movedCases {
		taken := fmt.Sprintf(movedBase, c.taken)
		next := fmt.Sprintf(movedBase, c.next)
		if got := movedOnly([]byte(taken), []byte(next)); got != c.moved {
			t.Errorf("%s: movedOnly = %v, want %v", c.name, got, c.moved)
		}
	}
	if movedOnly(nil, []byte("server a 10.0.0.1:80\n")) {
		t.Error("nothing taken: movedOnly must not skip the check")
	}
	if movedOnly([]byte("server a 10.0.0.1:80\n"), []byte("server a 10.0.0.2:80")) {
		t.Error("a last newline dropped: movedOnly must not skip the check")
	}
}

// Real HAProxy agrees: every next that movedOnly lets through passes
// haproxy -c as its taken configuration does, and the cases above that
// HAProxy refuses are among those it does not let through.
func TestHAProxyTakesWhatMovedOnlyLetsThrough(t *testing.T) {
	bin := testenv.HAProxy(t)
	dir := t.TempDir()
	check := func(name, cfg string) error {
		p := filepath.Join(dir, strings.NewReplacer(" ", "-", "\"", "").Replace(name)+".cfg")
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "-q", "-c", "-f", p).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	for _, c := range movedCases {
		if c.onlyString {
			continue
		}
		if err := check(c.name+"-taken", fmt.Sprintf(movedBase, c.taken)); err != nil {
			t.Fatalf("%s: the taken configuration must pass haproxy -c: %v", c.name, err)
		}
		err := check(c.name+"-next", fmt.Sprintf(movedBase, c.next))
		if (err == nil) != c.haproxyOK {
			t.Errorf("%s: haproxy -c of next: %v, want ok=%v", c.name, err, c.haproxyOK)
		}
		if c.moved && err != nil {
			t.Errorf("%s: movedOnly skips a check HAProxy fails: %v", c.name, err)
		}
	}
}

// portLines renders a server line per instance, named by its ID.
type portLines struct{}

func (portLines) Render(st model.State) (model.Rendering, error) {
	r := model.Rendering{Queries: []model.Query{model.LocalCatalog}}
	if _, ok := st.Result(model.LocalCatalog); !ok {
		r.Missing = append(r.Missing, model.LocalCatalog)
		return r, nil
	}
	var b strings.Builder
	for _, in := range st.Local().Instances {
		fmt.Fprintf(&b, "server %s %s:%d\n", in.ID, in.Address, in.Port)
	}
	r.Config = []byte(b.String())
	return r, nil
}

// sendPorts reports instance web-i of f at port ports[i].
func sendPorts(f *fakeSource, ports ...int) {
	c := &model.Catalog{}
	for i, p := range ports {
		c.Instances = append(c.Instances, model.Instance{Source: f.name, Name: "web", ID: fmt.Sprintf("web-%d", i),
			Address: "10.0.0.1", Port: p, Status: model.StatusPassing})
	}
	f.ch <- model.Snapshot{Source: f.name, Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
}

func TestAMovedInstanceIsReloadedWithoutACheck(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), portLines{}, src)
	var vouched []string // candidates vouched for, under r.mu
	r.a.opts.Vouch = func(path string) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		vouched = append(vouched, path)
		return nil
	}
	sendPorts(src, 8080, 8081)
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	if r.checkCount() != 1 {
		t.Fatalf("%d checks at start, want 1", r.checkCount())
	}
	step := func(reloads, checks, vouches int, want string, ports ...int) {
		t.Helper()
		sendPorts(src, ports...)
		// The file is put back after a refused reload's outcome.
		testenv.Eventually(t, 5*time.Second, fmt.Sprintf("reload %d, then the file %q", reloads, want), func() bool {
			return r.reloadCount() == reloads && r.file(t) == want
		})
		if got := r.checkCount(); got != checks {
			t.Errorf("ports %v: %d checks, want %d", ports, got, checks)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(vouched) != vouches || vouched[len(vouched)-1] != r.path+".new" {
			t.Errorf("ports %v: vouched for %v, want %d candidates", ports, vouched, vouches)
		}
	}
	step(1, 1, 1, "server web-0 10.0.0.1:8080\nserver web-1 10.0.0.1:9000\n", 8080, 9000)
	if !r.logged("not checked with haproxy -c") {
		t.Error("the skipped check is not logged")
	}
	step(2, 2, 1, "server web-0 10.0.0.1:8080\nserver web-1 10.0.0.1:9000\nserver web-2 10.0.0.1:9001\n", 8080, 9000, 9001)
	// A reload HAProxy refuses puts the file back; what runs is still
	// taken, so the next move is not checked either.
	r.mu.Lock()
	r.reloadOK = false
	r.mu.Unlock()
	step(3, 2, 2, "server web-0 10.0.0.1:8080\nserver web-1 10.0.0.1:9000\nserver web-2 10.0.0.1:9001\n", 8080, 8500, 9001)
	r.mu.Lock()
	r.reloadOK = true
	r.mu.Unlock()
	step(4, 2, 3, "server web-0 10.0.0.1:8080\nserver web-1 10.0.0.1:8600\nserver web-2 10.0.0.1:9001\n", 8080, 8600, 9001)
}

// After a refused reload whose file could not be put back, the file holds
// bytes HAProxy refused. The same rendering again is "unchanged", and must
// not make them count as taken: a move from them is checked.
func TestUnchangedBytesHAProxyRefusedAreNotTaken(t *testing.T) {
	src := newSource("consul")
	dir := t.TempDir()
	r := newRig(t, dir, portLines{}, src)
	var reloads atomic.Int32
	r.a.opts.Reload = func(context.Context, string) (reload.Outcome, error) {
		if reloads.Add(1) == 1 {
			// Refused, and the file's path made unwritable for the restore.
			os.Remove(r.path)
			if err := os.MkdirAll(filepath.Join(r.path, "in-the-way"), 0o755); err != nil {
				t.Error(err)
			}
			return reload.Outcome{OK: false, Err: reload.ErrRefused}, nil
		}
		return reload.Outcome{OK: true}, nil
	}
	sendPorts(src, 8080, 8081)
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	sendPorts(src, 8080, 8090) // a move, refused, not restored
	testenv.Eventually(t, 5*time.Second, "the restore fails", func() bool { return r.logged("cannot restore") })
	if err := os.RemoveAll(r.path); err != nil {
		t.Fatal(err)
	}
	checks := r.checkCount()
	// Other data, the same bytes: unchanged.
	c := &model.Catalog{}
	for i, p := range []int{8080, 8090} {
		c.Instances = append(c.Instances, model.Instance{Source: src.name, Name: "web", ID: fmt.Sprintf("web-%d", i),
			Address: "10.0.0.1", Port: p, Status: model.StatusPassing, Tags: []string{"not-rendered"}})
	}
	src.ch <- model.Snapshot{Source: src.name, Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
	testenv.Eventually(t, 5*time.Second, "the unchanged apply", func() bool { return r.logged("configuration is unchanged") })
	sendPorts(src, 8080, 8095) // a move from bytes HAProxy refused
	testenv.Eventually(t, 5*time.Second, "the second reload", func() bool { return reloads.Load() == 2 })
	if got := r.checkCount(); got != checks+1 {
		t.Errorf("a move from bytes HAProxy refused: %d checks, want 1", got-checks)
	}
}
