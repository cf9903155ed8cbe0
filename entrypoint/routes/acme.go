package routes

import (
	"slices"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// checkACMEMap checks the challenge map's path like the crt-list's: it
// goes into the configuration unquoted.
func (v *view) checkACMEMap() error {
	if v.HTTPS.ACMEMap == "" {
		return nil
	}
	return check("acme map", fileRe, v.HTTPS.ACMEMap)
}

// commitHosts tells the HTTPS frontend's Hosts callback which exact hosts
// the running configuration routes. f may be nil (no HTTPS frontend).
func (f *httpsFrontend) commitHosts(routes []model.Route) {
	if f == nil || f.hosts == nil {
		return
	}
	f.hosts(exactHosts(routes))
}

// exactHosts lists, sorted and once each, the exact hosts of routes
// (statusRoutes' "host H path P"). Wildcards are left out: HTTP-01 cannot
// prove them.
func exactHosts(routes []model.Route) []string {
	var out []string
	for _, r := range routes {
		f := strings.Fields(r.Match)
		if len(f) >= 2 && f[0] == "host" && !strings.HasPrefix(f[1], "*.") {
			out = append(out, f[1])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
