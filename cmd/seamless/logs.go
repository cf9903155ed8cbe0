package main

import (
	"context"
	"log/slog"
	"strings"
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
