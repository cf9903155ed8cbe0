package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// writeTable prints rows as the reload table does: the first left columns
// left-aligned, the others right-aligned, " | " between.
func writeTable(w io.Writer, rows [][]string, left int) {
	if len(rows) == 0 {
		return
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, cell := range row {
			if i < left {
				cells[i] = fmt.Sprintf("%-*s", widths[i], cell)
			} else {
				cells[i] = fmt.Sprintf("%*s", widths[i], cell)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(strings.Join(cells, " | "), " "))
	}
}

// fmtMs formats a duration in milliseconds with one decimal.
func fmtMs(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// fmtMiB formats bytes in MiB with one decimal.
func fmtMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// fmtPct formats the p-th percentile in milliseconds; "-" for no data.
func fmtPct(ds []time.Duration, p float64) string {
	d, ok := percentile(ds, p)
	if !ok {
		return "-"
	}
	return fmtMs(d)
}

// against says whether got is under target, or by how much it misses.
func against(got, target float64, by string) string {
	if got < target {
		return "met"
	}
	return fmt.Sprintf("missed by %s (%.2fx)", by, got/target)
}

func fmtMiBOr(b int64) string {
	if b == 0 {
		return "-"
	}
	return fmtMiB(b)
}

// printPropTable prints the propagation table and what it says about the target.
func printPropTable(w io.Writer, o propOptions, results []propResult) {
	rows := [][]string{{"change", "SERVER_SLOTS", "SEAMLESS_WAIT", "changes", "served p50", "p90", "p99", "max",
		"runtime API", "seamless apply p50", "reload p50", "reloads done", "probe errors"}}
	for _, r := range results {
		reloads := fmt.Sprintf("%.0f", r.reloadsOK)
		if r.reloadsBad > 0 {
			reloads += fmt.Sprintf(" (+%.0f failed)", r.reloadsBad)
		}
		rows = append(rows, []string{
			r.kind, r.slots.label(), r.wait.label(), fmt.Sprintf("%d/%d", len(r.lat), r.asked),
			fmtPct(r.lat, 50), fmtPct(r.lat, 90), fmtPct(r.lat, 99), fmtPct(r.lat, 100),
			fmt.Sprintf("%d/%d", r.runtime, len(r.pipeline)), fmtPct(r.pipeline, 50), fmtPct(r.reload, 50),
			reloads, fmt.Sprint(r.pollErrors),
		})
	}
	writeTable(w, rows, 3)
	for _, r := range results {
		if r.wait.value != "0" || len(r.lat) == 0 {
			continue
		}
		p99, _ := percentile(r.lat, 99)
		fmt.Fprintf(w, "target p99 < %v with SEAMLESS_WAIT=0 (%s, slots %s): %s\n", o.target, r.kind, r.slots.label(),
			against(float64(p99), float64(o.target), fmtMs(p99-o.target)))
	}
	for _, r := range results {
		name := fmt.Sprintf("%s / slots %s / wait %s", r.kind, r.slots.label(), r.wait.label())
		fmt.Fprintf(w, "%s: seamless logged %s\n", name, r.logs)
		if r.err != nil {
			first, _, _ := strings.Cut(r.err.Error(), "\n")
			fmt.Fprintf(w, "%s error: %s\n", name, first)
		}
	}
}

// printScaleTable prints the scale table, the details of each row and the targets.
func printScaleTable(w io.Writer, o scaleOptions, results []scaleResult) {
	rows := [][]string{{"services", "instances", "SERVER_SLOTS", "config", "render p50", "haproxy -c p50", "served p50", "served max",
		"runtime API", "seamless apply p50", "reload p50", "RSS loaded", "RSS after changes", "RSS peak", "Consul req/change"}}
	for _, r := range results {
		rows = append(rows, []string{
			fmt.Sprint(r.l.services), fmt.Sprint(r.l.services * r.l.instances), r.slots.label(),
			fmt.Sprintf("%.0f KiB", float64(r.cfgBytes)/1024),
			fmtPct(r.render, 50), fmtPct(r.check, 50), fmtPct(r.served, 50), fmtPct(r.served, 100),
			fmt.Sprintf("%d/%d", r.runtime, len(r.pipeline)), fmtPct(r.pipeline, 50), fmtPct(r.reload, 50),
			fmtMiBOr(r.rssLoaded), fmtMiBOr(r.rssAfter), fmtMiBOr(r.peak), r.perChange(),
		})
	}
	writeTable(w, rows, 0)
	for _, r := range results {
		name := fmt.Sprintf("%d services, slots %s", r.l.services, r.slots.label())
		fmt.Fprintf(w, "%s: SEAMLESS_WAIT %s; registered in %s; seamless ready in %s; its haproxy.cfg and the in-process render: %s\n",
			name, r.wait.label(), r.register.Round(time.Millisecond), r.ready.Round(time.Millisecond), r.same)
		fmt.Fprintf(w, "%s: render allocates %s per run; Go heap in use %s loaded, %s after changes; write → \"applied\" record p50 %s; %d changes, %.0f Consul requests\n",
			name, fmtMiB(int64(r.renderAlloc)), fmtMiB(int64(r.heapLoaded)), fmtMiB(int64(r.heapAfter)),
			fmtPct(r.appliedAt, 50), r.asked, r.requests)
		fmt.Fprintf(w, "%s: seamless logged %s\n", name, r.logs)
		if r.err != nil {
			first, _, _ := strings.Cut(r.err.Error(), "\n")
			fmt.Fprintf(w, "%s error: %s\n", name, first)
			continue
		}
		render, _ := percentile(r.render, 50)
		rss := max(r.rssLoaded, r.rssAfter)
		fmt.Fprintf(w, "%s: target RSS < %s: %s (peak %s: %s); target render < %v: %s\n", name,
			fmtMiB(o.rssTarget), against(float64(rss), float64(o.rssTarget), fmtMiB(rss-o.rssTarget)),
			fmtMiB(r.peak), against(float64(r.peak), float64(o.rssTarget), fmtMiB(r.peak-o.rssTarget)),
			o.renderTarget, against(float64(render), float64(o.renderTarget), fmtMs(render-o.renderTarget)))
	}
	var perChange []string
	for _, r := range results {
		if r.err == nil && r.asked > 0 {
			perChange = append(perChange, fmt.Sprintf("%s at %d services (slots %s)", r.perChange(), r.l.services, r.slots.label()))
		}
	}
	if len(perChange) > 0 {
		fmt.Fprintf(w, "target O(1) Consul requests per change: %s\n", strings.Join(perChange, ", "))
	}
}

// perChange is the Consul requests per change, "-" without a complete run.
func (r scaleResult) perChange() string {
	if r.asked == 0 || r.err != nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", r.requests/float64(r.asked))
}
