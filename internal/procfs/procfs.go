// Package procfs reads the process table from /proc, for the tests and the
// benchmark that must see what seamless and HAProxy left behind (zombies,
// workers, leaked processes). Linux only.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Proc is one process.
type Proc struct {
	Pid, PPid int
	Name      string // the command name in /proc/PID/stat
	State     byte   // 'R', 'S', 'Z', ...
}

// Zombie reports an exited process nobody has reaped yet.
func (p Proc) Zombie() bool { return p.State == 'Z' }

// Stat reads one process; false when it is gone.
func Stat(pid int) (Proc, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Proc{}, false
	}
	// The name is parenthesised and may itself hold spaces or parentheses.
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Proc{}, false
	}
	f := strings.Fields(s[closing+1:])
	if len(f) < 2 || f[0] == "" {
		return Proc{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return Proc{Pid: pid, PPid: ppid, Name: s[open+1 : closing], State: f[0][0]}, true
}

// All reads every process.
func All() []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if p, ok := Stat(pid); ok {
				out = append(out, p)
			}
		}
	}
	return out
}

// Children lists the processes whose parent is pid.
func Children(pid int) []Proc {
	var out []Proc
	for _, p := range All() {
		if p.PPid == pid {
			out = append(out, p)
		}
	}
	return out
}

// Descendants lists the whole tree below pid, from one reading of /proc.
func Descendants(pid int) []Proc {
	byParent := map[int][]Proc{}
	for _, p := range All() {
		byParent[p.PPid] = append(byParent[p.PPid], p)
	}
	var out []Proc
	queue := []int{pid}
	for len(queue) > 0 {
		kids := byParent[queue[0]]
		queue = queue[1:]
		for _, k := range kids {
			out = append(out, k)
			queue = append(queue, k.Pid)
		}
	}
	return out
}

// Mentions reports whether pid is alive (not a zombie) and its command line
// contains s: a private temp dir in it tells a process of ours from one
// that reuses its pid.
func Mentions(pid int, s string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(b, []byte(s)) {
		return false
	}
	p, ok := Stat(pid)
	return ok && !p.Zombie()
}

// Mentioning lists the live processes, other than this one, whose command
// line contains s.
func Mentioning(s string) []int {
	var out []int
	for _, p := range All() {
		if p.Pid != os.Getpid() && Mentions(p.Pid, s) {
			out = append(out, p.Pid)
		}
	}
	return out
}
