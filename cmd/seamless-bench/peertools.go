package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The tools `seamless-bench peer` compares, and how each is run.

// peerTool is one tool of the side-by-side.
type peerTool struct {
	key, title string
}

var (
	toolCT = peerTool{"ct", "consul-template"}
	// toolCTCheck is consul-template with the check the classic recipe
	// runs before its reload (`haproxy -c`) as its command: the same
	// validation as seamless's template path, whose CPU the tool's counts
	// (a command is a child it waits for). The reload itself is left out.
	toolCTCheck = peerTool{"ctcheck", "consul-template + haproxy -c"}
	// toolCTReload is the classic recipe whole: consul-template renders a
	// configuration that routes by Host header, as the built-in does, and
	// its command starts a new HAProxy daemon with -sf, which takes over
	// from the old one. Its changes are probed through that HAProxy, so
	// that seamless's change → served has the recipe's beside it.
	toolCTReload = peerTool{"ctreload", "consul-template + haproxy -D -sf"}
	toolTemplate = peerTool{"template", "seamless, template"}
	toolBuiltin  = peerTool{"builtin", "seamless, built-in"}
	peerTools    = []peerTool{toolCT, toolCTCheck, toolCTReload, toolTemplate, toolBuiltin}
)

// consulTemplate: the tool is consul-template, with a command or without.
func (p peerTool) consulTemplate() bool {
	return p == toolCT || p == toolCTCheck || p == toolCTReload
}

// serves: the tool runs an HAProxy that routes by Host, through which its
// changes are probed.
func (p peerTool) serves() bool { return p == toolBuiltin || p == toolCTReload }

// peerTemplate is the classic consul-template HAProxy template (the shape
// of entrypoint/template/testdata/classic.tmpl: a KV knob, a backend per
// service, a server per instance), written so that consul-template v0.41
// renders it too (no .Tags.Contains) and without health checks, so that
// HAProxy's checks of every server do not load the machine the other
// tools are measured on. Both consul-template and seamless render it;
// routes goes after the frontend's bind.
func peerTemplate(routes string) string {
	return `global
    maxconn {{ keyOrDefault "service/haproxy/maxconn" "4096" }}

defaults
    mode http
    option idle-close-on-response
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend http-in
    bind {{ env "PEER_HTTP_BIND" }}` + routes + `
{{ range services }}
backend {{ .Name }}
    balance roundrobin{{ range service .Name }}
    server {{ .ID }} {{ .Address }}:{{ .Port }}{{ end }}
{{ end }}`
}

// peerRoutes sends each service's host (layout.host) to its backend, one
// rule per service as the recipe's templates write them.
const peerRoutes = `{{ range services }}
    use_backend {{ .Name }} if { hdr(host) -i {{ .Name }}` + benchDomain + ` }{{ end }}`

// toolRun is one running tool with its proxy and its rendered file.
type toolRun struct {
	tool    peerTool
	proxy   *countingProxy
	file    *renderedFile
	started time.Time

	ct *proc         // consul-template
	d  *discoveryRun // seamless

	http    string // the frontend probed for changes served (tool.serves)
	daemons string // ctreload: the directory its HAProxy daemons name

	stopWatch func()         // ends file.run
	watched   chan struct{}  // closed when file.run has returned
	watchErr  error          // why file.run returned, read after watched is closed
	probing   sync.WaitGroup // probeServed goroutines

	// served[k]: when a request through HAProxy first reached change k's
	// listener (tool.serves only); zero: not yet.
	servedMu sync.Mutex
	served   []time.Time
	probes   int // requests sent for that
}

// pid is the tool's own process.
func (t *toolRun) pid() int {
	if t.ct != nil {
		return t.ct.pid()
	}
	return t.d.p.pid()
}

func (t *toolRun) alive() error {
	if t.ct != nil {
		return t.ct.alive()
	}
	return t.d.p.alive()
}

// cpu is the tool's CPU time: its own and its children's it has waited
// for (seamless: every `haproxy -c`), not HAProxy's master and workers,
// which haproxyCPU reads.
func (t *toolRun) cpu() (time.Duration, error) {
	self, children, err := procCPU(t.pid())
	return self + children, err
}

// haproxyCPU is the CPU time of the processes seamless runs now (HAProxy's
// master and workers, a `haproxy -c` under way); 0 for consul-template.
func (t *toolRun) haproxyCPU() time.Duration {
	if t.d == nil {
		return 0
	}
	return treeCPU(t.pid())
}

func (t *toolRun) stop() error {
	t.stopWatch()
	<-t.watched
	var err error
	if t.ct != nil {
		// SIGINT is its kill_signal; SIGTERM would only be passed on to a
		// command, of which none runs for long.
		err = t.ct.stop(syscall.SIGINT, stopGrace)
	}
	if t.daemons != "" { // no children of consul-template's
		err = errors.Join(err, stopDaemonsIn(filepath.Join(t.daemons, "haproxy.pid"), t.daemons, stopGrace))
	}
	if t.d != nil {
		err = t.d.stop()
	}
	t.proxy.stop()
	return err
}

func (t *toolRun) logSummary() string {
	if t.d != nil {
		return "seamless logged " + t.d.logSummary()
	}
	path := filepath.Join(filepath.Dir(t.file.path), "consul-template.log")
	if s := tail(path, 3); s != "" {
		return "consul-template's last log lines: " + strings.ReplaceAll(s, "\n", " | ")
	}
	return "consul-template logged nothing at warn or above"
}

func (t *toolRun) withLog(err error) error {
	if err == nil {
		return nil
	}
	if t.d != nil {
		return t.d.withLog(err)
	}
	path := filepath.Join(filepath.Dir(t.file.path), "consul-template.log")
	if s := tail(path, 10); s != "" {
		return fmt.Errorf("%w\n--- %s (last lines)\n%s", err, path, s)
	}
	return err
}

// toolSetup is what every tool of a row shares.
type toolSetup struct {
	o        peerOptions
	l        layout
	consul   string            // the agent's HTTP address
	defaults map[string]string // seamless env
	ports    []int             // by change: the port it moves an instance to
	changes  []peerChange
}

// inFile returns, by change, whether a rendered file shows it: the new
// address in it, or for a removal the instance's address no longer a
// server that takes traffic in its service's backend.
func (s toolSetup) inFile(tool peerTool) []func([]byte) bool {
	out := make([]func([]byte) bool, len(s.changes))
	for k, c := range s.changes {
		if s.o.change == changeRemove {
			backend, addr := s.l.service(c.svc), "127.0.0.1:"+strconv.Itoa(s.l.port(c.inst))
			if tool == toolBuiltin {
				backend = "http-" + backend // the built-in's backend of a service's HTTP routes
			}
			out[k] = func(b []byte) bool { return !servesIn(b, backend, addr) }
			continue
		}
		addr := []byte("127.0.0.1:" + strconv.Itoa(s.ports[k]))
		out[k] = func(b []byte) bool { return containsAddr(b, addr) }
	}
	return out
}

// loadedCheck reports whether a rendered file holds every instance of the
// layout at its registered address.
func (s toolSetup) loadedCheck() func([]byte) bool {
	var addrs [][]byte
	for _, p := range slices.Compact(slices.Sorted(slices.Values(s.l.ports))) {
		addrs = append(addrs, []byte("127.0.0.1:"+strconv.Itoa(p)))
	}
	want := s.l.services * s.l.instances
	return func(b []byte) bool {
		n := 0
		for _, a := range addrs {
			n += countAddrs(b, a)
		}
		return n >= want
	}
}

// startTool starts tool behind a proxy of its own, in dir.
func startTool(ctx context.Context, s toolSetup, tool peerTool, dir string) (*toolRun, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	proxy, err := startProxy(s.consul)
	if err != nil {
		return nil, err
	}
	t := &toolRun{tool: tool, proxy: proxy, served: make([]time.Time, len(s.ports)), started: time.Now()}
	tmpl := filepath.Join(dir, "haproxy.cfg.tmpl")
	routes := ""
	if tool == toolCTReload {
		routes = peerRoutes
	}
	if err := os.WriteFile(tmpl, []byte(peerTemplate(routes)), 0o644); err != nil {
		proxy.stop()
		return nil, err
	}
	addrs, err := freeAddrs(3)
	if err != nil {
		proxy.stop()
		return nil, err
	}
	switch tool {
	case toolCT, toolCTCheck, toolCTReload:
		out := filepath.Join(dir, "out", "haproxy.cfg")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			proxy.stop()
			return nil, err
		}
		t.file = newRenderedFile(out, s.inFile(tool), s.loadedCheck())
		logf, err := os.Create(filepath.Join(filepath.Dir(out), "consul-template.log"))
		if err != nil {
			proxy.stop()
			return nil, err
		}
		defer logf.Close() // the child has its own
		env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "PEER_HTTP_BIND=" + addrs[0]}
		// Its defaults otherwise: the tool users would keep.
		spec := tmpl + ":" + out
		// A failing command stops consul-template, and the row with it.
		switch tool {
		case toolCTCheck:
			spec += ":" + s.o.haproxy + " -c -q -f " + out
		case toolCTReload:
			script, err := writeReloadScript(dir, s.o.haproxy, out)
			if err != nil {
				proxy.stop()
				return nil, err
			}
			spec += ":" + script
			t.http, t.daemons = addrs[0], dir
		}
		t.ct, err = startProc("consul-template", logf, env, s.o.consulTemplate,
			"-consul-addr="+proxy.addr, "-template="+spec, "-wait="+s.o.wait.String(), "-log-level=warn")
		if err != nil {
			proxy.stop()
			return nil, err
		}
	case toolTemplate, toolBuiltin:
		env := map[string]string{"SEAMLESS_WAIT": s.o.wait.String()}
		// The per-service watches' budget, where this seamless has one:
		// the whole catalog, and room for the fixed watches.
		if _, ok := s.defaults["SEAMLESS_CONSUL_WATCHES"]; ok {
			env["SEAMLESS_CONSUL_WATCHES"] = strconv.Itoa(s.l.services + 16)
		}
		if tool == toolTemplate {
			env["SEAMLESS_TEMPLATE"] = tmpl
			env["PEER_HTTP_BIND"] = addrs[0]
		}
		maps.Copy(env, s.o.env)
		consul := proxy.addr
		if s.o.direct {
			consul = s.consul
		}
		t.d, err = startDiscovery(discoveryOpts{seamless: s.o.seamless, haproxy: s.o.haproxy, consul: consul,
			dir: dir, addrs: addrs, env: env})
		if err != nil {
			proxy.stop()
			return nil, err
		}
		t.http = t.d.http
		t.file = newRenderedFile(filepath.Join(t.d.stateDir, "haproxy.cfg"), s.inFile(tool), s.loadedCheck())
		if err := os.MkdirAll(t.d.stateDir, 0o755); err != nil {
			t.d.stop()
			proxy.stop()
			return nil, err
		}
	default:
		proxy.stop()
		return nil, fmt.Errorf("unknown tool %q", tool.key)
	}
	wctx, cancel := context.WithCancel(ctx)
	t.stopWatch, t.watched = cancel, make(chan struct{})
	go func() {
		defer close(t.watched)
		if err := t.file.run(wctx); err != nil {
			t.watchErr = err
		}
	}()
	return t, nil
}

// waitLoaded waits until the tool's file holds the whole catalog (and
// seamless says it is ready).
func (t *toolRun) waitLoaded(ctx context.Context, timeout time.Duration) error {
	err := poll(ctx, 20*time.Millisecond, timeout, t.tool.title+" renders the whole catalog", func() (bool, error) {
		if err := t.alive(); err != nil {
			return false, err
		}
		select {
		case <-t.watched:
			return false, fmt.Errorf("watching %s: %v (%w)", t.file.path, t.watchErr, errExited)
		default:
		}
		ready, _, _, _ := t.file.state()
		return !ready.IsZero(), nil
	})
	if err == nil && t.d != nil {
		err = t.d.waitReady(ctx, timeout)
	}
	return t.withLog(err)
}

// probeServed sends requests through the tool's HAProxy with the
// changed service's host until one is answered by change k's listener
// (its name), then records when. Each request opens a new connection, as
// the other discovery benchmarks' probes do (pollUntil); HAProxy's round
// robin reaches the moved instance within `instances` requests once it
// serves there.
func (t *toolRun) probeServed(ctx context.Context, k int, host, want string, every time.Duration, deadline time.Time) {
	n := 0
	at, _, err := pollUntil(ctx, t.http, host, every, deadline, func(code int, body string) verdict {
		n++
		if code == http.StatusOK && body == want {
			return reflected
		}
		return pending
	})
	t.servedMu.Lock()
	defer t.servedMu.Unlock()
	t.probes += n
	if err == nil {
		t.served[k] = at
	}
}

func (t *toolRun) servedAt() []time.Time {
	t.servedMu.Lock()
	defer t.servedMu.Unlock()
	return slices.Clone(t.served)
}

// errNotSeen: a change never reached a tool's file in time.
var errNotSeen = errors.New("not every change reached the rendered file")

// writeReloadScript writes ctreload's command into dir: the classic
// reload, in which a new daemon binds beside the old one and -sf tells the
// old one to stop listening and finish its connections.
func writeReloadScript(dir, haproxy, cfg string) (string, error) {
	pidfile, log := filepath.Join(dir, "haproxy.pid"), filepath.Join(dir, "haproxy.log")
	script := "#!/bin/sh\n" +
		"old=$(cat " + shellQuote(pidfile) + " 2>/dev/null)\n" +
		"exec " + shellQuote(haproxy) + " -D -p " + shellQuote(pidfile) + " -f " + shellQuote(cfg) +
		" ${old:+-sf $old} </dev/null >>" + shellQuote(log) + " 2>&1\n"
	path := filepath.Join(dir, "reload.sh")
	return path, os.WriteFile(path, []byte(script), 0o755)
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
