package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
)

// The soak's world: what should be registered in Consul and written in
// the services directory. Every churn step changes it by one seeded
// random action and makes the change real through soakEffects; a Consul
// that restarted empty gets the whole Consul part again.

// soakInst is one instance: an ID, the port of one of the pool's backends,
// and (Consul only) its TTL check's status.
type soakInst struct {
	id      string
	port    int
	passing bool
}

// soakService is a service of either source. Stable services are never
// changed: the load goes to them.
type soakService struct {
	name   string
	stable bool
	insts  []soakInst
}

// soakEffects makes the world's changes real. The soak's is Consul's agent
// API and the services directory; the tests record them.
type soakEffects interface {
	register(ctx context.Context, service string, in soakInst) error
	deregister(ctx context.Context, id string) error
	setHealth(ctx context.Context, id string, passing bool) error
	writeFile(name string, data []byte) error
	removeFile(name string) error
}

// Bounds of the churn: the catalog and the directory stay small, so that
// what grows over the run can only be a leak, not the data.
const (
	soakMaxConsulServices = 6 // churned ones, besides the stable
	soakMaxFileServices   = 4
	soakMaxInstances      = 4
)

type world struct {
	rng    *rand.Rand
	fx     soakEffects
	ports  []int // the backend pool; an instance of a service takes a port no other of its instances has
	consul map[string]*soakService
	files  map[string]*soakService
	next   int    // the number of the next service name
	bad    string // the file holding a malformed edit now, "" for none
	// done counts the actions taken, by kind, for the report.
	done map[string]int
}

// stableServices are the services the load goes to: two in Consul (with
// passing TTL checks) and one in the services directory.
var stableServices = []struct {
	name      string
	file      bool
	instances int
}{{"stable-a", false, 3}, {"stable-b", false, 2}, {"stable-f", true, 2}}

func newWorld(seed uint64, ports []int, fx soakEffects) *world {
	return &world{
		rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), fx: fx, ports: ports,
		consul: map[string]*soakService{}, files: map[string]*soakService{}, done: map[string]int{},
	}
}

// setup registers and writes the stable services.
func (w *world) setup(ctx context.Context) error {
	for _, st := range stableServices {
		s := &soakService{name: st.name, stable: true}
		for i := range st.instances {
			s.insts = append(s.insts, soakInst{id: fmt.Sprintf("%s-%d", st.name, i), port: w.ports[i], passing: true})
		}
		if st.file {
			if err := w.fx.writeFile(s.name, serviceFile(s)); err != nil {
				return err
			}
			w.files[s.name] = s
			continue
		}
		for _, in := range s.insts {
			if err := w.fx.register(ctx, s.name, in); err != nil {
				return err
			}
		}
		w.consul[s.name] = s
	}
	return nil
}

// reregister registers every Consul instance again, in its current
// health: what should exist, after a Consul that restarted empty.
func (w *world) reregister(ctx context.Context) error {
	for _, name := range slices.Sorted(maps.Keys(w.consul)) {
		for _, in := range w.consul[name].insts {
			if err := w.fx.register(ctx, name, in); err != nil {
				return fmt.Errorf("re-registering %s: %w", in.id, err)
			}
		}
	}
	return nil
}

// counts are the services and instances of both sources, the stable
// included, and of those the instances that pass.
func (w *world) counts() (services, instances, passing int) {
	for _, m := range []map[string]*soakService{w.consul, w.files} {
		for _, s := range m {
			services++
			instances += len(s.insts)
			for _, in := range s.insts {
				if in.passing {
					passing++
				}
			}
		}
	}
	return services, instances, passing
}

// churned lists the names of a source's services that are not stable, in
// order (map order would make the seed meaningless).
func churned(m map[string]*soakService) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if !m[name].stable {
			out = append(out, name)
		}
	}
	return out
}

// action is one possible churn step with its weight.
type action struct {
	kind   string
	weight float64
	do     func(ctx context.Context) error
}

// step takes one random action whose preconditions hold. A file left
// malformed by the previous step is fixed first: a bad edit should be
// seen (and refused) once, not kept until the end.
func (w *world) step(ctx context.Context) (string, error) {
	if w.bad != "" {
		name := w.bad
		w.bad = ""
		return w.record("file fix", w.fx.writeFile(name, serviceFile(w.files[name])))
	}
	var acts []action
	add := func(kind string, weight float64, ok bool, do func(ctx context.Context) error) {
		if ok {
			acts = append(acts, action{kind, weight, do})
		}
	}
	cs, fs := churned(w.consul), churned(w.files)
	add("consul service +", 2, len(cs) < soakMaxConsulServices, w.addConsulService)
	add("consul service -", 1.5, len(cs) > 0, func(ctx context.Context) error {
		return w.removeConsulService(ctx, pick(w.rng, cs))
	})
	add("consul instance +", 2, slices.ContainsFunc(cs, func(n string) bool { return len(w.consul[n].insts) < soakMaxInstances }),
		func(ctx context.Context) error { return w.addConsulInstance(ctx, cs) })
	add("consul instance -", 2, slices.ContainsFunc(cs, func(n string) bool { return len(w.consul[n].insts) > 1 }),
		func(ctx context.Context) error { return w.removeConsulInstance(ctx, cs) })
	add("health flap", 3, len(cs) > 0, func(ctx context.Context) error { return w.flap(ctx, cs) })
	add("file service +", 1, len(fs) < soakMaxFileServices, func(context.Context) error { return w.addFileService() })
	add("file replaced", 1, len(fs) > 0, func(context.Context) error { return w.replaceFile(pick(w.rng, fs)) })
	add("file removed", 0.7, len(fs) > 0, func(context.Context) error { return w.removeFile(pick(w.rng, fs)) })
	add("file malformed", 0.3, len(fs) > 0, func(context.Context) error { return w.malformFile(pick(w.rng, fs)) })
	add("stable file rewritten", 0.3, true, func(context.Context) error {
		return w.fx.writeFile("stable-f", serviceFile(w.files["stable-f"]))
	})
	var total float64
	for _, a := range acts {
		total += a.weight
	}
	r := w.rng.Float64() * total
	chosen := acts[len(acts)-1] // where rounding leaves r at the very end
	for _, a := range acts {
		if r < a.weight {
			chosen = a
			break
		}
		r -= a.weight
	}
	return w.record(chosen.kind, chosen.do(ctx))
}

func (w *world) record(kind string, err error) (string, error) {
	if err == nil {
		w.done[kind]++
	}
	return kind, err
}

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// newService names a service never seen before in the run, so that the
// catalog's names churn too (watches started and stopped).
func (w *world) newService(prefix string) *soakService {
	w.next++
	s := &soakService{name: fmt.Sprintf("%s-%04d", prefix, w.next)}
	for range 1 + w.rng.IntN(3) {
		s.insts = append(s.insts, w.newInst(s))
	}
	return s
}

// newInst is an instance of s with a fresh ID, on a pool port that no
// other instance of s has.
func (w *world) newInst(s *soakService) soakInst {
	var free []int
	for _, p := range w.ports {
		if !slices.ContainsFunc(s.insts, func(in soakInst) bool { return in.port == p }) {
			free = append(free, p)
		}
	}
	n := 0
	for slices.ContainsFunc(s.insts, func(in soakInst) bool { return in.id == fmt.Sprintf("%s-%d", s.name, n) }) {
		n++
	}
	return soakInst{id: fmt.Sprintf("%s-%d", s.name, n), port: pick(w.rng, free), passing: true}
}

func (w *world) addConsulService(ctx context.Context) error {
	s := w.newService("churn")
	for _, in := range s.insts {
		if err := w.fx.register(ctx, s.name, in); err != nil {
			return err
		}
	}
	w.consul[s.name] = s
	return nil
}

func (w *world) removeConsulService(ctx context.Context, name string) error {
	for _, in := range w.consul[name].insts {
		if err := w.fx.deregister(ctx, in.id); err != nil {
			return err
		}
	}
	delete(w.consul, name)
	return nil
}

func (w *world) addConsulInstance(ctx context.Context, names []string) error {
	names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return len(w.consul[n].insts) >= soakMaxInstances })
	s := w.consul[pick(w.rng, names)]
	in := w.newInst(s)
	if err := w.fx.register(ctx, s.name, in); err != nil {
		return err
	}
	s.insts = append(s.insts, in)
	return nil
}

func (w *world) removeConsulInstance(ctx context.Context, names []string) error {
	names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return len(w.consul[n].insts) <= 1 })
	s := w.consul[pick(w.rng, names)]
	i := w.rng.IntN(len(s.insts))
	if err := w.fx.deregister(ctx, s.insts[i].id); err != nil {
		return err
	}
	s.insts = slices.Delete(s.insts, i, i+1)
	return nil
}

func (w *world) flap(ctx context.Context, names []string) error {
	s := w.consul[pick(w.rng, names)]
	in := &s.insts[w.rng.IntN(len(s.insts))]
	if err := w.fx.setHealth(ctx, in.id, !in.passing); err != nil {
		return err
	}
	in.passing = !in.passing
	return nil
}

func (w *world) addFileService() error {
	s := w.newService("file")
	if err := w.fx.writeFile(s.name, serviceFile(s)); err != nil {
		return err
	}
	w.files[s.name] = s
	return nil
}

// replaceFile rewrites a file with one instance added or removed.
func (w *world) replaceFile(name string) error {
	s := w.files[name]
	next := &soakService{name: s.name, insts: slices.Clone(s.insts)}
	if len(next.insts) > 1 && (len(next.insts) >= soakMaxInstances || w.rng.IntN(2) == 0) {
		i := w.rng.IntN(len(next.insts))
		next.insts = slices.Delete(next.insts, i, i+1)
	} else {
		next.insts = append(next.insts, w.newInst(next))
	}
	if err := w.fx.writeFile(name, serviceFile(next)); err != nil {
		return err
	}
	w.files[name] = next
	return nil
}

func (w *world) removeFile(name string) error {
	if err := w.fx.removeFile(name); err != nil {
		return err
	}
	delete(w.files, name)
	return nil
}

// malformFile writes a file seamless must refuse (naming its file and
// line) while that service keeps its last good content.
func (w *world) malformFile(name string) error {
	bad := fmt.Sprintf("name: %s\ninstances:\n  - address: 127.0.0.1\n    port: seventy\n", name)
	if err := w.fx.writeFile(name, []byte(bad)); err != nil {
		return err
	}
	w.bad = name
	return nil
}

// fixBad rewrites a malformed file with its good content, so that the
// directory at the end holds only what the world says.
func (w *world) fixBad() error {
	if w.bad == "" {
		return nil
	}
	name := w.bad
	w.bad = ""
	return w.fx.writeFile(name, serviceFile(w.files[name]))
}

// unchurn removes every service but the stable ones from both sources:
// the catalog and directory the run started with.
func (w *world) unchurn(ctx context.Context) error {
	if err := w.fixBad(); err != nil {
		return err
	}
	for _, name := range churned(w.consul) {
		if err := w.removeConsulService(ctx, name); err != nil {
			return err
		}
	}
	for _, name := range churned(w.files) {
		if err := w.removeFile(name); err != nil {
			return err
		}
	}
	return nil
}

// serviceFile is a service as the file source reads it.
func serviceFile(s *soakService) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\ninstances:\n", s.name)
	for _, in := range s.insts {
		fmt.Fprintf(&b, "  - id: %s\n    address: 127.0.0.1\n    port: %d\n", in.id, in.port)
	}
	return []byte(b.String())
}

// soakTemplate is the user template seamless runs (SEAMLESS_TEMPLATE),
// version v of it: every service of both sources is routed by the path
// prefix /NAME/ to a backend of its passing instances. The versions
// differ in a response header and the balance algorithm, a real edit that
// HAProxy must reload for.
func soakTemplate(bind string, v int) []byte {
	balance := "roundrobin"
	if v%2 == 1 {
		balance = "leastconn"
	}
	return fmt.Appendf(nil, `# seamless soak template, version %[1]d
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option idle-close-on-response
    option redispatch
    retries 3

frontend http
    bind %[2]s
    http-response set-header X-Soak-Template %[1]d
{{- range services}}
    use_backend {{haproxyName .Name}} if { path_beg /{{haproxyName .Name}}/ }
{{- end}}
{{range services}}
backend {{haproxyName .Name}}
    balance %[3]s
{{- range service .Name}}
    server {{haproxyName .ID}} {{haproxyAddr .Address .Port}} check inter 2s
{{- end}}
{{end}}`, v, bind, balance)
}
