// Package haproxy knows how to talk to HAProxy: its command line, its master
// CLI (reload and show proc, version by version), `haproxy -c`, and its log
// lines. It holds no global state; everything takes a context.
package haproxy

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Flags of HAProxy's command line that take values. "-sf" and "-st" take
// every following non-flag word.
var valueFlags = map[string]bool{
	"-f": true, "-L": true, "-C": true, "-p": true, "-S": true, "-N": true,
	"-m": true, "-n": true, "-x": true,
}

// CommandLine is the user's HAProxy command line, split into what seamless
// keeps and what it manages itself.
type CommandLine struct {
	// Args are the user's arguments less the ones seamless owns (-W, -Ws,
	// -db, -D, -S, -sf, -st, -x).
	Args []string
	// MasterSocket is the master CLI address: the user's -S when given.
	MasterSocket string
	// ConfigFiles are the -f arguments, resolved against -C.
	ConfigFiles []string
	// Dropped lists arguments removed because they would defeat
	// supervision (daemon mode, old pids); the caller logs them.
	Dropped []string
}

// ParseCommandLine splits args (without the program name). defaultSocket is
// used for the master CLI when args carry no -S.
func ParseCommandLine(args []string, defaultSocket string) (*CommandLine, error) {
	cl := &CommandLine{}
	var chdir string
	var files []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			// Every following word is a configuration file.
			files = append(files, args[i+1:]...)
			cl.Args = append(cl.Args, args[i:]...)
			break
		}
		switch a {
		case "-W", "-Ws", "-db":
			continue // always added
		case "-D":
			cl.Dropped = append(cl.Dropped, a)
			continue
		case "-sf", "-st":
			j := i + 1
			for j < len(args) && !strings.HasPrefix(args[j], "-") {
				j++
			}
			cl.Dropped = append(cl.Dropped, args[i:j]...)
			i = j - 1
			continue
		}
		if !valueFlags[a] {
			cl.Args = append(cl.Args, a)
			continue
		}
		if i+1 >= len(args) {
			return nil, fmt.Errorf("haproxy argument %s needs a value", a)
		}
		v := args[i+1]
		i++
		switch a {
		case "-S":
			cl.MasterSocket = v
			continue
		case "-x":
			cl.Dropped = append(cl.Dropped, a, v) // the master passes sockets itself
			continue
		case "-f":
			files = append(files, v)
		case "-C":
			chdir = v
		}
		cl.Args = append(cl.Args, a, v)
	}
	if cl.MasterSocket == "" {
		cl.MasterSocket = defaultSocket + ",mode,600"
	}
	for _, f := range files {
		if chdir != "" && !filepath.IsAbs(f) {
			f = filepath.Join(chdir, f)
		}
		cl.ConfigFiles = append(cl.ConfigFiles, f)
	}
	return cl, nil
}

// RunArgs is the master's command line: master-worker, foreground, the
// master CLI, then extra (seamless's own config files) and the user's args.
func (cl *CommandLine) RunArgs(extra ...string) []string {
	out := []string{"-W", "-db", "-S", cl.MasterSocket}
	out = append(out, extra...)
	return append(out, cl.Args...)
}

// CheckArgs is the `haproxy -c` command line for the same configuration,
// in master-worker mode as the master loads it: without -W, HAProxy
// refuses sections only a master can run (program).
func (cl *CommandLine) CheckArgs(extra ...string) []string {
	out := []string{"-c", "-W"}
	out = append(out, extra...)
	return append(out, cl.Args...)
}

// MasterAddr turns the -S argument into a dialable network and address:
// "/path,mode,600" and "unix@/path" are unix sockets, "ipv4@h:p" and "h:p"
// are TCP.
func MasterAddr(s string) (network, addr string) {
	s, _, _ = strings.Cut(s, ",")
	switch {
	case strings.HasPrefix(s, "unix@"):
		return "unix", strings.TrimPrefix(s, "unix@")
	case strings.HasPrefix(s, "ipv4@"):
		return "tcp4", strings.TrimPrefix(s, "ipv4@")
	case strings.HasPrefix(s, "ipv6@"):
		return "tcp6", strings.TrimPrefix(s, "ipv6@")
	case strings.HasPrefix(s, "/"), strings.HasPrefix(s, "."):
		return "unix", s
	default:
		return "tcp", s
	}
}

// WithConfig returns the command line with its configuration files
// replaced by path: in discovery mode HAProxy runs the rendered file.
func (cl *CommandLine) WithConfig(path string) *CommandLine {
	out := *cl
	out.Args = nil
	for i := 0; i < len(cl.Args); i++ {
		switch a := cl.Args[i]; {
		case a == "--":
			i = len(cl.Args)
		case a == "-f" && i+1 < len(cl.Args):
			i++
		default:
			out.Args = append(out.Args, a)
		}
	}
	out.Args = append(out.Args, "-f", path)
	out.ConfigFiles = []string{path}
	return &out
}
