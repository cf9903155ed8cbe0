package routes

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// inst is a passing instance of service name.
func inst(name, id, addr string, port int, tags ...string) model.Instance {
	return model.Instance{Source: "test", Name: name, ID: id, Node: "node1", Address: addr, Port: port,
		Tags: tags, Status: model.StatusPassing}
}

func with(in model.Instance, f func(*model.Instance)) model.Instance {
	f(&in)
	return in
}

func status(s string) func(*model.Instance) { return func(in *model.Instance) { in.Status = s } }

func catalog(insts ...model.Instance) model.State {
	return model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: &model.Catalog{Instances: insts}}})
}

func mustNew(t testing.TB, o Options) *Renderer {
	t.Helper()
	r, err := New(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// render renders st and commits the rendering, as the applier does once
// HAProxy runs it.
func render(t testing.TB, r *Renderer, st model.State) model.Rendering {
	t.Helper()
	out, err := r.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	if out.Commit != nil {
		out.Commit()
	}
	return out
}

// renderPlan renders st without committing, and returns the slot table
// the rendering proposes.
func renderPlan(t testing.TB, r *Renderer, st model.State) (model.Rendering, slotPlan) {
	t.Helper()
	out, plan, _, err := r.render(st)
	if err != nil {
		t.Fatal(err)
	}
	return out, plan
}

func equalPlans(a, b slotPlan) bool { return reflect.DeepEqual(a.all(), b.all()) }

// haproxyCheck runs `haproxy -c` on a configuration and fails on an error
// or on a warning other than a server name that does not resolve (which
// init-addr none turns into a warning on purpose).
func haproxyCheck(t *testing.T, cfg []byte) {
	t.Helper()
	bin := testenv.HAProxy(t)
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", "-f", path)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("haproxy -c: %v\n%s\n--- config:\n%s", err, out, cfg)
	}
	for l := range strings.Lines(string(out)) {
		if strings.Contains(l, "[WARNING]") && !strings.Contains(l, "could not resolve address") {
			t.Errorf("haproxy -c warns: %s", strings.TrimSpace(l))
		}
	}
}

// cleanEnv is the environment without HAProxy's control variables, which
// would confuse `haproxy -c` run from inside a HAProxy master.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HAPROXY_") {
			env = append(env, kv)
		}
	}
	return env
}

// The grammar of the rendered configuration: every line is either a line
// of the template without an action, or one of the dynamic shapes below,
// whose variable parts allow only the validated character sets. No
// untrusted byte can pass it: no space, quote, '#', '%', '$' or backslash
// inside a token, no line a tag could have added.
var (
	tok     = `[A-Za-z0-9._-]+`
	dynamic = []*regexp.Regexp{
		regexp.MustCompile(`^    bind (?:[0-9.]+|\[[0-9a-f:]+\])?:[0-9]{1,5}$`),
		regexp.MustCompile(`^    bind (?:[0-9.]+|\[[0-9a-f:]+\])?:[0-9]{1,5} ssl crt-list /[A-Za-z0-9._/-]+ alpn h2,http/1\.1$`),
		regexp.MustCompile(`^    use_backend ` + tok + ` if(?: \{ var\(txn\.host\) -m (?:str|end) [a-z0-9.-]+ \})?(?: \{ var\(txn\.path\) -m beg /[A-Za-z0-9._~/:@+,;=-]*/ \})?$`),
		regexp.MustCompile(`^    default_backend ` + tok + `$`),
		regexp.MustCompile(`^    http-request return status 200 content-type text/plain lf-string "%\[path,field\(4,/\),map\((/[A-Za-z0-9._/-]+)\)\]" if \{ path_beg /\.well-known/acme-challenge/ \} \{ path,field\(4,/\),map\((/[A-Za-z0-9._/-]+)\) -m found \}$`),
		regexp.MustCompile(`^frontend tcp-[0-9]{1,5}$`),
		regexp.MustCompile(`^backend ` + tok + `$`),
		regexp.MustCompile(`^    server ` + tok + ` (?:[a-z0-9._-]+|\[[0-9a-f:.]+\]):[0-9]{1,5} weight [0-9]{1,3}$`),
	}
	staticLines = func() map[string]bool {
		m := map[string]bool{}
		for l := range strings.Lines(defaultTemplate) {
			if !strings.Contains(l, "{{") {
				m[strings.TrimSuffix(l, "\n")] = true
			}
		}
		return m
	}()
)

// checkGrammar fails for any line outside the grammar, or any byte that
// is not printable ASCII.
func checkGrammar(t testing.TB, cfg []byte) {
	t.Helper()
	for i, c := range cfg {
		if c != '\n' && (c < ' ' || c > '~') {
			t.Fatalf("byte 0x%02x at offset %d in the configuration:\n%s", c, i, cfg)
		}
	}
	for l := range strings.Lines(string(cfg)) {
		l = strings.TrimSuffix(l, "\n")
		if staticLines[l] {
			continue
		}
		ok := false
		for _, re := range dynamic {
			if re.MatchString(l) {
				ok = true
				break
			}
		}
		if !ok {
			t.Fatalf("line outside the grammar: %q\n--- config:\n%s", l, cfg)
		}
	}
}
