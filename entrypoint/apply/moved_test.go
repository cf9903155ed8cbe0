package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// keep is a server line both sides of a case keep, so that a case adding
// or removing one changes no other line.
const keep = "    server web-9 10.0.0.9:8080"

// movedCases: (taken, next) pairs of the lines under test, whether
// serversOnly may skip next's check, and whether real HAProxy takes next.
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
	{"a server is added like one beside it", keep, keep + "\n    server web-3 10.0.0.3:8080", true, true, false},
	{"a server with checks is added like one beside it", keep, keep + "\n    server web-3 10.0.0.3:8080 check inter 2s", true, true, false},
	{"an added server's keywords are no neighbour's", keep, keep + "\n    server web-3 10.0.0.3:8080 check", false, true, false},
	{"an added server of another family", keep, keep + "\n    server web-3 [fd00::3]:8080", false, true, false},
	{"an added server named as one beside it", keep, keep + "\n    server web-2 10.0.0.3:8080", false, false, false},
	{"an added server named as another backend's", keep, keep + "\n    server api-1 10.0.0.3:8080", false, true, false},
	{"an added name HAProxy refuses", keep, keep + "\n    server web/3 10.0.0.3:8080", false, false, false},
	{"an added host name", keep, keep + "\n    server web-3 localhost:8080", false, true, false},
	{"an added server with an id of its own", "    server web-3 10.0.0.3:8080 id 7", "    server web-3 10.0.0.3:8080 id 7\n    server web-4 10.0.0.4:8080 id 7", false, false, false},
	{"a server is removed", "    server web-3 10.0.0.3:8080", keep, true, true, false},
	{"a server is added and another removed", "    server web-3 10.0.0.3:8080", "    server web-4 10.0.0.4:8080", true, true, false},
	{"a removed server is tracked", "    server web-3 10.0.0.3:8080 check\n    server web-4 10.0.0.4:8080 track web/web-3", "    server web-4 10.0.0.4:8080 track web/web-3", false, false, false},
	{"a removed server is named in a rule", "    server web-3 10.0.0.3:8080\n    use-server web-3 if { path /three }", "    use-server web-3 if { path /three }", false, false, false},
	{"an added name a server-template makes", "    server-template web 1-3 10.0.0.1:80\n" + keep, "    server-template web 1-3 10.0.0.1:80\n" + keep + "\n    server web2 10.0.0.11:80", false, false, false},
	{"an added name a quoted one spells", "    server web\"3\" 10.0.0.3:8080\n    balance roundrobin\n" + keep, "    server web\"3\" 10.0.0.3:8080\n    balance roundrobin\n" + keep + "\n    server web3 10.0.0.4:8080", false, false, false},
	{"a removed server tracked by a quoted name", "    server web-3 10.0.0.3:8080 check\n    server web-4 10.0.0.4:8080 track web/web\"-3\"", "    server web-4 10.0.0.4:8080 track web/web\"-3\"", false, false, false},
	{"a removed server named by an escape", "    use-server web\\x33 if TRUE\n    server web3 10.0.0.3:8080\n" + keep, "    use-server web\\x33 if TRUE\n" + keep, false, false, false},
	{"quotes elsewhere spell no name", "    http-request set-header X-Who \"web 3\"\n" + keep, "    http-request set-header X-Who \"web 3\"\n" + keep + "\n    server web-3 10.0.0.3:8080", true, true, false},
	{"many servers added at once", keep, keep + "\n" + manyServers(maxServerChanges+1), false, true, false},
	{"as many as may be", keep, keep + "\n" + manyServers(maxServerChanges), true, true, false},
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

// manyServers is n server lines web-10… like web-2 of movedBase.
func manyServers(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "    server web-%d 10.0.1.%d:8080\n", 10+i, 10+i)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// Server lines mean other things outside a backend or listen section
// (peers, rings): there a server may move, not come or go.
func TestServersComeAndGoOnlyInAProxy(t *testing.T) {
	for _, c := range []struct {
		section string
		want    bool
	}{{"backend", true}, {"listen", true}, {"peers", false}, {"ring", false}} {
		base := "global\n    maxconn 10\n" + c.section + " x\n    server a 10.0.0.1:1024\n    server b 10.0.0.2:1024\n%s\ndefaults\n    mode http\n"
		taken := fmt.Sprintf(base, "    server c 10.0.0.3:1024")
		for _, next := range []string{
			fmt.Sprintf(base, "    server c 10.0.0.3:1024\n    server d 10.0.0.4:1024"),
			fmt.Sprintf(base, "    server d 10.0.0.4:1024"),
			strings.Replace(taken, "server b 10.0.0.2:1024\n", "", 1),
		} {
			if got := serversOnly([]byte(taken), []byte(next)); got != c.want {
				t.Errorf("%s: serversOnly = %v, want %v:\n%s", c.section, got, c.want, next)
			}
		}
		moved := strings.Replace(taken, "10.0.0.2:1024", "10.0.0.9:1024", 1)
		if !serversOnly([]byte(taken), []byte(moved)) {
			t.Errorf("%s: a moved server needs the check", c.section)
		}
	}
}

func TestServersOnlySkipsTheCheckOnlyForServerChanges(t *testing.T) {
	for _, c := range movedCases {
		taken := fmt.Sprintf(movedBase, c.taken)
		next := fmt.Sprintf(movedBase, c.next)
		if got := serversOnly([]byte(taken), []byte(next)); got != c.moved {
			t.Errorf("%s: serversOnly = %v, want %v", c.name, got, c.moved)
		}
	}
	if serversOnly(nil, []byte("server a 10.0.0.1:80\n")) {
		t.Error("nothing taken: serversOnly must not skip the check")
	}
	if serversOnly([]byte("server a 10.0.0.1:80\n"), []byte("server a 10.0.0.2:80")) {
		t.Error("a last newline dropped: serversOnly must not skip the check")
	}
}

// Real HAProxy agrees: every next that serversOnly lets through passes
// haproxy -c as its taken configuration does, and the cases above that
// HAProxy refuses are among those it does not let through.
func TestHAProxyTakesWhatServersOnlyLetsThrough(t *testing.T) {
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
			t.Errorf("%s: serversOnly skips a check HAProxy fails: %v", c.name, err)
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
	b := strings.Builder{}
	b.WriteString("backend web\n")
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

// portsFile is what portLines renders for instances web-i at ports[i].
func portsFile(ports ...int) string {
	b := strings.Builder{}
	b.WriteString("backend web\n")
	for i, p := range ports {
		fmt.Fprintf(&b, "server web-%d 10.0.0.1:%d\n", i, p)
	}
	return b.String()
}

// A moved, added or removed server is reloaded without haproxy -c, and
// vouched for; many added at once are checked; after a refused reload the
// restored file is what the next change is compared with.
func TestAServerChangeIsReloadedWithoutACheck(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), portLines{}, src)
	var vouched []string      // candidates vouched for, under r.mu
	var vouchedOther []string // where the bytes vouched for are not the file's
	r.a.opts.Vouch = func(path string, data []byte) error {
		onDisk, err := os.ReadFile(path)
		r.mu.Lock()
		defer r.mu.Unlock()
		vouched = append(vouched, path)
		if err != nil || !bytes.Equal(onDisk, data) {
			vouchedOther = append(vouchedOther, fmt.Sprintf("%q on disk, %q vouched for (%v)", onDisk, data, err))
		}
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
		if len(vouched) != vouches || vouched[len(vouched)-1] != r.path {
			t.Errorf("ports %v: vouched for %v, want %d files at %s", ports, vouched, vouches, r.path)
		}
		if len(vouchedOther) > 0 {
			t.Errorf("ports %v: vouched for other bytes than the file's: %v", ports, vouchedOther)
		}
	}
	step(1, 1, 1, portsFile(8080, 9000), 8080, 9000) // moved
	if !r.logged("not checked with haproxy -c") {
		t.Error("the skipped check is not logged")
	}
	step(2, 1, 2, portsFile(8080, 9000, 9001), 8080, 9000, 9001) // added
	step(3, 1, 3, portsFile(8080, 9000), 8080, 9000)             // removed
	many := make([]int, 2+maxServerChanges+1)
	for i := range many {
		many[i] = 9000 + 10*i // room to move without changing the order
	}
	step(4, 2, 3, portsFile(many...), many...) // too many added at once: checked
	// A reload HAProxy refuses puts the file back; what runs is still
	// taken, so the next move is not checked either.
	r.setReloadOK(false)
	moved := slices.Clone(many)
	moved[1] = 9015
	step(5, 2, 4, portsFile(many...), moved...)
	r.setReloadOK(true)
	moved[1] = 9016
	step(6, 2, 5, portsFile(moved...), moved...)
}

// startedOnPorts is a rig on portLines started with servers on 8080 and
// 8081, its first snapshots saved.
func startedOnPorts(t *testing.T) (*rig, *fakeSource) {
	t.Helper()
	src := newSource("consul")
	r := newRig(t, t.TempDir(), portLines{}, src)
	sendPorts(src, 8080, 8081)
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.a.saving.Wait()
	return r, src
}

// A reload of moved servers, which nothing checks before HAProxy, puts
// the file under its name at once: one sync of the file, and none of its
// directory until the snapshots are saved. A candidate's name, its two
// renames and a sync of the directory after each were a tenth of
// seamless's CPU per change with a template at 100 × 10.
func TestAMovedServersReloadSyncsTheDirectoryWithTheSnapshots(t *testing.T) {
	r, src := startedOnPorts(t)
	syncs := recordSyncs(t, r.path)
	r.a.savedAt = time.Now() // no save due during the change
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	sendPorts(src, 8080, 9000)
	testenv.Eventually(t, 5*time.Second, "the moved server's reload", func() bool {
		return r.reloadCount() == 1 && r.file(t) == portsFile(8080, 9000)
	})
	if file, dir := syncs.read(); file != 1 || dir != 0 {
		t.Errorf("the reload synced the configuration %d times and its directory %d times, want 1 and 0", file, dir)
	}
	if _, err := os.Stat(r.path + ".new"); err == nil {
		t.Error("a candidate was written beside the configuration")
	}
	cancel()
	<-done
	if _, dir := syncs.read(); dir != 1 {
		t.Errorf("after the stop: the directory synced %d times, want 1", dir)
	}
}

// A directory that cannot be synced once a checked configuration took its
// name does not stop the reload: the file on disk stays what runs, and
// the directory is synced again at the next save. It used to end the
// apply as a write error, with the new file in place and HAProxy running
// the previous one.
func TestAFailedDirectorySyncAfterTheRenameStillReloads(t *testing.T) {
	r, src := startedOnPorts(t)
	onFsync(t, func(name string) error {
		if name == filepath.Dir(r.path) {
			return errors.New("I/O error")
		}
		return nil
	})
	r.a.savedAt = time.Now() // no save due during the change
	r.run(t)
	many := make([]int, maxServerChanges+3) // too many added at once: checked
	for i := range many {
		many[i] = 7000 + i
	}
	sendPorts(src, many...)
	testenv.Eventually(t, 5*time.Second, "the checked change reloaded, in the file", func() bool {
		return r.reloadCount() == 1 && r.file(t) == portsFile(many...)
	})
	if r.checkCount() != 2 {
		t.Errorf("%d checks, want 2 (the start's and the change's)", r.checkCount())
	}
	if !r.logged("cannot sync the configuration's directory") {
		t.Error("the failed sync is not logged")
	}
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

// The comparison at every change of a template at 1000 backends of 10.
func BenchmarkServersOnlyAt1000x10(b *testing.B) {
	var taken strings.Builder
	for s := range 1000 {
		fmt.Fprintf(&taken, "backend svc%04d\n    balance roundrobin\n", s)
		for i := range 10 {
			fmt.Fprintf(&taken, "    server svc%04d-%d 10.0.%d.%d:8080 check\n", s, i, s%250, i+1)
		}
	}
	t := []byte(taken.String())
	moved := []byte(strings.Replace(taken.String(), "server svc0500-3 10.0.0.4:8080", "server svc0500-3 10.0.0.4:8081", 1))
	added := []byte(strings.Replace(taken.String(), "    server svc0500-3 10.0.0.4:8080 check\n", "    server svc0500-3 10.0.0.4:8080 check\n    server svc0500-a 10.0.0.99:8080 check\n", 1))
	for name, next := range map[string][]byte{"moved": moved, "added": added} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !serversOnly(t, next) {
					b.Fatal("not servers only")
				}
			}
		})
	}
}

// Judging the lines that changed, widened to their runs of servers, gives
// what judging the whole files gives, whatever the edit.
func FuzzChangedRunsJudgeAsTheWholeFiles(f *testing.F) {
	for i := range uint64(1000) {
		f.Add(i, i*7+3)
	}
	f.Fuzz(func(t *testing.T, seed, seed2 uint64) {
		rng := rand.New(rand.NewPCG(seed, seed2))
		var lines []string
		for s := range 3 {
			lines = append(lines, fmt.Sprintf("backend b%d", s), "    balance roundrobin")
			for i := range 1 + rng.IntN(3) {
				lines = append(lines, fmt.Sprintf("    server s%d-%d 10.0.%d.%d:80 check", s, i, s, i))
			}
		}
		taken := strings.Join(lines, "\n") + "\n"
		edits := []func(){
			func() { // move
				i := rng.IntN(len(lines))
				lines[i] = strings.Replace(lines[i], ":80", fmt.Sprintf(":%d", 81+rng.IntN(3)), 1)
			},
			func() { // add a server line
				i := rng.IntN(len(lines) + 1)
				l := fmt.Sprintf("    server n%d 10.9.0.%d:80 check", rng.IntN(3), rng.IntN(3))
				lines = append(lines[:i], append([]string{l}, lines[i:]...)...)
			},
			func() { // remove a line
				i := rng.IntN(len(lines))
				lines = append(lines[:i], lines[i+1:]...)
			},
			func() { // change another line
				lines[rng.IntN(len(lines))] = "    balance leastconn"
			},
		}
		for range 1 + rng.IntN(3) {
			edits[rng.IntN(len(edits))]()
		}
		next := strings.Join(lines, "\n")
		if rng.IntN(4) > 0 {
			next += "\n"
		}
		got := serversOnly([]byte(taken), []byte(next))
		want := serverChanges(splitServers([]byte(taken)), splitServers([]byte(next)), "", []byte(next))
		if got != want {
			t.Fatalf("serversOnly = %v, the whole files %v:\n%s\n--\n%s", got, want, taken, next)
		}
	})
}

// commonPrefix and commonSuffix, which compare runs of bytes at a time,
// find what a byte at a time finds: a difference at, before and after a
// run's edge, at either end, in texts of different lengths, and none.
func TestCommonPrefixAndSuffixMatchAByteLoop(t *testing.T) {
	prefix := func(a, b []byte) int {
		p := 0
		for p < len(a) && p < len(b) && a[p] == b[p] {
			p++
		}
		return p
	}
	suffix := func(a, b []byte) int {
		q := 0
		for q < len(a) && q < len(b) && a[len(a)-1-q] == b[len(b)-1-q] {
			q++
		}
		return q
	}
	base := bytes.Repeat([]byte("    server i1 10.0.0.1:80 check\n"), 3*equalRun/16)
	type pair struct {
		name string
		a, b []byte
	}
	var cases []pair
	for _, at := range []int{0, 1, equalRun - 1, equalRun, equalRun + 1, 2*equalRun + 7, len(base) - equalRun, len(base) - 1} {
		b := bytes.Clone(base)
		b[at] ^= 0x20
		cases = append(cases, pair{fmt.Sprintf("byte %d changed", at), base, b})
		cases = append(cases, pair{fmt.Sprintf("byte %d removed", at), base, slices.Delete(bytes.Clone(base), at, at+1)})
	}
	cases = append(cases, pair{"equal", base, bytes.Clone(base)}, pair{"one empty", base, nil},
		pair{"a prefix of the other", base, base[:len(base)-equalRun-3]},
		pair{"a suffix of the other", base, base[equalRun+3:]})
	for _, c := range cases {
		if got, want := commonPrefix(c.a, c.b), prefix(c.a, c.b); got != want {
			t.Errorf("%s: commonPrefix = %d, want %d", c.name, got, want)
		}
		if got, want := commonSuffix(c.a, c.b), suffix(c.a, c.b); got != want {
			t.Errorf("%s: commonSuffix = %d, want %d", c.name, got, want)
		}
		// As changedRuns uses them: the suffix after the prefix.
		p := prefix(c.a, c.b)
		if got, want := commonSuffix(c.a[p:], c.b[p:]), suffix(c.a[p:], c.b[p:]); got != want {
			t.Errorf("%s: commonSuffix after the prefix = %d, want %d", c.name, got, want)
		}
	}
}
