package routes

import (
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// nasty are strings that would add or bend a directive if they reached the
// configuration as they are.
var nasty = []string{
	"x\n    server evil 203.0.113.9:80",
	"x\r\nbackend evil\n    server evil 203.0.113.9:80",
	"seamless.http.host=x\n    server evil 203.0.113.9:80",
	`x" "server evil 203.0.113.9:80`,
	"x'evil'",
	"x # server evil 203.0.113.9:80",
	"x server evil 203.0.113.9:80",
	"%[src]",
	"%{+Q}o",
	"$EVIL",
	"${EVIL}",
	`x\` + "\n" + `    server evil 203.0.113.9:80`,
	`x\\`,
	"x\x00evil",
	"x\tevil",
	"évil",
	"{{.HTTPBind}}",
	".if feature(PROMEX)",
	"203.0.113.9:80",
	"[203.0.113.9]",
	"::ffff:203.0.113.9%eth0",
}

// nastyCatalog puts n in every field an instance has, one field per
// service, each next to a valid instance that must still be served.
func nastyCatalog(n string) []model.Instance {
	ok := func(service, addr string, tags ...string) model.Instance {
		return inst(service, service+"-ok", addr, 8080, tags...)
	}
	return []model.Instance{
		// In the service name.
		inst(n, "a", "10.0.0.1", 8080, "seamless.http.host=name.example"),
		// In the instance ID.
		inst("id", n, "10.0.0.2", 8080, "seamless.http.host=id.example"),
		ok("id", "10.0.0.22", "seamless.http.host=id.example"),
		// In the address.
		inst("addr", "bad", n, 8080, "seamless.http.host=addr.example"),
		ok("addr", "10.0.0.3", "seamless.http.host=addr.example"),
		// In tags, as a value of each kind and as a tag of its own.
		inst("tags", "t", "10.0.0.4", 8080, "seamless.http.host="+n, "seamless.http.path=/"+n, "seamless.tcp.port="+n,
			n, "seamless."+n, "seamless.http.host=tags.example"),
		ok("tags", "10.0.0.44", "seamless.http.host=tags.example"),
		// In the node's name and address.
		with(inst("node", "n", "10.0.0.6", 8080, "seamless.http.host=node.example"), func(in *model.Instance) {
			in.Node, in.NodeAddress = n, n
		}),
		ok("node", "10.0.0.66", "seamless.http.host=node.example"),
		// In meta and the other untrusted fields nobody renders.
		with(inst("meta", "m", "10.0.0.5", 8080, "seamless.http.host=meta.example"), func(in *model.Instance) {
			in.Meta = map[string]string{n: n}
			in.Datacenter, in.Namespace, in.Kind = n, n, n
			in.NodeMeta = map[string]string{n: n}
			in.TaggedAddresses = map[string]string{"lan": n}
			in.Checks = []model.Check{{CheckID: n, Output: n, Status: model.StatusPassing}}
		}),
	}
}

func TestInjection(t *testing.T) {
	r := mustNew(t, goldenOpts)
	var all []model.Instance
	for i, n := range nasty {
		cat := nastyCatalog(n)
		out := render(t, r, catalog(cat...))
		checkGrammar(t, out.Config)
		checkServers(t, out.Config)
		checkSkipped(t, out.Skipped)
		for _, s := range []string{"id-ok", "addr-ok", "tags-ok", "node-ok", "meta.example", "server m "} {
			if !strings.Contains(string(out.Config), s) {
				t.Errorf("nasty[%d] %q: %s was left out with the bad value", i, n, s)
			}
		}
		// Every service's instances once more, renamed, for one combined
		// check by HAProxy itself.
		for _, in := range cat {
			if in.Name != n {
				in.Name += "-" + string(rune('a'+i))
			}
			all = append(all, in)
		}
	}
	out := render(t, r, catalog(all...))
	checkGrammar(t, out.Config)
	haproxyCheck(t, out.Config)
}

// checkServers fails when a server line points anywhere but the addresses
// the test catalogs use.
func checkServers(t testing.TB, cfg []byte) {
	t.Helper()
	for l := range strings.Lines(string(cfg)) {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "server" {
			if len(f) != 5 || strings.Contains(f[2], "203.0.113.9") {
				t.Fatalf("injected server line: %q", l)
			}
		}
	}
}

// checkSkipped fails when a report would put a control character into the
// log.
func checkSkipped(t testing.TB, skipped []string) {
	t.Helper()
	for _, s := range skipped {
		if strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			t.Fatalf("control character in a report: %q", s)
		}
	}
}

func FuzzRender(f *testing.F) {
	for _, n := range nasty {
		f.Add(n, "id", "10.0.0.1", 80, "seamless.http.host="+n, "seamless.http.path=/"+n, "seamless.tcp.port=1", 1, model.StatusPassing)
		f.Add("svc", n, n, 443, n, "seamless.http.host=a.example", "seamless.tcp.port="+n, 256, model.StatusWarning)
	}
	f.Add("web", "web-1", "2001:db8::1", 8080, "seamless.http.host=*.apps.example", "seamless.http.path=/api/", "seamless.tcp.port=5432", 0, "")
	f.Add("anchor", "anchor-1", "web.internal", 65535, "seamless.http.host=anchor.example", "seamless.http.path=/", "x", -1, model.StatusCritical)
	r := mustNew(f, Options{HTTPBind: "127.0.0.1:18080", StatsBind: "127.0.0.1:18404", Health: []string{"passing", "warning"}})
	f.Fuzz(func(t *testing.T, service, id, addr string, port int, tag1, tag2, tag3 string, weight int, status string) {
		insts := []model.Instance{
			{Source: "fuzz", Name: service, ID: id, Node: tag3, Address: addr, Port: port, Tags: []string{tag1, tag2, tag3},
				Weight: weight, WarningWeight: weight / 2, Status: status, Meta: map[string]string{tag1: tag2}},
			inst(service, id+"-2", "10.0.0.2", 8080, tag3, tag2),
			inst("anchor", "anchor-1", "10.9.9.9", 80, "seamless.http.host=anchor.example"),
		}
		out, err := r.Render(catalog(insts...))
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		checkGrammar(t, out.Config)
		checkSkipped(t, out.Skipped)
		if !strings.Contains(string(out.Config), "    server anchor-1 10.9.9.9:80 weight 1\n") &&
			!slices.ContainsFunc(out.Skipped, func(s string) bool { return strings.HasPrefix(s, "service anchor:") }) {
			t.Fatalf("the valid service anchor vanished without a report:\n%s", out.Config)
		}
		slices.Reverse(insts)
		again, err := r.Render(catalog(insts...))
		if err != nil || string(again.Config) != string(out.Config) || !slices.Equal(again.Skipped, out.Skipped) {
			t.Fatalf("the order of instances changed the rendering")
		}
	})
}
