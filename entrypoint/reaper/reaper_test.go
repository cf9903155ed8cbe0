package reaper

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/procfs"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func start(t *testing.T) *Reaper {
	t.Helper()
	if err := BecomeSubreaper(); err != nil {
		t.Fatal(err)
	}
	r := New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func sh(t *testing.T, r *Reaper, script string) *Child {
	t.Helper()
	c, err := r.Start("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestExitCodes(t *testing.T) {
	r := start(t)
	tests := []struct {
		script string
		code   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -KILL $$", 128 + 9},
		{"kill -TERM $$", 128 + 15},
	}
	for _, tt := range tests {
		c := sh(t, r, tt.script)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := c.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%q: %v", tt.script, err)
		}
		if st.ExitCode() != tt.code {
			t.Errorf("%q: exit code %d (%s), want %d", tt.script, st.ExitCode(), st, tt.code)
		}
	}
}

// A child that exits before Start has registered it must not lose its
// status: the hook holds registration until the child is a zombie, which
// the reaper can see but must not hand to nobody.
func TestFastChildrenKeepTheirStatus(t *testing.T) {
	r := start(t)
	afterFork = func(pid int) {
		testenv.Eventually(t, 10*time.Second, "child exited before registration", func() bool {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			s := string(b)
			return err == nil && strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z")
		})
	}
	defer func() { afterFork = nil }()
	for i := range 5 {
		c := sh(t, r, "exit 7")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := c.Wait(ctx)
		cancel()
		if err != nil || st.ExitCode() != 7 {
			t.Fatalf("child %d: status %v err %v, want exit 7", i, st, err)
		}
	}
}

// Orphans (a grandchild whose parent exited) are reparented to us as a
// subreaper and must not stay zombies.
func TestOrphansAreReaped(t *testing.T) {
	r := start(t)
	c := sh(t, r, "for i in 1 2 3 4 5; do (exit 0) & done; sleep 0.2 & exit 0")
	if _, err := c.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "orphans reaped", func() bool { return r.Orphans() >= 1 })
	testenv.Eventually(t, 10*time.Second, "no zombie children left", func() bool { return len(zombies()) == 0 })
}

// zombies lists our children in state Z.
func zombies() []int {
	var z []int
	for _, p := range procfs.Children(os.Getpid()) {
		if p.Zombie() {
			z = append(z, p.Pid)
		}
	}
	return z
}

func TestOutput(t *testing.T) {
	r := start(t)
	out, st, err := r.Output(context.Background(), []string{"sh", "-c", "echo out; echo err >&2; exit 4"}, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitCode() != 4 || !strings.Contains(string(out), "out") || !strings.Contains(string(out), "err") {
		t.Errorf("Output = %q, %v; want both streams and exit 4", out, st)
	}

	// A grandchild holding the pipe open must not block the caller once the
	// child itself has exited.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	_, st, err = r.Output(ctx, []string{"sh", "-c", "sleep 30 & echo started; exit 0"}, os.Environ())
	if err == nil && st.ExitCode() != 0 {
		t.Errorf("status %v", st)
	}
	if time.Since(begin) > 15*time.Second {
		t.Errorf("Output waited for the grandchild")
	}

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := r.Output(ctx, []string{"sleep", "30"}, os.Environ()); err == nil {
		t.Error("a command outliving its context was not cut short")
	}
	if _, _, err := r.Output(context.Background(), []string{"/no/such/command"}, nil); err == nil {
		t.Error("a missing command was not reported")
	}
}
