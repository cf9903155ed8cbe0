package haproxy

import (
	"bufio"
	"io"
	"strings"
	"sync"
)

// socketTransferFailed is what HAProxy logs when the new worker could not
// take the listening sockets over and falls back to binding its own: the
// lossy path that master-worker mode exists to avoid.
const socketTransferFailed = "Failed to get the sockets from the old process"

// LogTap copies HAProxy's output to a writer line by line and remembers the
// recent lines, so that a failed reload can be reported with HAProxy's own
// start-up messages, and the socket-transfer fallback can be noticed.
type LogTap struct {
	// OnSocketTransferFailure is called for every such line.
	OnSocketTransferFailure func(line string)

	mu   sync.Mutex
	ring [tapKeep]string // line n is at ring[n%tapKeep]
	seq  uint64          // number of lines seen so far
}

const tapKeep = 256

// NewLogTap returns an empty tap.
func NewLogTap() *LogTap { return &LogTap{} }

// Copy forwards r to w until r ends, then flushes w if it is a Flusher.
// It never stops reading because w is slow or broken: HAProxy blocks on a
// full pipe.
func (t *LogTap) Copy(r io.Reader, w io.Writer) {
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			_, _ = io.WriteString(w, line)
			t.add(strings.TrimRight(line, "\r\n"))
		}
		if err != nil {
			if f, ok := w.(Flusher); ok {
				_ = f.Flush()
			}
			return
		}
	}
}

// Flusher is a writer that may hold lines back: Copy flushes it once
// HAProxy's output ends, so that nothing is lost when seamless exits.
type Flusher interface{ Flush() error }

func (t *LogTap) add(line string) {
	if strings.Contains(line, socketTransferFailed) && t.OnSocketTransferFailure != nil {
		t.OnSocketTransferFailure(line)
	}
	// A ring, since with traffic logs on stderr this runs per request.
	t.mu.Lock()
	t.ring[t.seq%tapKeep] = line
	t.seq++
	t.mu.Unlock()
}

// Mark returns a position; Since(mark) returns the lines after it.
func (t *LogTap) Mark() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq
}

// Since returns the retained lines written after mark.
func (t *LogTap) Since(mark uint64) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := max(mark, t.seq-min(t.seq, tapKeep))
	out := make([]string, 0, t.seq-first)
	for n := first; n < t.seq; n++ {
		out = append(out, t.ring[n%tapKeep])
	}
	return out
}

// Startup returns the lines HAProxy printed about a (re)load since mark:
// alerts and warnings from the master, not traffic logs.
func (t *LogTap) Startup(mark uint64) []string {
	var out []string
	for _, l := range t.Since(mark) {
		if strings.Contains(l, "[ALERT]") || strings.Contains(l, "Loading failure") {
			out = append(out, l)
		}
	}
	return out
}
