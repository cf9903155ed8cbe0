package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestClassify(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/health/service/web":  classHealth,
		"/v1/catalog/services":    classCatalog,
		"/v1/catalog/nodes":       classNodes,
		"/v1/internal/ui/nodes":   classUINodes,
		"/v1/kv/service/haproxy/": classKV,
		"/v1/catalog/service/web": classOther,
		"/v1/agent/self":          classOther,
	} {
		if got := classify(path); got != want {
			t.Errorf("classify(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestContainsAddr(t *testing.T) {
	cfg := []byte("server a 127.0.0.1:40123 check\nserver b 127.0.0.1:4012\n")
	for addr, want := range map[string]bool{
		"127.0.0.1:4012":  true, // at the end, not only as a prefix of 40123
		"127.0.0.1:40123": true,
		"127.0.0.1:401":   false,
		"127.0.0.1:1":     false,
	} {
		if got := containsAddr(cfg, []byte(addr)); got != want {
			t.Errorf("containsAddr(%q) = %v, want %v", addr, got, want)
		}
	}
	if n := countAddrs([]byte("x 127.0.0.1:80 127.0.0.1:8080 127.0.0.1:80\n"), []byte("127.0.0.1:80")); n != 2 {
		t.Errorf("countAddrs = %d, want 2", n)
	}
}

// The proxy counts answers as the client receives them: gzip stays
// compressed when the client asked for it, and a blocking query that
// comes back with the index it was asked with is an idle refresh.
func TestProxyCountsWhatTheClientReceives(t *testing.T) {
	body := bytes.Repeat([]byte(`{"Node":"node-001","Address":"127.0.0.1"},`), 200)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(body)
	zw.Close()
	var plainAsked atomic.Value // what the uncompressed request reached Consul with
	consul := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/internal/ui/nodes" {
			plainAsked.Store(r.Header.Get("Accept-Encoding"))
		}
		w.Header().Set("X-Consul-Index", "7")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gz.Bytes())
			return
		}
		w.Write(body)
	}))
	defer consul.Close()
	p, err := startProxy(strings.TrimPrefix(consul.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()

	// No Accept-Encoding of its own, as Consul's API client sends one.
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	get := func(path, acceptEncoding string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+path, nil)
		if acceptEncoding != "" {
			// Set by hand, Go's transport leaves the body encoded.
			req.Header.Set("Accept-Encoding", acceptEncoding)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get("/v1/health/service/web", "gzip")         // first
	get("/v1/health/service/web?index=7", "gzip") // idle: the same index
	get("/v1/internal/ui/nodes?index=3", "")      // news, uncompressed
	get("/v1/kv/service/haproxy/maxconn", "gzip") // first
	// An answer is counted just after its last byte has gone out.
	var c proxyCounts
	testenv.Eventually(t, 5*time.Second, "four answers counted", func() bool {
		c = p.read()
		return c.total().Requests == 4
	})
	health, nodes := c.Class[classHealth], c.Class[classUINodes]
	if health.Requests != 2 || health.Body != int64(2*gz.Len()) {
		t.Errorf("health: %+v, want 2 requests of %d gzip bytes each", health, gz.Len())
	}
	if nodes.Requests != 1 || nodes.Body != int64(len(body)) {
		t.Errorf("ui/nodes: %+v, want 1 request of %d bytes", nodes, len(body))
	}
	if got := plainAsked.Load(); got != "" {
		t.Errorf("a request without Accept-Encoding reached Consul with %q: the proxy must not ask for gzip itself", got)
	}
	if c.Kind[kindFirst].Requests != 2 || c.Kind[kindIdle].Requests != 1 || c.Kind[kindChange].Requests != 1 {
		t.Errorf("kinds: %+v, want first 2, idle 1, change 1", c.Kind)
	}
	if c.Gzip != 3 || c.AcceptGzip != 3 || c.Errors != 0 {
		t.Errorf("gzip %d, asked %d, errors %d; want 3, 3, 0", c.Gzip, c.AcceptGzip, c.Errors)
	}
	if c.total().Header == 0 {
		t.Error("no header bytes counted")
	}
}

// The proxy passes a blocking query's answer on as soon as Consul sends
// it, and lets a client hold many at once.
func TestProxyDoesNotHoldAnswers(t *testing.T) {
	release := make(chan struct{})
	var holding atomic.Int64
	consul := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" {
			holding.Add(1)
			<-release
		}
		w.Header().Set("X-Consul-Index", "8")
		w.Write([]byte("[]"))
	}))
	defer consul.Close()
	defer close(release)
	p, err := startProxy(strings.TrimPrefix(consul.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	// 300 held queries: more than any default connection cap.
	const held = 300
	errs := make(chan error, held)
	for i := range held {
		go func() {
			resp, err := http.Get("http://" + p.addr + "/v1/health/service/s" + strconv.Itoa(i) + "?index=1")
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	testenv.Eventually(t, 10*time.Second, "every held query reached Consul", func() bool {
		return holding.Load() == held
	})
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + p.addr + "/v1/catalog/services")
	if err != nil {
		t.Fatalf("a query beside %d held ones: %v", held, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("answered %d", resp.StatusCode)
	}
}

func TestPlanChangesIsSeededAndNeverRepeats(t *testing.T) {
	l := layout{services: 5, instances: 2}
	ports := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	names := []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10"}
	a, b := planChanges(l, 10, 7, ports, names), planChanges(l, 10, 7, ports, names)
	seen := map[[2]int]bool{}
	for k := range a {
		if a[k] != b[k] {
			t.Fatalf("change %d differs between two plans of one seed: %+v, %+v", k, a[k], b[k])
		}
		key := [2]int{a[k].svc, a[k].inst}
		if seen[key] {
			t.Errorf("instance %v changed twice", key)
		}
		seen[key] = true
	}
}

// consulTemplateBin is $SEAMLESS_CONSUL_TEMPLATE_BIN; unset, the test is
// skipped on a developer machine and fails under CI, where make test sets
// it.
func consulTemplateBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SEAMLESS_CONSUL_TEMPLATE_BIN")
	if bin == "" {
		if testenv.CI() {
			t.Fatal("SEAMLESS_CONSUL_TEMPLATE_BIN is not set under CI (make test builds consul-template and sets it)")
		}
		t.Skip("SEAMLESS_CONSUL_TEMPLATE_BIN is not set (make consul-template builds it)")
	}
	return bin
}

// peerTable runs seamless-bench peer with args against the real Consul,
// consul-template, HAProxy and seamless, under a temporary directory of
// its own, and returns its table and that directory; it skips where they
// are missing, and fails the test if the run fails.
func peerTable(t *testing.T, args ...string) (table, tmp string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Consul, consul-template, HAProxy and seamless")
	}
	if os.Getenv("SEAMLESS_CONSUL_BIN") == "" && !testenv.CI() {
		t.Skip("SEAMLESS_CONSUL_BIN is not set (make consul builds the agent)")
	}
	ct := consulTemplateBin(t)
	testenv.HAProxy(t)
	consul := testenv.ConsulBin(t)
	tmp = t.TempDir()
	t.Setenv("TMPDIR", tmp)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, append([]string{"seamless-bench", "peer", "-seamless", seamlessBin, "-consul", consul, "-consul-template", ct,
		"-change-timeout", "30s", "-timeout", "2m"}, args...), &stdout, &stderr)
	out := stdout.String()
	t.Logf("table:\n%s", out)
	if code != 0 {
		t.Fatalf("exit code %d\nstderr:\n%s", code, stderr.String())
	}
	return out, tmp
}

// The side-by-side, tiny, against the real Consul, consul-template,
// HAProxy and seamless: every tool gets a row with numbers, made requests
// through its proxy and showed every change.
func TestPeerBenchmark(t *testing.T) {
	out, tmp := peerTable(t, "-sizes", "5x2", "-changes", "3", "-interval", "300ms")
	number := `[0-9]+(\.[0-9]+)?`
	for _, tool := range peerTools {
		row := regexp.MustCompile(`(?m)^\| 5x2 \| ` + regexp.QuoteMeta(tool.title) + ` \| alone \| (.*)\|$`).FindStringSubmatch(out)
		if row == nil {
			t.Errorf("no row for %s", tool.title)
			continue
		}
		cells := strings.Split(row[1], "|")
		if len(cells) != 7 {
			t.Errorf("%s: %d cells after the mode, want 7: %q", tool.title, len(cells), row[1])
			continue
		}
		checks := []struct {
			name, re string
		}{
			{"change → file", `^\s*` + number + ` / ` + number},
			{"Consul KiB", `^\s*` + number + ` · ` + number},
			{"Consul requests", `^\s*` + number + ` · ` + number},
			{"tool CPU", `^\s*` + number},
			{"agent CPU", `^\s*` + number},
			{"RSS", `^\s*[1-9][0-9]* / [1-9][0-9]*`},
		}
		for i, c := range checks {
			cell := cells[i]
			if i >= 1 {
				cell = cells[i+1] // after the served column
			}
			if !regexp.MustCompile(c.re).MatchString(cell) {
				t.Errorf("%s: %s cell %q has no number", tool.title, c.name, cell)
			}
		}
		served := regexp.MustCompile(`^\s*` + number + ` / ` + number).MatchString(cells[1])
		if served != tool.serves() {
			t.Errorf("%s: served cell %q", tool.title, cells[1])
		}
		if tool.serves() && !regexp.MustCompile(`- 5x2 `+regexp.QuoteMeta(tool.title)+` \(alone\): 3/3 changes in the file \([0-9]+ file reads\), 3/3 served`).MatchString(out) {
			t.Errorf("%s did not serve every change", tool.title)
		}
		// The built-in's change → served beside the classic reload's.
		if tool == toolBuiltin && !strings.Contains(cells[1], "of ct + reload)") {
			t.Errorf("%s: served cell %q has no ratio to consul-template + reload", tool.title, cells[1])
		}
		// At least one request to Consul per change, through the proxy.
		if req, _ := strconv.ParseFloat(strings.Fields(cells[3])[0], 64); req < 1 {
			t.Errorf("%s: %v requests per change, want >= 1", tool.title, req)
		}
		if !strings.Contains(out, "- 5x2 "+tool.title+" (alone): 3/3 changes in the file") {
			t.Errorf("%s did not show every change in its file", tool.title)
		}
	}
	if pids := procfs.Mentioning(tmp); len(pids) > 0 {
		t.Errorf("processes left running: %v", pids)
	}
}

// -change remove deregisters instances: every tool shows each removal in
// its file (the built-in as a disabled slot), and none is probed through
// HAProxy. (A short name: seamless's run directory under the test's
// temporary one must fit HAProxy's socket paths.)
func TestPeerRemoves(t *testing.T) {
	out, _ := peerTable(t, "-sizes", "5x4", "-changes", "3", "-interval", "300ms", "-change", "remove", "-tools", "ct,template,builtin")
	for _, tool := range []peerTool{toolCT, toolTemplate, toolBuiltin} {
		if !regexp.MustCompile(`- 5x4 ` + regexp.QuoteMeta(tool.title) + ` \(alone\): 3/3 changes in the file \([0-9]+ file reads\);`).MatchString(out) {
			t.Errorf("%s did not show every removal in its file, or says it probed them", tool.title)
		}
		if !regexp.MustCompile(`(?m)^\| 5x4 \| ` + regexp.QuoteMeta(tool.title) + ` \| alone \| [0-9.]+ / [0-9.]+[^|]*\| – \|`).MatchString(out) {
			t.Errorf("%s: want a change → file cell and no served one", tool.title)
		}
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		a, b float64
		want string
	}{{120, 10, "12×"}, {14, 10, "1.4×"}, {1, 26.1, "0.04×"}, {1, 0, "–"}} {
		if got := ratio(tc.a, tc.b); got != tc.want {
			t.Errorf("ratio(%v, %v) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}

// With -direct, seamless's Consul traffic bypasses the counting proxy:
// the table says it was not counted rather than printing zeros.
func TestDirectRowsSayTrafficWasNotCounted(t *testing.T) {
	r := peerResult{size: peerSize{2, 2}, tool: toolBuiltin, asked: 2,
		rendered: []time.Duration{time.Millisecond, 2 * time.Millisecond}, cpu: time.Millisecond, rss: 1 << 20, peak: 1 << 20}
	for _, direct := range []bool{false, true} {
		var b bytes.Buffer
		printPeerTable(&b, peerOptions{changes: 2, interval: time.Second, direct: direct}, []peerResult{r})
		if got := strings.Contains(b.String(), "not counted (-direct)"); got != direct {
			t.Errorf("-direct=%v: the table says 'not counted' %v:\n%s", direct, got, b.String())
		}
	}
}

// A change a tool never showed is said in the table, not left out of its
// percentiles unmentioned, and the footnote names the tools' wait.
func TestTheTableSaysLostChangesAndTheWait(t *testing.T) {
	r := peerResult{size: peerSize{2, 2}, tool: toolBuiltin, asked: 3,
		rendered: []time.Duration{time.Millisecond, 2 * time.Millisecond}, served: []time.Duration{3 * time.Millisecond},
		cpu: time.Millisecond, rss: 1 << 20, peak: 1 << 20}
	var b bytes.Buffer
	printPeerTable(&b, peerOptions{changes: 3, interval: 20 * time.Millisecond,
		wait: config.Wait{Min: 200 * time.Millisecond, Max: 2 * time.Second}}, []peerResult{r})
	for _, want := range []string{"1 of 3 never in the file", "2 of 3 never served", "every tool with wait 200ms:2s."} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table does not say %q:\n%s", want, b.String())
		}
	}
}

// -wait sets every tool's quiescence, so -env may not set seamless's alone.
func TestPeerWaitIsEveryTools(t *testing.T) {
	args := []string{"-tools", "ct", "-consul-template", "/bin/true", "-haproxy", "/bin/true"}
	o, err := parsePeerFlags(append(args, "-wait", "200ms:2s"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := (config.Wait{Min: 200 * time.Millisecond, Max: 2 * time.Second}); o.wait != want {
		t.Errorf("-wait 200ms:2s: %v, want %v", o.wait, want)
	}
	if _, err := parsePeerFlags(append(args, "-env", "SEAMLESS_WAIT=1s"), io.Discard); err == nil || !strings.Contains(err.Error(), "use -wait") {
		t.Errorf("-env SEAMLESS_WAIT: err %v, want one that says to use -wait", err)
	}
	if _, err := parsePeerFlags(append(args, "-wait", "2s:1s"), io.Discard); err == nil {
		t.Error("-wait 2s:1s (max below min) was taken")
	}
}

// A change written after the schedule's end (the writes fell behind it)
// is probed for as long as one written on time: the deadline used to be
// the schedule's end plus the timeout, so at 10,000 × 10 every change
// written more than a minute late counted as never served.
func TestALateChangeIsProbedForItsWholeTimeout(t *testing.T) {
	end := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		now  time.Time
		want time.Time
	}{
		{"on schedule", end.Add(-5 * time.Second), end.Add(time.Minute)},
		{"90 s late", end.Add(90 * time.Second), end.Add(150 * time.Second)},
	} {
		if got := probeDeadline(end, tt.now, time.Minute); !got.Equal(tt.want) {
			t.Errorf("%s: deadline %s, want %s", tt.name, got.Format(time.TimeOnly), tt.want.Format(time.TimeOnly))
		}
	}
}

// The wait for a settled agent ends once its process is idle, and says so
// when it never is within the limit: a row must not report a busy agent
// as settled.
func TestSettleAgentTellsIdleFromBusy(t *testing.T) {
	for _, tt := range []struct {
		name    string
		script  string
		settled bool
	}{
		{"idle", "exec sleep 30", true},
		{"busy", "while :; do :; done", false},
	} {
		cmd := exec.Command("sh", "-c", tt.script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waited, settled, err := settleAgent(context.Background(), cmd.Process.Pid, 1200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if settled != tt.settled {
			t.Errorf("%s process: settled %v after %s, want %v", tt.name, settled, waited.Round(time.Millisecond), tt.settled)
		}
	}
}

// The reload script's paths reach sh as one word each, whatever they hold.
func TestShellQuoteIsOneWord(t *testing.T) {
	for _, s := range []string{"plain", "a b", "it's", `$(touch x) "q" \ *`, ""} {
		out, err := exec.Command("sh", "-c", `printf '%s|' `+shellQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got := string(out); got != s+"|" {
			t.Errorf("shellQuote(%q) reached sh as %q", s, got)
		}
	}
}

// -change says what each change does, and the table says so.
func TestPeerChangeKinds(t *testing.T) {
	args := []string{"-tools", "ct", "-consul-template", "/bin/true", "-haproxy", "/bin/true"}
	for _, tt := range []struct {
		arg  string
		want changeKind
		says string
	}{
		{"add", changeAdd, "each a new instance of one service registered at a new port"},
		{"remove", changeRemove, "each one instance of one service deregistered"},
		{"move", changeMove, "each one instance of one service moved to a new port"},
	} {
		o, err := parsePeerFlags(append(args, "-change", tt.arg), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.change != tt.want {
			t.Errorf("-change %s: kind %v, want %v", tt.arg, o.change, tt.want)
		}
		var b strings.Builder
		printPeerTable(&b, o, nil)
		if !strings.Contains(b.String(), tt.says) {
			t.Errorf("-change %s: the table does not say what a change is:\n%s", tt.arg, b.String())
		}
	}
	if _, err := parsePeerFlags(append(args, "-change", "rename"), io.Discard); err == nil {
		t.Error("-change rename was taken")
	}
}

// A removal is in the file once its address is no server that takes
// traffic in its service's backend: gone (a template's server per
// instance) or its slot disabled (the built-in drains it); the same
// address in another backend does not count.
func TestServesIn(t *testing.T) {
	const cfg = `global
    maxconn 100

backend svc-1
    balance roundrobin
    server s0 127.0.0.1:8001 weight 1
    server s1 127.0.0.1:8002 weight 1 disabled

backend svc-10
    server svc-10-0 127.0.0.1:8003

backend svc-2
    server svc-2-0 127.0.0.1:8004
# a comment at the start of a line ends the section
    server svc-2-1 127.0.0.1:8005
`
	for _, tt := range []struct {
		backend, addr string
		want          bool
	}{
		{"svc-1", "127.0.0.1:8001", true},
		{"svc-1", "127.0.0.1:8002", false}, // disabled: draining
		{"svc-1", "127.0.0.1:8003", false}, // svc-10's
		{"svc-10", "127.0.0.1:8003", true},
		{"svc-10", "127.0.0.1:800", false},
		{"svc-2", "127.0.0.1:8004", true},
		{"svc-2", "127.0.0.1:8005", false},
		{"svc-3", "127.0.0.1:8001", false},
	} {
		if got := servesIn([]byte(cfg), tt.backend, tt.addr); got != tt.want {
			t.Errorf("servesIn(%s, %s) = %v, want %v", tt.backend, tt.addr, got, tt.want)
		}
	}
}

// At 10,000 × 10 one tool's room for idle connections asked Consul for
// 20,132 connections on a limit of 20,000 file descriptors, and Consul
// would not start.
func TestTheAgentsConnectionLimitFitsItsFileDescriptors(t *testing.T) {
	l := layout{services: 10000, instances: 10}
	if got := maxConnsPerClient(l, 1, 20000); got+20 > 20000 || got < l.services+16 {
		t.Errorf("limit %d on 20,000 descriptors: Consul needs it plus 20 to fit, and seamless a connection per service", got)
	}
	if got, want := maxConnsPerClient(l, 1, 1<<20), 2*(l.services+16)+100; got != want {
		t.Errorf("limit %d with descriptors to spare, want %d", got, want)
	}
	if got := maxConnsPerClient(layout{services: 10}, 1, 0); got != 200 {
		t.Errorf("small catalog: limit %d, want Consul's default 200", got)
	}
}
