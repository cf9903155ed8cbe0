package haproxy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/seamless-lb/seamless/entrypoint/reaper"
)

// Runner runs a command to completion; reaper.Reaper.Output is the one used
// in the process, since nothing else may wait for children.
type Runner func(ctx context.Context, argv []string, env []string) ([]byte, reaper.Status, error)

// controlVars are the variables HAProxy sets for itself across re-executions
// of the master. Inherited by `haproxy -c` they would make it believe it is
// a re-executed master (client-native learnt this the hard way). Names are
// matched whole: a user's HAPROXY_CLIENT_TIMEOUT must survive.
var controlVars = map[string]bool{
	"HAPROXY_MWORKER": true, "HAPROXY_MWORKER_REEXEC": true, "HAPROXY_MWORKER_WAIT_ONLY": true,
	"HAPROXY_MWORKER_LISTENERS": true, "HAPROXY_STARTUPLOGS_FD": true, "HAPROXY_PROCESSES": true,
	"HAPROXY_CLI": true, "HAPROXY_MASTER_CLI": true, "HAPROXY_LOCALPEER": true, "HAPROXY_CFGFILES": true,
	"HAPROXY_SOCKETS": true, "HAPROXY_STARTUP_VERSION": true, "HAPROXY_BRANCH": true,
}

// CleanEnv returns env without HAProxy's own control variables.
func CleanEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !controlVars[k] {
			out = append(out, kv)
		}
	}
	return out
}

// ConfigError is a configuration that `haproxy -c` refused.
type ConfigError struct {
	// Alerts are HAProxy's [ALERT] lines; they name file and line.
	Alerts []string
	Output string
	Code   int
	// Err is the cause of a refusal by seamless itself, such as a
	// *BindError: a taken port is a refusal that may pass later.
	Err error
}

func (e *ConfigError) Unwrap() error { return e.Err }

func (e *ConfigError) Error() string {
	if len(e.Alerts) == 0 {
		return fmt.Sprintf("haproxy -c exited with code %d: %s", e.Code, strings.TrimSpace(e.Output))
	}
	return "invalid configuration: " + strings.Join(e.Alerts, "; ")
}

// Validator runs `haproxy -c` on a command line.
type Validator struct {
	Bin  string
	Args []string // from CommandLine.CheckArgs
	Env  []string
	Run  Runner
	// Files are the user's -f paths (CommandLine.ConfigFiles), when known:
	// paths that load no file at all are refused, naming them, since
	// HAProxy would run seamless's own files alone.
	Files []string
	// Binds, when set, probes the addresses a valid configuration adds
	// (see GuardBinds).
	Binds *BindGuard
	// PassTo, when set, records the bytes of every configuration that
	// passes; PassFrom, when set, lets the next Check of exactly those
	// bytes pass without running haproxy -c again, once. The applier's
	// candidate check passes to the reloader's check of the file the
	// candidate was renamed to (the bind guard keeps what the candidate's
	// check found); any other Check runs in full.
	PassTo, PassFrom *Passed
}

// Passed carries one passed configuration from a Validator to another.
type Passed struct {
	mu  sync.Mutex
	sum [sha256.Size]byte
	set bool
}

func (p *Passed) put(sum [sha256.Size]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sum, p.set = sum, true
}

// take reports whether sum is the pass recorded, and forgets it.
func (p *Passed) take(sum [sha256.Size]byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ok := p.set && p.sum == sum
	p.set = false
	return ok
}

// digest hashes the contents of files in order (their names aside: a
// candidate and the file it is renamed to load the same), as sumContents
// hashes them in memory. It streams them: the rendered file is megabytes
// at thousands of services, and reading it whole to hash it was that much
// garbage per reload.
func digest(files []string) ([sha256.Size]byte, error) {
	h := sha256.New()
	bp := digestBufs.Get().(*[]byte)
	defer digestBufs.Put(bp)
	buf := *bp
	for _, f := range files {
		n, err := hashFile(h, f, buf)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		endContent(h, n)
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}

// digestBufs keep digest's buffer between reloads: a new one was among
// the largest allocations of a reload at a hundred services.
var digestBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// hashFile writes path's content to h through buf and returns its length.
func hashFile(h io.Writer, path string, buf []byte) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// Hidden behind a plain Reader, the file does not copy itself through
	// a buffer of its own (File.WriteTo).
	return io.CopyBuffer(h, struct{ io.Reader }{f}, buf)
}

// readFiles reads files in order, except path (when not ""), whose
// content is data; path must be one of them.
func readFiles(files []string, path string, data []byte) ([][]byte, error) {
	contents := make([][]byte, len(files))
	given := path == ""
	for i, f := range files {
		if f == path && path != "" {
			contents[i], given = data, true
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		contents[i] = b
	}
	if !given {
		return nil, fmt.Errorf("%s is not among the files HAProxy loads (%s)", path, strings.Join(files, ", "))
	}
	return contents, nil
}

// endContent ends a content of n bytes in a digest: its length after it,
// where a reader from the end finds it.
func endContent(h io.Writer, n int64) { fmt.Fprintf(h, "\n%d\n", n) }

// sumContents is digest's hash of files whose contents are given: each
// content, then its length (after it, so that a file can be streamed).
func sumContents(contents [][]byte) [sha256.Size]byte {
	h := sha256.New()
	for _, b := range contents {
		h.Write(b)
		endContent(h, int64(len(b)))
	}
	return [sha256.Size]byte(h.Sum(nil))
}

// GuardBinds makes Check also refuse a configuration whose new listening
// addresses cannot be bound; the files v checks now are taken as what
// HAProxy runs. Call it before HAProxy starts.
func (v *Validator) GuardBinds() {
	v.Binds = NewBindGuard(v.configFiles(), CleanEnv(v.Env))
}

// Loaded tells v that HAProxy took the configuration it last passed;
// certain is false when the reload was sent but not confirmed.
func (v *Validator) Loaded(certain bool) {
	if v.Binds != nil {
		v.Binds.Loaded(certain)
	}
}

func (v *Validator) configFiles() []string {
	cl, err := ParseCommandLine(v.Args, "")
	if err != nil {
		return nil
	}
	return cl.ConfigFiles
}

// Check returns nil for a valid configuration (warnings allowed), a
// *ConfigError for an invalid one, or another error when haproxy could not
// be run at all.
//
// Files that are not regular files are refused before HAProxy runs: a FIFO
// would hold validation (and every reload queued behind it) until the
// reload timeout.
func (v *Validator) Check(ctx context.Context) error {
	var nr *NotRegularError
	loaded, err := ExpandConfigFiles(v.configFiles())
	if errors.As(err, &nr) {
		return refusal(nr.Error())
	}
	var sum [sha256.Size]byte
	summed := false
	if v.PassTo != nil || v.PassFrom != nil {
		sum, err = digest(loaded.Files)
		summed = err == nil
	}
	if v.PassFrom != nil && summed && v.PassFrom.take(sum) {
		return nil
	}
	files, err := ExpandConfigFiles(v.Files)
	if err == nil && len(v.Files) > 0 && len(files.Files) == 0 {
		notes := make([]string, len(files.EmptyDirs))
		for i, d := range files.EmptyDirs {
			notes[i] = emptyDirNote(d)
		}
		return refusal(strings.Join(notes, "; "))
	}
	out, st, err := v.Run(ctx, append([]string{v.Bin}, v.Args...), CleanEnv(v.Env))
	if err != nil {
		return fmt.Errorf("haproxy -c: %w", err)
	}
	if st.ExitCode() == 0 {
		if v.Binds != nil {
			if err := v.Binds.Check(v.configFiles()); err != nil {
				ce := refusal(err.Error())
				ce.Err = err
				return ce
			}
		}
		if v.PassTo != nil && summed {
			v.PassTo.put(sum)
		}
		return nil
	}
	return &ConfigError{Alerts: Alerts(string(out)), Output: string(out), Code: st.ExitCode()}
}

// Vouch records as passed (PassTo), without running haproxy -c, the
// files v would check with data as the content of path, one of them: the
// next Check of exactly those bytes through PassFrom passes. The applier
// vouches for a candidate that differs from what runs only in moved
// servers, which needs no check, and hands over the bytes it wrote, so
// that path is not read back; the other files (seamless's defaults and
// check speed-up) are read once for both the digest and the binds. Each
// read was a syscall-heavy share of a change's cost, and at 10,000
// services the file is tens of megabytes. A path that is not one of the
// files is an error, and nothing is vouched for.
func (v *Validator) Vouch(path string, data []byte) error {
	if v.Binds == nil && v.PassTo == nil {
		return nil
	}
	loaded, err := ExpandConfigFiles(v.configFiles())
	var contents [][]byte
	if err == nil {
		contents, err = readFiles(loaded.Files, path, data)
	}
	if v.Binds != nil {
		v.Binds.Vouch(loaded.Files, contents)
	}
	if err != nil || v.PassTo == nil {
		return err
	}
	v.PassTo.put(sumContents(contents))
	return nil
}

// refusal is a configuration seamless refuses before HAProxy reads it.
func refusal(reason string) *ConfigError {
	return &ConfigError{Alerts: []string{reason}, Output: reason + "\n"}
}

// Alerts picks HAProxy's [ALERT] lines out of its output, without the
// "(pid) :" decoration.
func Alerts(out string) []string {
	var alerts []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "[ALERT]") {
			continue
		}
		l = strings.TrimSpace(l[strings.Index(l, "[ALERT]")+len("[ALERT]"):])
		if i := strings.Index(l, ") : "); strings.HasPrefix(l, "(") && i > 0 {
			l = l[i+len(") : "):]
		}
		alerts = append(alerts, l)
	}
	return alerts
}

// Version runs `haproxy -v` and returns the version, e.g. "2.6.12-1+deb12u4".
func Version(ctx context.Context, run Runner, bin string) (string, error) {
	out, st, err := run(ctx, []string{bin, "-v"}, CleanEnv(nil))
	if err != nil {
		return "", err
	}
	if st.ExitCode() != 0 {
		return "", fmt.Errorf("%s -v: %s", bin, st)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(first)
	for i, w := range f {
		if strings.EqualFold(w, "version") && i+1 < len(f) {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("%s -v: unexpected output %q", bin, first)
}

// CheckSpeedup is loaded by `haproxy -c` only, before the user's files. At
// start-up HAProxy's internal HTTP client loads the system CA bundle, which
// costs about 40 ms per run on a small machine; a reload pays it anyway, so
// paying it again for every validation would almost double reload latency.
// The running HAProxy never sees this file, and a user's own
// httpclient.ssl.verify still wins because it is read later.
const CheckSpeedup = "# Written by seamless: loaded by 'haproxy -c' only, never by the running HAProxy.\nglobal\n    httpclient.ssl.verify none\n"

// speedupProbe gives the probe of CheckSpeedup a listener, without which
// haproxy -c exits 2.
const speedupProbe = "# Written by seamless: probes that haproxy -c accepts check-speedup.cfg.\nfrontend probe\n    mode tcp\n    timeout client 1s\n    bind 127.0.0.1:1\n"

// WithSpeedup returns a copy of v that loads the speed-up file (written at
// path) before the user's files, if this HAProxy accepts it; otherwise v
// itself. base are the arguments that come before the user's (the
// defaults file). Only the keyword is probed, on a one-line listener
// beside path: checking the user's configuration here would parse it once
// more at every start, seconds for 10,000 backends, and the first reload's
// check parses it anyway.
func WithSpeedup(ctx context.Context, v *Validator, cl *CommandLine, base []string, path string) (*Validator, error) {
	if err := os.WriteFile(path, []byte(CheckSpeedup), 0o640); err != nil {
		return v, err
	}
	probe := strings.TrimSuffix(path, ".cfg") + "-probe.cfg"
	if err := os.WriteFile(probe, []byte(speedupProbe), 0o640); err != nil {
		return v, err
	}
	defer os.Remove(probe)
	p := &Validator{Bin: v.Bin, Env: v.Env, Run: v.Run,
		Args: (&CommandLine{}).CheckArgs(append(slices.Clone(base), "-f", path, "-f", probe)...)}
	if err := p.Check(ctx); err != nil {
		return v, fmt.Errorf("this HAProxy refuses %q: %w", strings.TrimSpace(CheckSpeedup), err)
	}
	fast := *v
	fast.Args = cl.CheckArgs(append(slices.Clone(base), "-f", path)...)
	return &fast, nil
}
