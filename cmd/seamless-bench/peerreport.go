package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
)

// printPeerTable prints the side-by-side as one markdown table, seamless's
// numbers with their ratio to consul-template's in the same catalog and
// mode, then what each row rests on.
func printPeerTable(w io.Writer, o peerOptions, results []peerResult) {
	fmt.Fprintln(w, "| catalog | tool | mode | change → file p50 / p99 ms | change → served p50 / p99 ms | Consul KiB / change (all · answers) | Consul requests / change (all · answers) | tool CPU ms / change | Consul agent CPU ms / change | RSS / peak MiB |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		base := peerBaseline(results, r)
		cells := []string{r.size.String(), r.tool.title, r.mode()}
		if r.asked == 0 || len(r.rendered) == 0 {
			cells = append(cells, "–", "–", "–", "–", "–", "–", "–")
			if r.err != nil {
				first, _, _ := strings.Cut(r.err.Error(), "\n")
				cells[3] = "failed: " + mdEscape(first)
			}
			fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
			continue
		}
		p50, _ := percentile(r.rendered, 50)
		p99, _ := percentile(r.rendered, 99)
		file := fmt.Sprintf("%s / %s", fmtMsN(p50), fmtMsN(p99))
		if base != nil {
			b50, _ := percentile(base.rendered, 50)
			b99, _ := percentile(base.rendered, 99)
			file += fmt.Sprintf(" (%s / %s)", ratio(float64(p50), float64(b50)), ratio(float64(p99), float64(b99)))
		}
		if miss := r.asked - len(r.rendered); miss > 0 {
			file += fmt.Sprintf("; **%d of %d never in the file**", miss, r.asked)
		}
		served := "–"
		if len(r.served) > 0 {
			s50, _ := percentile(r.served, 50)
			s99, _ := percentile(r.served, 99)
			served = fmt.Sprintf("%s / %s", fmtMsN(s50), fmtMsN(s99))
			if b := peerServedBaseline(results, r); b != nil {
				b50, _ := percentile(b.served, 50)
				b99, _ := percentile(b.served, 99)
				served += fmt.Sprintf(" (%s / %s of ct + reload)", ratio(float64(s50), float64(b50)), ratio(float64(s99), float64(b99)))
			}
			if miss := r.asked - len(r.served); miss > 0 {
				served += fmt.Sprintf("; **%d of %d never served**", miss, r.asked)
			}
		}
		n := float64(r.asked)
		all, answers := r.traffic.total(), r.traffic.answers()
		kib := fmt.Sprintf("%.1f · %.1f", float64(all.Body)/1024/n, float64(answers.Body)/1024/n)
		req := fmt.Sprintf("%.1f · %.1f", float64(all.Requests)/n, float64(answers.Requests)/n)
		if o.direct && !r.tool.consulTemplate() {
			kib, req = "not counted (-direct)", "not counted (-direct)"
		}
		cpu := fmtMsN(r.cpu / time.Duration(r.asked))
		agent := fmtMsN(r.agent / time.Duration(r.asked))
		rss := fmt.Sprintf("%.0f / %.0f", float64(r.rss)/(1<<20), float64(r.peak)/(1<<20))
		if base != nil && base.asked > 0 {
			if !o.direct {
				bAll, bAns := base.traffic.total(), base.traffic.answers()
				kib += fmt.Sprintf(" (%s · %s)", ratio(float64(all.Body), float64(bAll.Body)), ratio(float64(answers.Body), float64(bAns.Body)))
				req += fmt.Sprintf(" (%s · %s)", ratio(float64(all.Requests), float64(bAll.Requests)), ratio(float64(answers.Requests), float64(bAns.Requests)))
			}
			cpu += fmt.Sprintf(" (%s)", ratio(float64(r.cpu), float64(base.cpu)))
			if !r.together {
				agent += fmt.Sprintf(" (%s)", ratio(float64(r.agent), float64(base.agent)))
			}
			rss += fmt.Sprintf(" (%s / %s)", ratio(float64(r.rss), float64(base.rss)), ratio(float64(r.peak), float64(base.peak)))
		}
		if r.together {
			agent += " (shared)"
		}
		cells = append(cells, file, served, kib, req, cpu, agent, rss)
		fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
	}
	fmt.Fprintln(w)
	maxConns := 0
	for _, r := range results {
		maxConns = max(maxConns, r.maxConns)
	}
	what := "each one instance of one service moved to a new port"
	switch o.change {
	case changeAdd:
		what = "each a new instance of one service registered at a new port"
	case changeRemove:
		what = "each one instance of one service deregistered (change → file: until its address is no server that takes traffic in its service's backend; " +
			"the built-in drains it, its slot disabled; not probed through HAProxy, where a drained server still answers its connections)"
	}
	fmt.Fprintf(w, "%d changes %v apart on a fixed schedule (seed %d), %s; every tool with wait %s. "+
		"One Consul %s server per row on 127.0.0.1, its http_max_conns_per_client raised to %d (default 200): consul-template holds a blocking query, "+
		"and so a connection, per service plus one for the service list (S+1). File descriptor limit of every process: %d.\n",
		o.changes, o.interval, o.seed, what, waitLabel(o.wait), "1.14.11", maxConns, o.nofileInForce)
	fmt.Fprintln(w, "(×N): seamless's value over consul-template's in the same catalog and mode. "+
		"change → file: from the Consul write returning to the first read of the rendered file that holds the new address "+
		"(consul-template's destination; seamless's haproxy.cfg); the file is read on every inotify event for it, a stat every 100ms backs that up. "+
		"change → served (built-in, and consul-template + haproxy -D -sf, whose template routes by Host as the built-in does): "+
		"to the first request through the tool's HAProxy (a new connection every -poll) answered by the listener the instance moved to; "+
		"round robin reaches it within `instances` requests; (×N of ct + reload): the built-in's over consul-template + haproxy -D -sf's. "+
		"Consul KiB: response bodies as sent to the tool through its counting proxy, gzip-encoded when the tool asked (headers below); "+
		"answers: without the blocking queries that only ran out their wait (idle refresh). "+
		"tool CPU: utime+stime of the tool and the children it waited for (seamless: haproxy -c; consul-template: its command, "+
		"which for -sf includes the new daemon's parse of the configuration up to its fork), not HAProxy's master and workers (below). "+
		"Consul agent CPU: over the same window, including the benchmark's own writes. RSS: the tool's process after the changes; peak is VmHWM.")
	for _, r := range results {
		name := fmt.Sprintf("%s %s (%s)", r.size, r.tool.title, r.mode())
		if r.asked > 0 {
			t := r.traffic
			all := t.total()
			var classes []string
			for _, c := range pathClasses {
				if v := t.Class[c]; v.Requests > 0 {
					classes = append(classes, fmt.Sprintf("%s %d (%.1f KiB)", c, v.Requests, float64(v.Body)/1024))
				}
			}
			var kinds []string
			for k, v := range t.Kind {
				kinds = append(kinds, fmt.Sprintf("%s %d (%.1f KiB)", kindNames[k], v.Requests, float64(v.Body)/1024))
			}
			fmt.Fprintf(w, "- %s: %d/%d changes in the file (%d file reads)", name, len(r.rendered), r.asked, r.reads)
			if o.probes(r.tool) {
				fmt.Fprintf(w, ", %d/%d served (%d requests)", len(r.served), r.asked, r.probes)
			}
			if r.tool.serves() {
				fmt.Fprintf(w, "; whole catalog served %s after start", r.readyServed.Round(time.Millisecond))
			}
			switch {
			case r.unsettled:
				fmt.Fprintf(w, "; the Consul agent had not settled %s after start (the changes began then)", r.settled.Round(time.Millisecond))
			case r.settled > 0:
				fmt.Fprintf(w, "; the Consul agent settled %s after start (the changes began then)", r.settled.Round(time.Millisecond))
			}
			haproxyCPU := fmtMs(r.haproxy)
			if r.tool == toolCTReload {
				haproxyCPU = "not read (a daemon per change)"
			}
			fmt.Fprintf(w, "; catalog registered in %s, whole catalog in the file %s after start; over %s: requests by path %s; answers %s; "+
				"%d of %d answers gzip (%d asked for it); headers %.1f KiB; connections to the proxy: %d opened during the changes, at most %d open; "+
				"tool CPU %s, HAProxy CPU %s (not in the tool's); RSS when loaded %.1f MiB (peak by then %.1f)",
				r.register.Round(time.Millisecond), r.ready.Round(time.Millisecond), r.window.Round(time.Millisecond),
				strings.Join(classes, ", "), strings.Join(kinds, ", "), t.Gzip, all.Requests, t.AcceptGzip,
				float64(all.Header)/1024, t.Conns, t.PeakOpen, fmtMs(r.cpu), haproxyCPU, float64(r.rssLoaded)/(1<<20), float64(r.peakLoaded)/(1<<20))
			if r.applies != "" {
				fmt.Fprintf(w, "; applies: %s", r.applies)
			}
			fmt.Fprintln(w)
		}
		if r.logs != "" {
			fmt.Fprintf(w, "- %s: %s\n", name, r.logs)
		}
		if r.err != nil {
			first, _, _ := strings.Cut(r.err.Error(), "\n")
			fmt.Fprintf(w, "- %s error: %s\n", name, first)
		}
	}
}

// waitLabel is -wait as the footnote says it: 0, or min:max.
func waitLabel(w config.Wait) string {
	if w == (config.Wait{}) {
		return "0"
	}
	return w.String()
}

func (r peerResult) mode() string {
	if r.together {
		return "together"
	}
	return "alone"
}

// answers is the traffic less the idle refreshes.
func (c proxyCounts) answers() traffic {
	return c.Kind[kindFirst].add(c.Kind[kindChange])
}

// peerServedBaseline is the consul-template + reload row r's change →
// served compares with: the built-in's only, and only when that row
// served every change (percentiles of the changes it did serve would
// flatter it).
func peerServedBaseline(results []peerResult, r peerResult) *peerResult {
	if r.tool != toolBuiltin {
		return nil
	}
	for i, b := range results {
		if b.tool == toolCTReload && b.size == r.size && b.together == r.together && b.asked > 0 && len(b.served) == b.asked {
			return &results[i]
		}
	}
	return nil
}

// peerBaseline is consul-template's row for r's catalog and mode; nil for
// consul-template's own row or when it did not run.
func peerBaseline(results []peerResult, r peerResult) *peerResult {
	if r.tool == toolCT {
		return nil
	}
	for i, b := range results {
		if b.tool == toolCT && b.size == r.size && b.together == r.together && len(b.rendered) > 0 {
			return &results[i]
		}
	}
	return nil
}

// ratio formats a/b as "12×", "1.4×", "0.04×"; "–" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	switch x := a / b; {
	case x >= 10:
		return fmt.Sprintf("%.0f×", x)
	case x >= 0.1:
		return fmt.Sprintf("%.1f×", x)
	default:
		return fmt.Sprintf("%.2f×", x)
	}
}

// fmtMsN formats d in milliseconds without the unit: "8.4", "748".
func fmtMsN(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms >= 100 {
		return fmt.Sprintf("%.0f", ms)
	}
	return fmt.Sprintf("%.1f", ms)
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
