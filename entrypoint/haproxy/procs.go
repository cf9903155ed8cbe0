package haproxy

import (
	"fmt"
	"strconv"
	"strings"
)

// Proc is one line of the master CLI's `show proc`.
type Proc struct {
	Pid     int
	Type    string // master, worker, or a program's name
	Reloads int
	// Failed is the master's failed-reload counter ("[failed: N]"), -1 when
	// this HAProxy does not print it.
	Failed  int
	Version string
}

// Procs is a parsed `show proc`.
type Procs struct {
	Master  Proc
	Workers []Proc // the current generation
	Old     []Proc // earlier generations still draining
}

// HasWorkers reports whether any worker runs. After a failed reload 3.1+
// lists the worker that goes on serving under "old workers", so a test for
// current workers alone would think HAProxy had none.
func (p Procs) HasWorkers() bool { return len(p.Workers)+len(p.Old) > 0 }

// WorkerPids returns the pids of every worker, current and old.
func (p Procs) WorkerPids() map[int]bool {
	m := make(map[int]bool, len(p.Workers)+len(p.Old))
	for _, w := range p.Workers {
		m[w.Pid] = true
	}
	for _, w := range p.Old {
		m[w.Pid] = true
	}
	return m
}

// ParseShowProc reads `show proc` as printed by HAProxy 2.6 to 3.x:
//
//	#<PID>          <type>          <reloads>       <uptime>        <version>
//	2716            master          1 [failed: 0]   0d00h10m10s     2.6.12
//	# workers
//	2969            worker          0               0d00h00m00s     2.6.12
//	# old workers
//	2719            worker          1               0d00h00m10s     2.6.12
//	# programs
func ParseShowProc(s string) (Procs, error) {
	var p Procs
	section := "master"
	seenMaster := false
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			switch h := strings.TrimSpace(strings.TrimPrefix(line, "#")); {
			case h == "workers":
				section = "workers"
			case h == "old workers":
				section = "old"
			case h == "programs" || h == "old programs":
				section = "programs"
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return p, fmt.Errorf("show proc: malformed line %q", line)
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			return p, fmt.Errorf("show proc: bad pid in %q", line)
		}
		reloads, err := strconv.Atoi(f[2])
		if err != nil {
			return p, fmt.Errorf("show proc: bad reload count in %q", line)
		}
		pr := Proc{Pid: pid, Type: f[1], Reloads: reloads, Failed: -1, Version: f[len(f)-1]}
		if i := strings.Index(line, "[failed:"); i >= 0 {
			rest := strings.TrimSpace(line[i+len("[failed:"):])
			n, _, _ := strings.Cut(rest, "]")
			if v, err := strconv.Atoi(strings.TrimSpace(n)); err == nil {
				pr.Failed = v
			}
		}
		switch {
		case pr.Type == "master":
			p.Master = pr
			seenMaster = true
		case section == "workers":
			p.Workers = append(p.Workers, pr)
		case section == "old":
			p.Old = append(p.Old, pr)
		}
	}
	if !seenMaster {
		return p, fmt.Errorf("show proc: no master line in %q", s)
	}
	return p, nil
}

// VersionAtLeast reports whether v, a version as `show proc` or
// `haproxy -v` prints it ("3.2.26-1", "2.6.12-1+deb12u4"), is major.minor
// or later; false when v does not start with two numbers.
func VersionAtLeast(v string, major, minor int) bool {
	ma, rest, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	mi := rest
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		mi = rest[:i]
	}
	x, err1 := strconv.Atoi(ma)
	y, err2 := strconv.Atoi(mi)
	if err1 != nil || err2 != nil {
		return false
	}
	return x > major || x == major && y >= minor
}
