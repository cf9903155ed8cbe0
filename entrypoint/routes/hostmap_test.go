package routes

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Past hostMapMin exact hosts routed whole, they are looked up in a map
// file, in the place their rules had: after the path rules of exact
// hosts, before wildcards and paths for any host. Fewer keep a rule each.
// The rendering hands the file to the applier to write; it writes none.
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

	if len(out.Files) != 1 || filepath.Dir(out.Files[0].Path) != dir {
		t.Fatalf("files: %+v, want one map in %s", out.Files, dir)
	}
	if written, _ := os.ReadDir(dir); len(written) != 0 {
		t.Errorf("the renderer wrote %d files", len(written))
	}
	m := out.Files[0]
	if lines := strings.Split(strings.TrimSpace(string(m.Data)), "\n"); len(lines) != hostMapMin ||
		lines[0] != "h00.example http-svc00" || lines[hostMapMin-1] != fmt.Sprintf("h%02d.example http-svc%02d", hostMapMin-1, hostMapMin-1) {
		t.Errorf("map:\n%s", m.Data)
	}
	at := func(s string) int {
		i := strings.Index(cfg, s)
		if i < 0 {
			t.Fatalf("%q is not in the configuration:\n%s", s, cfg)
		}
		return i
	}
	path, lookup, wildcard, static := at("{ var(txn.path) -m beg /api/ }"), at("map_str("+m.Path+")"),
		at("-m end .apps.example }"), at("use_backend http-static if { var(txn.path) -m beg /static/ }")
	if !(path < lookup && lookup < wildcard && wildcard < static) {
		t.Errorf("rules out of order: path %d, map %d, wildcard %d, any host %d", path, lookup, wildcard, static)
	}
	if strings.Contains(cfg, "-m str h05.example }\n") {
		t.Error("a host of the map still has a rule")
	}

	t.Log("one host fewer than hostMapMin: a rule each, and no file")
	few := render(t, r, catalog(insts[1:]...))
	if strings.Contains(string(few.Config), "map_str(") || !strings.Contains(string(few.Config), "-m str h05.example }") ||
		len(few.Files) != 0 {
		t.Errorf("below hostMapMin (%d files):\n%s", len(few.Files), few.Config)
	}
}

// A commit (HAProxy runs the rendering) removes every map but its own:
// those an earlier run left, those of renderings HAProxy did not take, and
// what an interrupted write left.
func TestACommitKeepsOnlyItsHostsMap(t *testing.T) {
	dir := t.TempDir()
	left := []string{filepath.Join(dir, "hosts-00000000000000000000000000000000.map"),
		filepath.Join(dir, ".hosts-00000000000000000000000000000001.map.tmp-123")}
	for _, p := range append(left, filepath.Join(dir, "server-state")) {
		if err := os.WriteFile(p, []byte("x\n"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	insts := hostedInstances(3)
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", HostMapDir: dir, hostMapMin: 2})
	apply := func(c model.State) string { // as the applier does: write, then commit
		t.Helper()
		out := renderWritten(t, r, c)
		for _, p := range left {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("a rendering not yet committed removed %s", p)
			}
		}
		out.Commit()
		return out.Files[0].Path
	}
	files := func() []string {
		var names []string
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			names = append(names, filepath.Join(dir, e.Name()))
		}
		return names
	}
	first := apply(catalog(insts...))
	if got := files(); !slices.Equal(got, []string{first, filepath.Join(dir, "server-state")}) {
		t.Fatalf("after the first commit: %v", got)
	}
	left = append(left[:0], first)
	second := apply(catalog(insts[1:]...))
	if got := files(); second == first || !slices.Equal(got, []string{second, filepath.Join(dir, "server-state")}) {
		t.Fatalf("after a commit with other hosts: %v", got)
	}
}

// A commit that keeps the map HAProxy reads already does not list the
// directory: nothing but a rendering can have put a map there since. A
// rendering naming another map (written, then not taken) brings the sweep
// back at the next commit.
func TestACommitOfTheSameHostsMapSweepsNothing(t *testing.T) {
	dir := t.TempDir()
	insts := hostedInstances(3)
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", HostMapDir: dir, hostMapMin: 2})
	render := func(c model.State) model.Rendering { t.Helper(); return renderWritten(t, r, c) }
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	first := render(catalog(insts...))
	first.Commit()
	// Put there behind the renderer's back: only a sweep would remove it.
	marker := filepath.Join(dir, "hosts-00000000000000000000000000000000.map")
	if err := os.WriteFile(marker, []byte("x\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	moved := slices.Clone(insts)
	moved[0].Port = 9000
	same := render(catalog(moved...))
	if same.Files[0].Path != first.Files[0].Path {
		t.Fatalf("a port changed the hosts map: %s, then %s", first.Files[0].Path, same.Files[0].Path)
	}
	same.Commit()
	if !exists(marker) {
		t.Fatal("a commit of the map HAProxy reads already listed the directory")
	}
	other := render(catalog(insts[1:]...)) // written, never committed: refused
	again := render(catalog(moved...))
	again.Commit()
	for _, p := range []string{marker, other.Files[0].Path} {
		if exists(p) {
			t.Errorf("after a rendering named another map, a commit left %s", p)
		}
	}
	if !exists(again.Files[0].Path) {
		t.Errorf("the commit removed its own map %s", again.Files[0].Path)
	}
}

// hostedInstances is n services of an instance each, each with a host.
func hostedInstances(n int) []model.Instance {
	var insts []model.Instance
	for i := range n {
		insts = append(insts, inst(fmt.Sprintf("svc%d", i), fmt.Sprintf("svc%d-1", i), "10.0.0.1", 8000+i,
			fmt.Sprintf("seamless.http.host=h%d.example", i)))
	}
	return insts
}

// renderWritten renders c with its one hosts map and writes the map, as
// the applier does before it hands the rendering to HAProxy.
func renderWritten(t *testing.T, r *Renderer, c model.State) model.Rendering {
	t.Helper()
	out, err := r.Render(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Files) != 1 {
		t.Fatalf("files: %+v", out.Files)
	}
	if err := os.WriteFile(out.Files[0].Path, out.Files[0].Data, 0o640); err != nil {
		t.Fatal(err)
	}
	return out
}
