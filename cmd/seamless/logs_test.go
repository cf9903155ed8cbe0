package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
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

func TestProxyStoppedReadsHAProxysWarning(t *testing.T) {
	for _, tc := range []struct {
		line   string
		pid    string
		fe, be int64
		ok     bool
	}{
		{"[WARNING]  (1570) : Proxy svc-01 stopped (cumulated conns: FE: 0, BE: 12).", "1570", 0, 12, true},
		{"[WARNING] (7) : Proxy <HTTPCLIENT> stopped (cumulated conns: FE: 3, BE: 4).", "7", 3, 4, true},
		{"[NOTICE]   (7) : Proxy fe stopped (cumulated conns: FE: 3, BE: 4).", "", 0, 0, false},
		{"Proxy fe stopped (cumulated conns: FE: 3, BE: 4).", "", 0, 0, false},                       // the log target's copy
		{"[WARNING]  (7) : Proxy fe stopped.", "", 0, 0, false},                                      // another message
		{"[WARNING]  (x) : Proxy fe stopped (cumulated conns: FE: 3, BE: 4).", "", 0, 0, false},      // no pid
		{"[WARNING]  (7) : Proxy a b stopped (cumulated conns: FE: 3, BE: 4).", "", 0, 0, false},     // no proxy name has a space
		{"[WARNING]  (7) : Proxy fe stopped (cumulated conns: FE: 3, BE: 4). more", "", 0, 0, false}, // not the end
	} {
		pid, fe, be, ok := proxyStopped(tc.line)
		if pid != tc.pid || fe != tc.fe || be != tc.be || ok != tc.ok {
			t.Errorf("proxyStopped(%q) = %q, %d, %d, %v; want %q, %d, %d, %v", tc.line, pid, fe, be, ok, tc.pid, tc.fe, tc.be, tc.ok)
		}
	}
}

func stopLine(pid, i int) string {
	return fmt.Sprintf("[WARNING]  (%d) : Proxy p%d stopped (cumulated conns: FE: %d, BE: %d).\n", pid, i, i, 2*i)
}

func TestAWorkersStopsAreSummedPastTheFirstFew(t *testing.T) {
	var b syncBuffer
	s := newSummer(&b, time.Hour) // no run ends by the clock here
	w := onceEach(s)
	write := func(l string) {
		t.Helper()
		if n, err := w.Write([]byte(l)); err != nil || n != len(l) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	for i := range 10 {
		write(stopLine(12, i))
	}
	write("[NOTICE]   (1) : New worker (13) forked\n") // the master's: the run goes on
	write(stopLine(12, 10))
	write("[WARNING]  (12) : something else\n") // the worker's: the run ends
	write(stopLine(13, 0))                      // another worker's run
	write(stopLine(13, 1))
	write("[WARNING]  (1) : Former worker (12) exited with code 0 (Exit)\n")
	for i := range 5 {
		write(stopLine(14, i))
	}
	for i := range 4 {
		write(stopLine(15, i))
	}
	write("[WARNING]  (1) : Former worker (15) exited with code 0 (Exit)\n") // the master's word on it
	want := stopLine(12, 0) + stopLine(12, 1) + stopLine(12, 2) +
		"[NOTICE]   (1) : New worker (13) forked\n" +
		"[WARNING]  (12) : 8 more proxies stopped (cumulated conns: FE: 52, BE: 104).\n" + // 3+…+10
		"[WARNING]  (12) : something else\n" +
		stopLine(13, 0) + stopLine(13, 1) +
		"[WARNING]  (1) : Former worker (12) exited with code 0 (Exit)\n" +
		stopLine(14, 0) + stopLine(14, 1) + stopLine(14, 2) +
		stopLine(15, 0) + stopLine(15, 1) + stopLine(15, 2) +
		"[WARNING]  (15) : 1 more proxies stopped (cumulated conns: FE: 3, BE: 6).\n" +
		"[WARNING]  (1) : Former worker (15) exited with code 0 (Exit)\n"
	if got := b.String(); got != want {
		t.Errorf("before the end:\n%s\nwant\n%s", got, want)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	want += "[WARNING]  (14) : 2 more proxies stopped (cumulated conns: FE: 7, BE: 14).\n"
	if got := b.String(); got != want {
		t.Errorf("flushed:\n%s\nwant\n%s", got, want)
	}
}

// Nothing more comes: a run is summed once it has been quiet.
func TestAQuietRunIsSummed(t *testing.T) {
	var b syncBuffer
	w := newSummer(&b, 10*time.Millisecond)
	for i := range 5 {
		if _, err := w.Write([]byte(stopLine(14, i))); err != nil {
			t.Fatal(err)
		}
	}
	want := stopLine(14, 0) + stopLine(14, 1) + stopLine(14, 2) +
		"[WARNING]  (14) : 2 more proxies stopped (cumulated conns: FE: 7, BE: 14).\n"
	testenv.EventuallyExplained(t, 5*time.Second, "the quiet run summed", func() bool { return b.String() == want },
		func() { t.Logf("got\n%s\nwant\n%s", b.String(), want) })
}

// failing fails every write of a line holding fail.
type failing struct {
	syncBuffer
	fail string
}

func (f *failing) Write(p []byte) (int, error) {
	if strings.Contains(string(p), f.fail) {
		return 0, fmt.Errorf("write refused")
	}
	return f.syncBuffer.Write(p)
}

// A sum that cannot be written does not take the line after it along.
func TestALineAfterAFailedSumIsWritten(t *testing.T) {
	f := &failing{fail: "more proxies"}
	w := newSummer(f, time.Hour)
	for i := range 5 {
		if _, err := w.Write([]byte(stopLine(14, i))); err != nil {
			t.Fatal(err)
		}
	}
	const alert = "[ALERT]    (14) : something went wrong\n"
	if _, err := w.Write([]byte(alert)); err == nil {
		t.Error("the failed sum was not reported")
	}
	if !strings.HasSuffix(f.String(), alert) {
		t.Errorf("the line after the failed sum was lost:\n%s", f.String())
	}
}

// A reload of a configuration of a dozen proxies: the old worker's stop
// warnings are three and a sum, not one per proxy, with the log
// target's copies (log global) still dropped.
func TestAReloadsStopWarningsAreSummed(t *testing.T) {
	be := startBackend(t)
	s := newSite(t, be)
	s.extraFE = "    log global\n"
	for i := range 10 {
		s.tail += fmt.Sprintf("backend extra%d\n    server s1 %s\n", i, be.addr)
	}
	s.write(t, 1)
	in := startSeamless(t, s, startOpts{})
	in.waitReady(s)
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	const summed = "more proxies stopped (cumulated conns:"
	var out string
	testenv.EventuallyExplained(t, 15*time.Second, "the old worker's stops summed", func() bool {
		out = in.out.String()
		return strings.Contains(out, summed)
	}, func() { t.Logf("output:\n%s", out) })
	// The sum is printed last, once its run ended: nothing of it after.
	var kept, more int
	for _, l := range strings.Split(out, "\n") {
		if _, _, _, ok := proxyStopped(l); ok {
			kept++
		}
		if i := strings.Index(l, " more proxies stopped"); i > 0 {
			fields := strings.Fields(l[:i])
			more, _ = strconv.Atoi(fields[len(fields)-1])
		}
		if strings.Contains(l, "stopped (cumulated conns") && !strings.HasPrefix(l, "[") {
			t.Errorf("the log target's copy of a stop was passed on: %q", l)
		}
	}
	if kept != keptStops || more < 12-keptStops {
		t.Errorf("%d stops printed and %d summed, want %d and at least %d (fe, be and 10 backends):\n%s", kept, more, keptStops, 12-keptStops, out)
	}
}

// HAProxy's output ends (seamless stops): what the summer held back is
// printed before Copy returns, not by a timer seamless may not outlive.
func TestHeldStopsArePrintedWhenTheOutputEnds(t *testing.T) {
	var in strings.Builder
	for i := range 6 {
		in.WriteString(stopLine(12, i))
	}
	var b syncBuffer
	haproxy.NewLogTap().Copy(strings.NewReader(in.String()), onceEach(stopsSummed(&b)))
	want := stopLine(12, 0) + stopLine(12, 1) + stopLine(12, 2) +
		"[WARNING]  (12) : 3 more proxies stopped (cumulated conns: FE: 12, BE: 24).\n"
	if got := b.String(); got != want {
		t.Errorf("after the output ended:\n%s\nwant\n%s", got, want)
	}
}

// In json, each HAProxy line is a record at HAProxy's own severity, and
// the record does not name seamless's caller: looking that frame up was
// the largest part of a record's cost, and an old worker prints a line
// per proxy as it stops.
func TestHAProxyLinesAreRecordsAtTheirSeverity(t *testing.T) {
	h := &testenv.Records{}
	w := haproxyLines{slog.New(h)}
	for _, l := range []string{
		"[NOTICE]   (1) : Loading success.\n",
		"[WARNING]  (9) : Proxy be stopped (cumulated conns: FE: 0, BE: 3).\n",
		"[ALERT]    (1) : config : parsing [x.cfg:3] : unknown keyword\r\n",
	} {
		if n, err := w.Write([]byte(l)); n != len(l) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", l, n, err)
		}
	}
	want := []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError}
	got := h.All()
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i, r := range got {
		component := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "component" {
				component = a.Value.String()
			}
			return true
		})
		if r.Level != want[i] || component != "haproxy" || strings.ContainsAny(r.Message, "\r\n") || r.Time.IsZero() {
			t.Errorf("record %d: level %v, component %q, message %q, time %v; want level %v, component haproxy, the line without its end", i, r.Level, component, r.Message, r.Time, want[i])
		}
		if r.PC != 0 {
			t.Errorf("record %d names a caller (pc %#x): looked up for every line", i, r.PC)
		}
	}
}

// The string LogTap reads for a line is the one every step after it
// keeps: a worker stopping prints a line per proxy (a thousand at a
// thousand services), and each step converting it back and forth made
// four copies of every line.
func TestALineIsNotCopiedAlongTheWay(t *testing.T) {
	const stops = 1000
	var sb strings.Builder
	for i := range stops {
		fmt.Fprintf(&sb, "[WARNING]  (4242) : Proxy svc-%04d stopped (cumulated conns: FE: 0, BE: 12).\n", i)
	}
	sb.WriteString("[WARNING]  (1) : Former worker (4242) exited with code 0 (Exit)\n")
	text := sb.String()
	for _, format := range []string{"text", "json"} {
		var out bytes.Buffer
		var to io.Writer = &out
		if format == "json" {
			to = haproxyLines{slog.New(slog.NewJSONHandler(&out, nil))}
		}
		allocs := testing.AllocsPerRun(5, func() {
			out.Reset()
			haproxy.NewLogTap().Copy(strings.NewReader(text), onceEach(stopsSummed(to)))
		})
		// One string per line, and a few for the reader, the summer and
		// the records it passes on.
		if limit := float64(stops) * 1.1; allocs > limit {
			t.Errorf("%s: %.0f allocations for %d lines, want at most %.0f", format, allocs, stops+1, limit)
		}
		if n := strings.Count(out.String(), "stopped"); n != keptStops+1 {
			t.Errorf("%s: %d stop lines passed on, want the first %d and their sum:\n%s", format, n, keptStops, out.String())
		}
	}
}
