// Package ctcompat renders the same templates from the same real Consul
// data through seamless (`seamless render`) and through consul-template
// itself (`consul-template -once`, built by `make consul-template`), and
// compares the bytes.
package ctcompat

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/internal/testenv"
)

var seamless string

func TestMain(m *testing.M) { testenv.RunWithSeamless(m, "../../cmd/seamless", &seamless) }

// consulTemplate is $SEAMLESS_CONSUL_TEMPLATE_BIN; unset, the test is
// skipped on a developer machine and fails under CI, where make test sets
// it.
func consulTemplate(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SEAMLESS_CONSUL_TEMPLATE_BIN")
	if bin == "" {
		if testenv.CI() {
			t.Fatal("SEAMLESS_CONSUL_TEMPLATE_BIN is not set under CI (make test builds consul-template and sets it)")
		}
		t.Skip("SEAMLESS_CONSUL_TEMPLATE_BIN is not set (make consul-template builds it)")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("SEAMLESS_CONSUL_TEMPLATE_BIN: %v", err)
	}
	return bin
}

// cert is a two-line meta value on one instance, as templates insert
// certificates with indent.
const cert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----"

// seed registers two nodes with "web" (one instance carrying the
// multi-line meta) and "api", and a few KV keys.
func seed(t *testing.T, c *api.Client) {
	t.Helper()
	regs := []*api.CatalogRegistration{
		{Node: "node1", Address: "10.0.0.1", NodeMeta: map[string]string{"rack": "r1"}, Service: &api.AgentService{
			ID: "web-1", Service: "web", Address: "10.0.0.1", Port: 8080, Tags: []string{"prod", "v1"},
			Meta: map[string]string{"version": "1", "cert": cert}}},
		{Node: "node2", Address: "10.0.0.2", Service: &api.AgentService{
			ID: "web-2", Service: "web", Address: "10.0.0.2", Port: 8080, Tags: []string{"prod"},
			Meta: map[string]string{"version": "2"}}},
		{Node: "node1", Address: "10.0.0.1", NodeMeta: map[string]string{"rack": "r1"}, Service: &api.AgentService{
			ID: "api-1", Service: "api", Address: "10.0.0.1", Port: 9090, Tags: []string{"http"}}},
	}
	for _, r := range regs {
		if _, err := c.Catalog().Register(r, nil); err != nil {
			t.Fatalf("registering %s: %v", r.Service.ID, err)
		}
	}
	for k, v := range map[string]string{
		"service/haproxy/maxconn":          "4096",
		"service/haproxy/timeouts/client":  "30s",
		"service/haproxy/timeouts/connect": "5s",
		"service/haproxy/timeouts/server":  "30s",
		"service/haproxy/timeouts/x/deep":  "ls skips it",
		"config/weights/node1":             "10",
		"config/weights/node2":             "20",
		"config/banner":                    "two\nlines",
	} {
		if _, err := c.KV().Put(&api.KVPair{Key: k, Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSameBytesAsConsulTemplate(t *testing.T) {
	ct := consulTemplate(t)
	consul := testenv.Consul(t)
	seed(t, consul.Client())

	tests := []struct {
		name     string
		template string
		env      []string // seamless's
		ctArgs   []string // consul-template's
	}{
		{name: "service, services, tags and meta beside a multi-line meta value", template: `{{ range services }}# {{ .Name }}: {{ .Tags | join "," }}
backend {{ .Name }}
{{- range service .Name }}
    server {{ .Node }} {{ .Address }}:{{ .Port }} # {{ .ID }} {{ .Tags | join "," }} v{{ index .ServiceMeta "version" }}{{ if .Tags | contains "v1" }} first{{ end }}
{{- end }}
{{ end }}{{ range service "prod.web" }}{{ .Node }} rack={{ index .NodeMeta "rack" }}
{{ end }}`},
		{name: "a multi-line meta value inserted with indent (SEAMLESS_TEMPLATE_RAW_META)", template: `{{ range service "web" }}{{ $node := .Node }}{{ with index .ServiceMeta "cert" }}crt-list {{ $node }}
{{ . | indent 4 }}
{{ end }}server {{ .Node }} {{ .Address }}:{{ .Port }}
{{ end }}`, env: []string{"SEAMLESS_TEMPLATE_RAW_META=true"}},
		{name: "ls, key, keyOrDefault and tree", template: `global
    maxconn {{ key "service/haproxy/maxconn" }}
    mode {{ keyOrDefault "service/haproxy/mode" "http" }}
{{ range ls "service/haproxy/timeouts" }}    timeout {{ .Key }} {{ .Value }}
{{ end }}{{ range tree "config" }}# {{ .Key }} = {{ .Value | replaceAll "\n" " " }}
{{ end }}`},
		{name: "custom delimiters", template: `global
    maxconn [[ key "service/haproxy/maxconn" ]]
    # {{ not an action }}
[[ range service "web" ]]    server [[ .Node ]] [[ .Address ]]:[[ .Port ]]
[[ end ]]`, env: []string{"SEAMLESS_TEMPLATE_DELIMITERS=[[ ]]"},
			ctArgs: []string{"-default-left-delimiter=[[", "-default-right-delimiter=]]"}},
		{name: "no query", template: `global
    maxconn {{ env "MAXCONN" }}
    # nothing from Consul
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "haproxy.cfg.tmpl")
			if err := os.WriteFile(in, []byte(tt.template), 0o644); err != nil {
				t.Fatal(err)
			}
			want := runConsulTemplate(t, ct, consul.Addr(), in, tt.ctArgs)
			start := time.Now()
			got := runSeamless(t, consul.Addr(), in, tt.env)
			took := time.Since(start)
			if !bytes.Equal(got, want) {
				t.Errorf("seamless and consul-template differ\n--- seamless ---\n%s\n--- consul-template ---\n%s", got, want)
			}
			// The discovery timeout is 10 s: a template that reads nothing
			// from Consul must not wait for it (consul-template: 0.1 s).
			if took > 5*time.Second {
				t.Errorf("seamless render took %s", took)
			}
		})
	}
	t.Run(".Tags.Contains is a superset", func(t *testing.T) { tagsContains(t, ct, consul.Addr()) })
}

// tagsContains: FUNCTIONS.md says where seamless accepts more;
// .Tags.Contains renders in seamless and fails in consul-template v0.41
// with the message quoted there.
func tagsContains(t *testing.T, ct, addr string) {
	in := filepath.Join(t.TempDir(), "contains.tmpl")
	text := `{{ range service "web" }}{{ if .Tags.Contains "v1" }}{{ .Node }}{{ end }}{{ end }}`
	if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := runSeamless(t, addr, in, nil); string(got) != "node1" {
		t.Errorf("seamless rendered %q, want node1", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ct, "-once", "-consul-addr="+addr, "-template="+in+":"+in+".out")
	cmd.Env = env()
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("can't evaluate field Contains in type dependency.ServiceTags")) {
		t.Errorf("consul-template: %v\n%s\nwant the error FUNCTIONS.md quotes", err, out)
	}
}

// env is what both programs see: no token or address from the machine.
func env(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "MAXCONN=2000"}, extra...)
}

func runConsulTemplate(t *testing.T, bin, addr, in string, args []string) []byte {
	t.Helper()
	out := in + ".consul-template"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"-once", "-consul-addr=" + addr, "-log-level=warn",
		"-template=" + in + ":" + out}, args...)...)
	cmd.Env = env()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("consul-template: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func runSeamless(t *testing.T, addr, in string, extra []string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, seamless, "render")
	cmd.Env = env(append([]string{"CONSUL_HTTP_ADDR=" + addr, "SEAMLESS_SOURCES=consul", "SEAMLESS_TEMPLATE=" + in,
		"SEAMLESS_STATE_DIR=" + t.TempDir(), "SEAMLESS_DISCOVERY_TIMEOUT=10s", "SEAMLESS_LOG_LEVEL=warn"}, extra...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("seamless render: %v\n%s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("seamless render's log:\n%s", stderr.String())
	}
	return stdout.Bytes()
}
