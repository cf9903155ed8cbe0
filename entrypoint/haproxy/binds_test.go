package haproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseBinds(t *testing.T) {
	env := lookup([]string{"PORT=8443", "IP=127.0.0.2", "EMPTY="})
	for _, tc := range []struct {
		name string
		cfg  string
		want []string // "network addr line" ; "?" marks a conditional bind
	}{
		{"port only is IPv4 any", "frontend f\n    bind :80\n", []string{"tcp4 0.0.0.0:80 2"}},
		{"star", "frontend f\n    bind *:80\n", []string{"tcp4 0.0.0.0:80 2"}},
		{"IPv4 address", "listen l\n    bind 0.0.0.0:80 name x\n", []string{"tcp4 0.0.0.0:80 2"}},
		{"IPv6 any takes IPv4 too", "frontend f\n    bind [::]:80\n", []string{"tcp [::]:80 2"}},
		{"IPv6 any, v6only", "frontend f\n    bind [::]:80 v6only\n", []string{"tcp6 [::]:80 2"}},
		{"unbracketed IPv6", "frontend f\n    bind :::80\n", []string{"tcp [::]:80 2"}},
		{"ipv4@ prefix", "frontend f\n    bind ipv4@1.2.3.4:80\n", []string{"tcp4 1.2.3.4:80 2"}},
		{"ipv6@ prefix", "frontend f\n    bind ipv6@::1:80\n", []string{"tcp6 [::1]:80 2"}},
		{"ipv6@ with an empty host", "frontend f\n    bind ipv6@:80\n", []string{"tcp [::]:80 2"}},
		{"comma list", "frontend f\n    bind 127.0.0.1:80,127.0.0.1:81 ssl crt x.pem\n",
			[]string{"tcp4 127.0.0.1:80 2", "tcp4 127.0.0.1:81 2"}},
		{"port range", "frontend f\n    bind 127.0.0.1:80-82\n",
			[]string{"tcp4 127.0.0.1:80 2", "tcp4 127.0.0.1:81 2", "tcp4 127.0.0.1:82 2"}},
		{"comment and blank lines", "# bind :1\n\nfrontend f # x\n    bind :80 # bind :81\n", []string{"tcp4 0.0.0.0:80 4"}},
		{"peers and log-forward", "peers p\n    bind :1024\nlog-forward lf\n    bind :1025\n    dgram-bind :1026\n",
			[]string{"tcp4 0.0.0.0:1024 2", "tcp4 0.0.0.0:1025 4"}},
		{"TCP stats socket", "global\n    stats socket ipv4@127.0.0.1:9999 level admin\n", []string{"tcp4 127.0.0.1:9999 2"}},
		{"environment variables in double quotes", "frontend f\n    bind \"${IP}:$PORT\"\n", []string{"tcp4 127.0.0.2:8443 2"}},
		{"a .if block is marked", "frontend f\n.if defined(X)\n    bind :80\n.endif\n    bind :81\n",
			[]string{"? tcp4 0.0.0.0:80 3", "tcp4 0.0.0.0:81 5"}},
		{"nested .if", "frontend f\n.if 1\n.if 0\n.else\n    bind :80\n.endif\n    bind :81\n.endif\n    bind :82\n",
			[]string{"? tcp4 0.0.0.0:80 5", "? tcp4 0.0.0.0:81 7", "tcp4 0.0.0.0:82 9"}},

		// Left out: what cannot be resolved for certain.
		{"unix sockets and the like", "frontend f\n    bind unix@/run/x.sock\n    bind /run/y.sock\n    bind abns@x\n    bind fd@3\n    bind sockpair@4\n    bind quic4@:443\n    bind udp@:53\n", nil},
		{"stats socket on a path", "global\n    stats socket /run/haproxy.sock mode 600\n", nil},
		{"host names", "frontend f\n    bind localhost:80\n", nil},
		{"unset variable", "frontend f\n    bind \"${NOPE}:80\"\n", nil},
		{"variable with a default", "frontend f\n    bind \"${PORT-80}\"\n", nil},
		{"unquoted dollar is not expanded", "frontend f\n    bind :$PORT\n", nil},
		{"escapes", "frontend f\n    bind \\:80\n", nil},
		{"unterminated quote", "frontend f\n    bind \":80\n", nil},
		{"no port", "frontend f\n    bind 127.0.0.1\n", nil},
		{"bad port", "frontend f\n    bind :99999\n    bind :0\n    bind :08\n", nil},
		{"huge range", "frontend f\n    bind :1000-60000\n", nil},
		{"bind options that bind elsewhere", "frontend f\n    bind :80 namespace x\n    bind :81 interface eth0\n    bind 10.9.9.9:82 transparent\n    bind [::]:83 v4v6\n", nil},
		{"bind outside a frontend", "backend b\n    bind :80\ndefaults\n    bind :81\n", nil},
		{"IPv4 address with ipv6@", "frontend f\n    bind ipv6@1.2.3.4:80\n", nil},
		{"a zone", "frontend f\n    bind [fe80::1%eth0]:80\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "haproxy.cfg")
			if err := os.WriteFile(path, []byte(tc.cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			binds, err := ParseBinds([]string{path}, env)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range binds {
				s := b.Network + " " + b.Addr.String() + " " + strings.TrimPrefix(b.Where(), path+":")
				if b.Conditional {
					s = "? " + s
				}
				got = append(got, s)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func FuzzParseBinds(f *testing.F) {
	f.Add("frontend f\n    bind \"${IP}:$PORT\",[::]:80-81 v6only\n")
	f.Add("global\n    stats socket ipv4@127.0.0.1:9999\n.if 1\nlisten l\n    bind *:1\n")
	f.Fuzz(func(t *testing.T, cfg string) {
		path := filepath.Join(t.TempDir(), "f.cfg")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		binds, _ := ParseBinds([]string{path}, lookup([]string{"IP=127.0.0.1", "PORT=80"}))
		for _, b := range binds {
			if !b.Addr.IsValid() || b.Addr.Port() == 0 || b.Line < 1 {
				t.Fatalf("invalid bind %+v", b)
			}
		}
	})
}

// A line whose first word, as written, is plain and no keyword is skipped
// unsplit: splitting it must give that word, and so no keyword either.
func FuzzFirstWordSkipsOnlyWhatSplittingSkips(f *testing.F) {
	for _, line := range []string{
		"    server web-1 10.0.0.1:80 check", "\tbind :80", "bind#x", "\"bind\" :80", "b\\ind :80",
		"'stats' socket :1", "  .if defined(X)", "#bind :80", "", "   ", "frontend f", "\"\"bind :80",
		"stats\tsocket ipv4@127.0.0.1:1", "bin\"d\" :80",
	} {
		f.Add(line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		w, plain := firstWord([]byte(line))
		if !plain {
			return
		}
		words, _ := splitLine(line, nil)
		if len(words) == 0 {
			if len(w) != 0 {
				t.Fatalf("%q: first word %q, split into none", line, w)
			}
			return
		}
		if words[0].text != string(w) {
			t.Fatalf("%q: first word %q, split into %q", line, w, words[0].text)
		}
	})
}

// A Guard refuses an address the candidate adds that another process
// holds, and never one the running configuration binds.
func TestBindGuard(t *testing.T) {
	held, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	dir := t.TempDir()
	write := func(name, binds string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("frontend f\n"+binds), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	running := write("running.cfg", "    bind "+freeAddr+"\n")
	g := NewBindGuard([]string{running}, nil)
	if err := g.Check([]string{write("same.cfg", "    bind "+freeAddr+"\n")}); err != nil {
		t.Errorf("an unchanged configuration refused: %v", err)
	}

	taken := write("taken.cfg", "    bind "+freeAddr+"\n    bind "+held.Addr().String()+"\n")
	err = g.Check([]string{taken})
	var be *BindError
	if !errors.As(err, &be) || be.Bind.String() != held.Addr().String() || be.Bind.Where() != taken+":3" ||
		!strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("got %v, want a BindError for %s at %s:3", err, held.Addr(), taken)
	}

	// What runs is HAProxy's: the same address is not probed again.
	g = NewBindGuard([]string{taken}, nil)
	if err := g.Check([]string{taken}); err != nil {
		t.Errorf("an address the running configuration binds was probed: %v", err)
	}

	// An address that no interface has cannot be bound either.
	if err := g.Check([]string{write("foreign.cfg", "    bind 192.0.2.1:80\n")}); !errors.As(err, &be) {
		t.Errorf("an address of no interface: got %v, want a BindError", err)
	}

	// Loaded(true) makes the checked candidate what runs; a failed one
	// changes nothing.
	g = NewBindGuard([]string{running}, nil)
	_ = g.Check([]string{taken})
	g.Loaded(true) // no Check passed since: what runs stays
	if err := g.Check([]string{taken}); !errors.As(err, &be) {
		t.Errorf("after a refused candidate: got %v, want a BindError", err)
	}
	moved := write("moved.cfg", "    bind 127.0.0.1:1\n")
	if err := g.Check([]string{moved}); err != nil {
		t.Skipf("cannot bind 127.0.0.1:1 here: %v", err)
	}
	g.Loaded(true)
	g.mu.Lock()
	_, stillFree := g.running["tcp4 "+freeAddr]
	g.mu.Unlock()
	if stillFree {
		t.Error("after a confirmed reload the old addresses still count as running")
	}
}

// A port that another socket of this user shares with SO_REUSEPORT can be
// bound by HAProxy too: it is not refused.
func TestBindGuardAcceptsAPortSharedWithSOREUSEPORT(t *testing.T) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		return errors.Join(err, serr)
	}}
	shared, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	p := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(p, []byte("frontend f\n    bind "+shared.Addr().String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := NewBindGuard(nil, nil).Check([]string{p}); err != nil {
		t.Errorf("a port shared with SO_REUSEPORT refused: %v", err)
	}
}

// HAProxy skips the names of a -f directory that begin with ".", so the
// guard does too: a backup's bind is not probed, and an editor's dangling
// lock link does not stop the guard from probing the real files.
func TestBindGuardSkipsHiddenFilesOfADirectory(t *testing.T) {
	held, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	write := func(p, binds string) {
		t.Helper()
		if err := os.WriteFile(p, []byte("frontend f\n"+binds), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	backup := t.TempDir()
	write(filepath.Join(backup, "a.cfg"), "    bind 127.0.0.1:0\n")
	write(filepath.Join(backup, ".old.cfg"), "    bind "+held.Addr().String()+"\n")
	if err := NewBindGuard(nil, nil).Check([]string{backup}); err != nil {
		t.Errorf("a hidden backup's bind was probed: %v", err)
	}

	lock := t.TempDir()
	write(filepath.Join(lock, "a.cfg"), "    bind "+held.Addr().String()+"\n")
	if err := os.Symlink("user@host.1234:1700000000", filepath.Join(lock, ".#a.cfg")); err != nil {
		t.Fatal(err)
	}
	var be *BindError
	if err := NewBindGuard(nil, nil).Check([]string{lock}); !errors.As(err, &be) {
		t.Errorf("with an editor's lock link beside it: got %v, want a BindError for %s", err, held.Addr())
	}
}

// Both validators (the applier's and the reloader's) share one guard: a
// Check reading what runs while a Loaded adds to it must not race (run
// with -race).
func TestBindGuardCheckAndLoadedConcurrently(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for i := range 2 {
		p := filepath.Join(dir, fmt.Sprintf("%d.cfg", i))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("frontend f\n    bind 127.0.0.1:%d\n    bind 127.0.0.1:%d\n", 40000+i*2, 40001+i*2)), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	g := NewBindGuard(nil, nil)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				_ = g.Check([]string{files[i]})
				g.Loaded(false)
			}
		}()
	}
	wg.Wait()
}
