package haproxy

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"time"
)

// Directives records which of the settings seamless cares about a
// configuration already has. It is a line scanner, not a parser: enough to
// decide whether to add a default or print a warning.
type Directives struct {
	HardStopAfter     bool
	MworkerMaxReloads bool
	IdleCloseOnResp   bool
}

// ScanConfig reads the -f arguments (files, or directories of *.cfg files
// loaded in lexical order as HAProxy does).
func ScanConfig(paths []string) (Directives, error) {
	var d Directives
	files, err := ExpandConfigFiles(paths)
	if err != nil {
		return d, err // never open a FIFO: it blocks until a writer comes
	}
	for _, f := range files.Files {
		if err := d.scanFile(f); err != nil {
			return d, err
		}
	}
	return d, nil
}

func (d *Directives) scanFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		w := strings.Fields(line)
		if len(w) == 0 {
			continue
		}
		switch {
		case w[0] == "hard-stop-after":
			d.HardStopAfter = true
		case w[0] == "mworker-max-reloads":
			d.MworkerMaxReloads = true
		case len(w) >= 2 && w[0] == "option" && w[1] == "idle-close-on-response":
			d.IdleCloseOnResp = true
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Defaults are the global settings seamless adds when the user's
// configuration has none, so that old workers cannot pile up.
type Defaults struct {
	HardStopAfter time.Duration // 0: leave unset
	MaxReloads    int           // 0: leave unset
	// WorkerSocket is the path of a stats socket of the worker's own,
	// which Runtime prefers to the master CLI (see Runtime.Worker); "":
	// none, as for a path HAProxy's syntax or a socket could not take.
	WorkerSocket string
}

// MaxSocketPath is the longest path HAProxy listens on: a Unix address
// holds 107 bytes, and HAProxy binds "<path>.<pid>.tmp" first, then
// renames it, so it refuses a listening socket's path past 97 (2.6 to
// 3.2) and with it the whole configuration.
const MaxSocketPath = 97

// SocketPathFits reports whether path can be written in a configuration
// unquoted and bound as a Unix socket.
func SocketPathFits(path string) bool {
	return path != "" && len(path) <= MaxSocketPath && !strings.ContainsAny(path, " \t\n#\"'\\$")
}

// File renders a config file with the defaults the user did not set, or ""
// when there is nothing to add. It is loaded before the user's files so that
// the user's own values would win anyway.
func (def Defaults) File(have Directives) string {
	var b strings.Builder
	if def.HardStopAfter > 0 && !have.HardStopAfter {
		fmt.Fprintf(&b, "    hard-stop-after %dms\n", def.HardStopAfter.Milliseconds())
	}
	if def.MaxReloads > 0 && !have.MworkerMaxReloads {
		fmt.Fprintf(&b, "    mworker-max-reloads %d\n", def.MaxReloads)
	}
	if p := def.WorkerSocket; SocketPathFits(p) {
		fmt.Fprintf(&b, "    stats socket %s mode 600 level admin\n", p)
	}
	if b.Len() == 0 {
		return ""
	}
	return "# Written by seamless: defaults for settings the configuration leaves out.\nglobal\n" + b.String()
}
