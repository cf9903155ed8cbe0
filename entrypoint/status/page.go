package status

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/metrics"
)

// RefreshSeconds is how often the page at / reloads itself.
const RefreshSeconds = 5

//go:embed page.html
var pageSource string

// page is parsed once; html/template escapes every value for its context,
// so a source's error or a service name cannot become markup.
var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"clock":   clock,
	"ago":     ago,
	"until":   until,
	"seconds": seconds,
	"short":   short,
	"size":    size,
	"howClass": func(how string) string {
		switch how {
		case metrics.Runtime, metrics.Reloaded, metrics.Unchanged, metrics.Refused, metrics.Failed:
			return how
		}
		return "other"
	},
	"refresh":     func() int { return RefreshSeconds },
	"stateClass":  stateClass,
	"healthClass": healthClass,
	"reloadClass": func(result string) string {
		switch result {
		case ReloadOK:
			return "ok"
		case ReloadRefused:
			return "warn"
		}
		return "bad"
	},
}).Parse(pageSource))

// servePage answers GET / with the Report as a page.
func (c checks) servePage(p Provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rep := c.report(r.Context(), p)
		var b bytes.Buffer
		if err := page.Execute(&b, rep); err != nil {
			http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		// No script, no frame, nothing from elsewhere: should escaping
		// ever miss, the browser still runs nothing.
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		_, _ = b.WriteTo(w)
	}
}

// clock shows t in UTC, to the second; "—" when unknown.
func clock(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago is how long before now t was, roughly; "" when unknown.
func ago(now, t time.Time) string {
	if t.IsZero() || now.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

// until is how long after now t is, roughly: "in 89d", "expired 2d ago".
func until(now, t time.Time) string {
	if t.IsZero() || now.IsZero() {
		return ""
	}
	if t.Before(now) {
		return "expired " + ago(now, t)
	}
	d := t.Sub(now)
	switch {
	case d < time.Hour:
		return fmt.Sprintf("in %dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("in %dh", int(d/time.Hour))
	}
	return fmt.Sprintf("in %dd", int(d/(24*time.Hour)))
}

// seconds shows a duration given in seconds with a sensible unit.
func seconds(s float64) string {
	switch {
	case s < 0.001:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

// short is the start of a digest, enough to tell two apart by eye.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}

func size(n int64) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1024*1024:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1024*1024))
}

// stateClass colours HAProxy's server state: "UP 1/3", "MAINT (via
// web/s1)", "no check".
func stateClass(state string) string {
	word, _, _ := strings.Cut(state, " ")
	switch word {
	case "UP", "OPEN":
		return "st-up"
	case "DRAIN", "NOLB":
		return "st-drain"
	case "MAINT":
		return "st-maint"
	case "DOWN":
		return "st-down"
	}
	return "none"
}

// healthClass colours a source's health.
func healthClass(h string) string {
	switch h {
	case "passing":
		return "ok"
	case "warning":
		return "warn"
	case "critical":
		return "bad"
	}
	return "none"
}
