package routes

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Past hostMapMin exact hosts routed whole, they are looked up in a map
// file, in the place their rules had: after the path rules of exact
// hosts, before wildcards and paths for any host. Fewer keep a rule each.
func TestManyExactHostsAreLookedUpInAMap(t *testing.T) {
	dir := t.TempDir()
	var insts []model.Instance
	for i := range hostMapMin {
		insts = append(insts, inst(fmt.Sprintf("svc%02d", i), fmt.Sprintf("svc%02d-1", i), "10.0.0.1", 8000+i,
			fmt.Sprintf("seamless.http.host=h%02d.example", i)))
	}
	insts = append(insts,
		inst("api", "api-1", "10.0.1.1", 80, "seamless.http.host=h00.example", "seamless.http.path=/api"),
		inst("apps", "apps-1", "10.0.1.2", 80, "seamless.http.host=*.apps.example"),
		inst("static", "static-1", "10.0.1.3", 80, "seamless.http.path=/static"))
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", HostMapDir: dir})
	out := render(t, r, catalog(insts...))
	cfg := string(out.Config)

	maps, _ := filepath.Glob(filepath.Join(dir, "hosts-*.map"))
	if len(maps) != 1 {
		t.Fatalf("map files: %v, want one", maps)
	}
	text, err := os.ReadFile(maps[0])
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(text)), "\n"); len(lines) != hostMapMin ||
		lines[0] != "h00.example http-svc00" || lines[hostMapMin-1] != fmt.Sprintf("h%02d.example http-svc%02d", hostMapMin-1, hostMapMin-1) {
		t.Errorf("map:\n%s", text)
	}
	at := func(s string) int {
		i := strings.Index(cfg, s)
		if i < 0 {
			t.Fatalf("%q is not in the configuration:\n%s", s, cfg)
		}
		return i
	}
	path, lookup, wildcard, static := at("{ var(txn.path) -m beg /api/ }"), at("map_str("+maps[0]+")"),
		at("-m end .apps.example }"), at("use_backend http-static if { var(txn.path) -m beg /static/ }")
	if !(path < lookup && lookup < wildcard && wildcard < static) {
		t.Errorf("rules out of order: path %d, map %d, wildcard %d, any host %d", path, lookup, wildcard, static)
	}
	if strings.Contains(cfg, "-m str h05.example }\n") {
		t.Error("a host of the map still has a rule")
	}

	t.Log("one host fewer than hostMapMin: a rule each, and the map is removed once that runs")
	few := render(t, r, catalog(insts[1:]...))
	if strings.Contains(string(few.Config), "map_str(") || !strings.Contains(string(few.Config), "-m str h05.example }") {
		t.Errorf("below hostMapMin:\n%s", few.Config)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "hosts-*.map")); len(left) != 0 {
		t.Errorf("maps left once no configuration names one: %v", left)
	}
}

// A map's name holds its content's digest: another set of hosts is
// another file, and a commit removes every map but its own, also those
// an earlier run left.
func TestACommitKeepsOnlyItsHostsMap(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "hosts-00000000000000ff.map")
	if err := os.WriteFile(stale, []byte("old.example http-old\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	var insts []model.Instance
	for i := range 3 {
		insts = append(insts, inst(fmt.Sprintf("svc%d", i), fmt.Sprintf("svc%d-1", i), "10.0.0.1", 8000+i,
			fmt.Sprintf("seamless.http.host=h%d.example", i)))
	}
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", HostMapDir: dir, hostMapMin: 2})
	uncommitted, err := r.Render(catalog(insts...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err != nil {
		t.Fatal("a rendering not yet committed removed a map")
	}
	uncommitted.Commit()
	first, _ := filepath.Glob(filepath.Join(dir, "hosts-*.map"))
	if len(first) != 1 || first[0] == stale {
		t.Fatalf("after the first commit: %v", first)
	}
	render(t, r, catalog(insts[1:]...))
	second, _ := filepath.Glob(filepath.Join(dir, "hosts-*.map"))
	if len(second) != 1 || second[0] == first[0] {
		t.Fatalf("after a commit with other hosts: %v (first %v)", second, first)
	}
}
