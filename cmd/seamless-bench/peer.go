package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/internal/consulproc"
)

// `seamless-bench peer`: seamless side by side with consul-template
// v0.41.1, the tool users would keep instead. For each catalog size a
// fresh Consul server gets services × instances registered (as `scale`
// does), and each tool in turn (or, with -together, all at once) runs
// against it through a counting reverse proxy of its own (proxy.go):
//
//	consul-template     the classic template (peerTemplate) to a file,
//	                    -wait, no command (ctcheck: haproxy -c as its
//	                    command; ctreload: routes by Host, and the classic
//	                    reload, haproxy -D -sf, as its command)
//	seamless, template  the same template (SEAMLESS_TEMPLATE), HAProxy 2.6,
//	                    SEAMLESS_WAIT=-wait
//	seamless, built-in  the built-in template, SEAMLESS_WAIT=-wait
//
// (-wait is 0 unless set: each change at once.)
// Then -changes single-instance changes, -interval apart on a fixed
// schedule (not waiting for the tools): instance j of service i moves to a
// new port, where a listener of its own answers; the sequence of (i, j) is
// drawn from -seed without repeats, the same for every tool. Measured per
// tool: from the Consul write returning to the new address in the rendered
// file (and, for the built-in and ctreload, to a request through HAProxy answered by
// the new listener), Consul requests and bytes per change through its
// proxy, the tool's CPU and the Consul agent's per change, RSS and peak.

type peerOptions struct {
	keep                                      bool
	seamless, haproxy, consul, consulTemplate string
	sizes                                     []peerSize
	nodes                                     int
	changes                                   int
	change                                    changeKind
	interval                                  time.Duration
	wait                                      config.Wait // every tool's quiescence; zero: each change at once
	seed                                      uint64
	together                                  bool
	tools                                     []peerTool
	env                                       envFlag
	direct                                    bool // seamless reads the agent itself, not through its proxy
	every                                     time.Duration
	changeTimeout, timeout                    time.Duration
	nofile                                    uint64
	nofileInForce                             uint64 // what raiseNofile achieved
}

// changeKind is what each change of a peer run does to its instance.
type changeKind int

const (
	changeMove   changeKind = iota // re-registered at a new port
	changeAdd                      // a new instance of its service, at a new port
	changeRemove                   // deregistered, with its check
)

var changeKinds = map[string]changeKind{"move": changeMove, "add": changeAdd, "remove": changeRemove}

// probes reports whether the run probes tool's changes through its
// HAProxy: a new address answers there, a removed one may still (a
// drained server finishes what it has).
func (o peerOptions) probes(tool peerTool) bool { return tool.serves() && o.change != changeRemove }

type peerSize struct{ services, instances int }

func (s peerSize) String() string { return fmt.Sprintf("%dx%d", s.services, s.instances) }

// peerResult is one row: a tool at a catalog size.
type peerResult struct {
	size                 peerSize
	tool                 peerTool
	together             bool
	register             time.Duration // the catalog written to Consul
	ready                time.Duration // the tool started → the whole catalog in its file
	readyServed          time.Duration // built-in, ctreload: the tool started → its first and last service served
	settled              time.Duration // the tool started → the Consul agent settled, and the changes began
	unsettled            bool          // the agent did not settle within settleTimeout: the changes began anyway
	asked                int
	rendered             []time.Duration // by change seen: write → in the file
	served               []time.Duration // built-in, ctreload: write → served
	traffic              proxyCounts     // through its proxy, over the changes
	cpu                  time.Duration   // the tool's, over the changes
	haproxy              time.Duration   // seamless: HAProxy's (master, workers), over the changes
	agent                time.Duration   // the Consul agent's, over the changes
	agentTools           int             // tools sharing that agent
	window               time.Duration   // first write → last reading
	rssLoaded, rss, peak int64
	peakLoaded           int64  // VmHWM when loaded: the start's
	reads                int    // reads of the rendered file
	probes               int    // built-in, ctreload: requests sent to see changes served
	applies              string // seamless: seamless_config_applies_total by result, over the changes
	maxConns             int    // the agent's http_max_conns_per_client
	logs                 string
	err                  error
}

func runPeer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parsePeerFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "seamless-bench peer: %v\n", err)
		return 2
	}
	return inBenchDir(ctx, o.timeout, o.keep, stderr, func(ctx context.Context, log *slog.Logger, root string) int {
		// consul-template holds a connection per service, and its proxy
		// one more to Consul for each, all in this process.
		need := uint64(1000)
		for _, s := range o.sizes {
			need = max(need, uint64(len(o.tools)*2*(s.services+16)+1000))
		}
		limit, err := raiseNofile(o.nofile)
		if err != nil && limit < need {
			log.Warn("cannot raise the file descriptor limit; the largest catalog may run out", "limit", limit, "want", o.nofile, "err", err)
		}
		o.nofileInForce = limit
		var defaults map[string]string
		if slices.Contains(o.tools, toolTemplate) || slices.Contains(o.tools, toolBuiltin) {
			if defaults, err = seamlessDefaults(ctx, o.seamless); err != nil {
				fmt.Fprintf(stderr, "seamless-bench: %v\n", err)
				return 1
			}
		}
		var results []peerResult
		for _, size := range o.sizes {
			groups := [][]peerTool{o.tools}
			if !o.together {
				groups = nil
				for _, t := range o.tools {
					groups = append(groups, []peerTool{t})
				}
			}
			for _, tools := range groups {
				if ctx.Err() != nil {
					break
				}
				dir := filepath.Join(root, fmt.Sprintf("r%d", len(results)+1))
				names := make([]string, len(tools))
				for i, t := range tools {
					names[i] = t.key
				}
				rlog := log.With("run", filepath.Base(dir), "catalog", size.String(), "tools", strings.Join(names, ","))
				rs := peerRow(ctx, rlog, o, dir, defaults, size, tools)
				for _, r := range rs {
					if r.err != nil {
						rlog.Error("run failed", "tool", r.tool.key, "err", r.err)
					}
				}
				results = append(results, rs...)
			}
		}
		printPeerTable(stdout, o, results)
		if ctx.Err() != nil || slices.ContainsFunc(results, func(r peerResult) bool { return r.err != nil }) {
			return 1
		}
		return 0
	})
}

func parsePeerFlags(args []string, stderr io.Writer) (peerOptions, error) {
	fs := flag.NewFlagSet("seamless-bench peer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o peerOptions
	var sizes, tools string
	var nofile int
	fs.StringVar(&o.seamless, "seamless", "", "path to the seamless binary (required for the seamless tools)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "HAProxy binary")
	fs.StringVar(&o.consul, "consul", consulproc.DefaultBin(), "Consul agent binary")
	fs.StringVar(&o.consulTemplate, "consul-template", defaultConsulTemplate(), "consul-template binary ($SEAMLESS_CONSUL_TEMPLATE_BIN)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (logs, rendered files) also after a successful run")
	fs.StringVar(&sizes, "sizes", "100x10,1000x10", "catalogs, SERVICESxINSTANCES, comma-separated (a fresh Consul per row)")
	fs.IntVar(&o.nodes, "nodes", 100, "Consul nodes the instances are spread over")
	fs.IntVar(&o.changes, "changes", 40, "single-instance changes per row")
	fs.Func("change", "what each change does: `move` an instance to a new port (default), add a new instance of the service at one, or remove an instance", func(v string) error {
		k, ok := changeKinds[v]
		if !ok {
			return fmt.Errorf("%q: want move, add or remove", v)
		}
		o.change = k
		return nil
	})
	fs.DurationVar(&o.interval, "interval", 1500*time.Millisecond, "time between changes (a fixed schedule)")
	fs.Func("wait", "`min:max` quiescence of every tool, consul-template's -wait and seamless's SEAMLESS_WAIT (default 0: each change at once)", o.wait.Decode)
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the sequence of changed instances")
	fs.BoolVar(&o.together, "together", false, "run the tools at once on one Consul (default: each alone)")
	fs.StringVar(&tools, "tools", "ct,ctcheck,ctreload,template,builtin", "tools: ct (consul-template), ctcheck (consul-template running haproxy -c as its command), "+
		"ctreload (consul-template running haproxy -D -sf as its command, its changes probed through that HAProxy), template (seamless with it), builtin (seamless's built-in template)")
	fs.Var(&o.env, "env", "a further SEAMLESS_* variable, or GOGC, GOMEMLIMIT or GOMAXPROCS, for seamless alone, `NAME=VALUE` (repeatable)")
	fs.BoolVar(&o.direct, "direct", false, "seamless talks to the Consul agent directly, not through the counting proxy: "+
		"its Consul traffic is not measured, and the proxy's two descriptors per held query are saved "+
		"(10,000 per-service watches need 20,000 in the benchmark's process)")
	fs.DurationVar(&o.every, "poll", time.Millisecond, "interval of the requests through HAProxy that look for a change served (built-in, ctreload)")
	fs.DurationVar(&o.changeTimeout, "change-timeout", 60*time.Second, "after the last change, how long the tools may take to show every change")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Minute, "time limit for the whole benchmark")
	fs.IntVar(&nofile, "nofile", 65536, "file descriptor limit for the benchmark and what it starts (raised if allowed)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for s := range strings.SplitSeq(sizes, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(s), "x")
		n, err1 := strconv.Atoi(a)
		m, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || n > 100_000 || m < 1 || m > 100 {
			return o, fmt.Errorf("-sizes: %q is not SERVICESxINSTANCES (1-100000 x 1-100)", s)
		}
		o.sizes = append(o.sizes, peerSize{n, m})
	}
	for k := range strings.SplitSeq(tools, ",") {
		i := slices.IndexFunc(peerTools, func(t peerTool) bool { return t.key == strings.TrimSpace(k) })
		if i < 0 {
			return o, fmt.Errorf("-tools: unknown tool %q (want ct, ctcheck, ctreload, template or builtin)", k)
		}
		if !slices.Contains(o.tools, peerTools[i]) {
			o.tools = append(o.tools, peerTools[i])
		}
	}
	o.nofile = uint64(max(nofile, 0))
	switch {
	case o.nodes < 1 || o.nodes > 10_000:
		return o, errors.New("-nodes must be 1 to 10000")
	case o.changes < 1:
		return o, errors.New("-changes must be >= 1")
	case o.interval <= 0 || o.every <= 0 || o.changeTimeout <= 0 || o.timeout <= 0:
		return o, errors.New("-interval, -poll, -change-timeout and -timeout must be > 0")
	}
	if _, ok := o.env["SEAMLESS_WAIT"]; ok {
		return o, errors.New("-env SEAMLESS_WAIT: use -wait, which sets consul-template's wait too")
	}
	for _, s := range o.sizes {
		if o.changes > s.services*s.instances {
			return o, fmt.Errorf("-changes %d: catalog %s has only %d instances to change once each", o.changes, s, s.services*s.instances)
		}
	}
	var err error
	if o.haproxy, err = exec.LookPath(o.haproxy); err != nil {
		return o, fmt.Errorf("-haproxy: %w", err)
	}
	if slices.Contains(o.tools, toolTemplate) || slices.Contains(o.tools, toolBuiltin) {
		if o.seamless, err = absBinary("-seamless", o.seamless); err != nil {
			return o, err
		}
	}
	if slices.ContainsFunc(o.tools, peerTool.consulTemplate) {
		if o.consulTemplate == "" {
			return o, errors.New("-consul-template PATH is required (make consul-template builds it)")
		}
		if o.consulTemplate, err = absBinary("-consul-template", o.consulTemplate); err != nil {
			return o, err
		}
	}
	return o, nil
}

// defaultConsulTemplate is $SEAMLESS_CONSUL_TEMPLATE_BIN, else what
// `make consul-template` builds.
func defaultConsulTemplate() string {
	if bin := os.Getenv("SEAMLESS_CONSUL_TEMPLATE_BIN"); bin != "" {
		return bin
	}
	return "/var/cache/seamless/consul-template/consul-template-0.41.1"
}

// raiseNofile sets the file descriptor limit to n when it is lower, and
// returns the limit in force. The children inherit it (HAProxy sizes
// itself by it).
func raiseNofile(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= n {
		return lim.Cur, nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return lim.Cur, err
	}
	return n, nil
}
