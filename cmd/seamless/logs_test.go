package main

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// A configuration with `log stderr` (the built-in template's, the tests'
// site) makes HAProxy print each warning twice on the stderr seamless
// reads: once itself, once as a log line. seamless shows it once.
func TestHAProxyWarningsAppearOnce(t *testing.T) {
	be := startBackend(t)
	s := newSite(t, be)
	s.extraFE = "    log global\n" // as the built-in template's defaults
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{})
	in.waitReady(s)
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := in.showProc().Workers[0].Pid
	if _, err := in.cli().WaitShowProc(ctx, func(p haproxy.Procs) bool {
		return len(p.Old) == 0 && len(p.Workers) == 1 && p.Workers[0].Pid != first
	}); err != nil {
		t.Fatal(err)
	}
	// The old worker says so as it stops.
	const stopped = "Proxy fe stopped"
	var out string
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out, stopped) && time.Now().Before(deadline) {
		out = in.out.String()
		time.Sleep(20 * time.Millisecond) // polling the output with a deadline
	}
	if n := strings.Count(out, stopped); n != 1 {
		t.Errorf("%q appears %d times, want once:\n%s", stopped, n, out)
	}
}

func TestOnceEachDropsTheLogTargetsCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want []string
	}{
		{"the warning, then its raw log line",
			[]string{"[WARNING]  (12) : Proxy fe stopped (cumulated conns: FE: 1, BE: 0).\n", "Proxy fe stopped (cumulated conns: FE: 1, BE: 0).\n"},
			[]string{"[WARNING]  (12) : Proxy fe stopped (cumulated conns: FE: 1, BE: 0).\n"}},
		{"the log line first, in syslog format",
			[]string{"<133>Nov 30 21:11:06 haproxy[12]: Server be/s1 is DOWN, reason: Layer4 connection problem.\n", "[WARNING]  (12) : Server be/s1 is DOWN, reason: Layer4 connection problem.\n"},
			[]string{"<133>Nov 30 21:11:06 haproxy[12]: Server be/s1 is DOWN, reason: Layer4 connection problem.\n"}},
		{"the same traffic line twice is two requests",
			[]string{"127.0.0.1:5000 [30/Nov/2026:21:11:06.634] fe be/s1 0/0/0/1/1 200 120 - - ---- 1/1/0/0/0 0/0 \"GET / HTTP/1.1\"\n", "127.0.0.1:5000 [30/Nov/2026:21:11:06.634] fe be/s1 0/0/0/1/1 200 120 - - ---- 1/1/0/0/0 0/0 \"GET / HTTP/1.1\"\n"},
			[]string{"127.0.0.1:5000 [30/Nov/2026:21:11:06.634] fe be/s1 0/0/0/1/1 200 120 - - ---- 1/1/0/0/0 0/0 \"GET / HTTP/1.1\"\n", "127.0.0.1:5000 [30/Nov/2026:21:11:06.634] fe be/s1 0/0/0/1/1 200 120 - - ---- 1/1/0/0/0 0/0 \"GET / HTTP/1.1\"\n"}},
		{"the same warning twice is two warnings",
			[]string{"[WARNING]  (12) : Server be/s1 is DOWN.\n", "[WARNING]  (12) : Server be/s1 is DOWN.\n"},
			[]string{"[WARNING]  (12) : Server be/s1 is DOWN.\n", "[WARNING]  (12) : Server be/s1 is DOWN.\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			w := onceEach(&b)
			for _, l := range tc.in {
				if n, err := w.Write([]byte(l)); err != nil || n != len(l) {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if got := b.String(); got != strings.Join(tc.want, "") {
				t.Errorf("got\n%s\nwant\n%s", got, strings.Join(tc.want, ""))
			}
		})
	}
}
