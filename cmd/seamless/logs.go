package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// haproxyLines turns HAProxy's output, one line per Write (as LogTap
// writes it), into log records, so that with SEAMLESS_LOG_FORMAT=json the
// whole stream is JSON for a log pipeline. HAProxy's own severity becomes
// the record's level.
type haproxyLines struct{ log *slog.Logger }

func (h haproxyLines) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\r\n")
	level := slog.LevelInfo
	switch {
	case strings.HasPrefix(line, "[ALERT]"):
		level = slog.LevelError
	case strings.HasPrefix(line, "[WARNING]"):
		level = slog.LevelWarn
	}
	h.log.Log(context.Background(), level, line, "component", "haproxy")
	return len(p), nil
}

// onceEach passes HAProxy's output on, less the log target's copy of a
// message HAProxy also printed itself: with `log stderr` in the
// configuration every warning reaches seamless twice, once as
// "[WARNING]  (pid) : message" and once as a log line ending in message.
// Identical lines are never dropped: two equal traffic lines are two
// requests.
func onceEach(w io.Writer) io.Writer { return &dedupe{w: w} }

type dedupe struct {
	w      io.Writer
	mu     sync.Mutex
	recent [8]string // the last lines passed on, newest at recent[n%8]
	n      int
}

// minEcho keeps short messages from matching by accident.
const minEcho = 12

func (d *dedupe) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\r\n")
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.recent {
		if r != "" && r != line && (echoes(r, line) || echoes(line, r)) {
			return len(p), nil
		}
	}
	d.recent[d.n%len(d.recent)] = line
	d.n++
	return d.w.Write(p)
}

// echoes: prefixed is "[LEVEL]  (pid) : message" and other ends with
// message.
func echoes(prefixed, other string) bool {
	if !strings.HasPrefix(prefixed, "[") {
		return false
	}
	_, msg, ok := strings.Cut(prefixed, ") : ")
	return ok && len(msg) >= minEcho && !strings.HasPrefix(other, "[") && strings.HasSuffix(other, msg)
}
