// Command seamless runs HAProxy as PID 1 of a container: it reaps every
// child, turns SIGHUP into a validated, confirmed, lossless reload and
// SIGTERM into a graceful drain. See README.md.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/config"
	"github.com/seamless-lb/seamless/internal/gcheadroom"
	"github.com/seamless-lb/seamless/internal/gomaxprocs"
)

// Set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	collectorHeadroom()
	processors()
	os.Exit(run(context.Background(), os.Args, os.Stdout, os.Stderr))
}

// defaultGOGC is the collector's headroom when GOGC is not set: the heap
// grows to 1.3 times the live data instead of Go's 2 times. seamless
// keeps the catalog and its rendering live and makes little garbage per
// change, so the collector runs more often for less memory. Built-in
// template at 1000 services × 10 instances (make bench-peer, one run
// each): RSS after changes / peak 62–67 / 66–69 MiB at 50, 60 / 65 at
// 40, 57 / 59 at 30, CPU per change 51–54, 49 and 55 ms (within the
// runs' noise). GOGC and GOMEMLIMIT set in the environment are Go's, and
// win.
const defaultGOGC = 30

// minHeadroom is the headroom GOGC is raised towards (at most to 100)
// when GOGC is not set: on a small catalog (a live heap of 4 MB at 100 ×
// 10) 30 % collected after every megabyte, more than once per change.
// From about 14 MB of live heap on (1000 × 10 has 18) 30 % is more.
const minHeadroom = 4 << 20

// maxHeadroom is the headroom GOGC is lowered towards (down to
// leastGOGC) from about 80 MB of live heap on: a change allocates about
// 10 MB even at 10,000 services × 10 instances, whose live heap of about
// 150 MB took 45 MB more at 30 %. There (make bench-peer -sizes 10000x10
// -tools builtin -direct, one run each) GOGC=16 gave RSS after changes /
// peak 222 / 229 MiB against 248 / 252 at 30, for 148 ms of CPU per
// change against 124; this bound gave 230 / 230 at 124 ms, and 233 / 233
// at 138 in a later run.
const (
	maxHeadroom = 24 << 20
	leastGOGC   = 15
)

func collectorHeadroom() {
	if os.Getenv("GOGC") == "" {
		gcheadroom.Start(gcheadroom.Headroom{Percent: defaultGOGC, Floor: minHeadroom,
			Ceiling: maxHeadroom, LeastPercent: leastGOGC})
	}
}

// Without GOMAXPROCS, Go code runs on one processor until the live heap
// reaches manyProcsFrom, and on Go's default (the CPUs, or the
// container's CPU limit) from then until it falls below oneProcBelow.
// HAProxy, beside seamless in the container, is what needs the CPUs. On
// two CPUs (make bench-peer, one run each, CPU ms per change): at 100
// services × 10 instances (live heap about 4 MB) a template took 10.8
// on one processor against 13.1 and 13.2 on two (consul-template
// 10.2–10.6 in the same runs); at 1000 × 10 (18 MB) 41.5 against 44.2
// with a template and 18.8 against 19.0 built-in. At 10,000 × 10 (150
// MB, -tools builtin -direct) one processor was slower: whole catalog
// served 13.3 and 14.4 s after start against 12.4 and 11.5, change →
// served p99 636 and 683 ms against 554 and 564.
const (
	manyProcsFrom = 32 << 20
	oneProcBelow  = 24 << 20
)

func processors() {
	if os.Getenv("GOMAXPROCS") == "" {
		gomaxprocs.Start(gomaxprocs.Bounds{Up: manyProcsFrom, Down: oneProcBelow})
	}
}

const usage = `Usage:
  seamless                       run HAProxy with $SEAMLESS_CONFIG
  seamless haproxy ARGS...       run HAProxy with these arguments (-W, -db, -S are added)
  seamless -f FILE ARGS...       the same: arguments starting with '-' are HAProxy's
  seamless check [ARGS...]       validate the configuration (haproxy -c) and exit; with
                                 discovery, render it from the sources first
  seamless render                print the configuration discovery would apply now
  seamless health                ask a running seamless's /healthz (exit 0 if healthy)
  seamless env                   list every environment variable with its default
  seamless version               print versions of seamless, Go and HAProxy

Discovery: set SEAMLESS_SOURCES (consul, docker, file) and optionally SEAMLESS_TEMPLATE;
HAProxy then runs the configuration rendered from them (see 'seamless env').

Signals: HUP/USR2 reload (validated, serialised, confirmed; with discovery the
template is read again first); TERM/INT drain, then stop; others are forwarded
to the HAProxy master.

Exit codes: HAProxy's own (128+signal if a signal killed it); 0 after a drain,
or after a stop signal before HAProxy started (during the discovery wait); 2 for a bad
command line or environment; 'check': 0 valid, 1 invalid, 3 HAProxy could
not be run; 'render': 0 complete, 1 template error or data still missing
after SEAMLESS_DISCOVERY_TIMEOUT; 'health': 0 healthy, 1 not.
`

// Exit codes of seamless itself.
const (
	exitInvalid = 1
	exitUsage   = 2
	exitNoRun   = 3
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd, rest := command(args[1:])
	switch cmd {
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "env":
		if err := config.Usage(stdout); err != nil {
			return exitUsage
		}
		return 0
	case "":
		fmt.Fprintf(stderr, "seamless: unknown command %q\n\n%s", args[1], usage)
		return exitUsage
	}

	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(stderr, "seamless: configuration error (see 'seamless env'):\n%v\n", err)
		return exitUsage
	}
	log := newLogger(cfg, stderr)
	for _, k := range config.Unknown(os.Environ()) {
		log.Warn("unknown variable ignored; see 'seamless env'", "variable", k)
	}
	bin, hargs := haproxyArgs(cfg, rest)
	switch cmd {
	case "version":
		return printVersion(ctx, bin, stdout)
	case "check":
		return check(ctx, cfg, bin, hargs, stdout, stderr, log)
	case "health":
		return health(ctx, cfg, stdout, stderr)
	case "render":
		return render(ctx, cfg, bin, hargs, false, stdout, stderr, log)
	default:
		return serve(ctx, cfg, bin, hargs, log)
	}
}

// command picks the subcommand; "run" takes HAProxy's arguments.
func command(args []string) (string, []string) {
	if len(args) == 0 {
		return "run", nil
	}
	switch a := args[0]; {
	case a == "-h" || a == "--help" || a == "help":
		return "help", nil
	case a == "--version" || a == "version":
		return "version", nil
	case a == "env" || a == "check" || a == "health" || a == "render":
		return a, args[1:]
	case filepath.Base(a) == "haproxy" || strings.HasPrefix(a, "-"):
		return "run", args
	}
	return "", nil
}

// haproxyArgs splits "haproxy ARGS" (or "/path/to/haproxy ARGS", or bare
// "-f ...") into the executable and its arguments; no arguments means the
// configured file.
func haproxyArgs(cfg *config.Config, args []string) (string, []string) {
	bin := cfg.HAProxyBin
	if len(args) > 0 && filepath.Base(args[0]) == "haproxy" {
		if args[0] != "haproxy" {
			bin = args[0]
		}
		args = args[1:]
	}
	if len(args) == 0 {
		args = []string{"-f", cfg.Config}
	}
	return bin, args
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func versionLine() string {
	return fmt.Sprintf("seamless %s (commit %s, %s, %s/%s)", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
