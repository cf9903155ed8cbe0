package routes

import (
	"errors"
	"fmt"
	"path/filepath"
)

// httpsFrontend is the validated HTTPS frontend.
type httpsFrontend struct {
	bind    bind
	crtList string
	acmeMap string
	hosts   func([]string)
}

func (o Options) httpsFrontend(httpPort, statsPort int) (*httpsFrontend, error) {
	b, err := parseBind(o.HTTPSBind)
	switch {
	case err != nil:
		return nil, fmt.Errorf("SEAMLESS_HTTPS_BIND: %w", err)
	case b.port == httpPort:
		return nil, fmt.Errorf("SEAMLESS_HTTPS_BIND: port %d is SEAMLESS_HTTP_BIND's too", b.port)
	case b.port == statsPort:
		return nil, fmt.Errorf("SEAMLESS_HTTPS_BIND: port %d is SEAMLESS_STATS_BIND's too", b.port)
	case o.CrtList == "" || !filepath.IsAbs(o.CrtList):
		return nil, errors.New("SEAMLESS_HTTPS_BIND: the HTTPS frontend needs an absolute crt-list path (internal error)")
	case o.ACMEMap != "" && !filepath.IsAbs(o.ACMEMap):
		return nil, errors.New("SEAMLESS_ACME_EMAIL: the ACME challenge map needs an absolute path (internal error)")
	}
	return &httpsFrontend{bind: b, crtList: o.CrtList, acmeMap: o.ACMEMap, hosts: o.Hosts}, nil
}

// reserve adds the HTTPS port to the ports no seamless.tcp.port may take.
func (b bind) reserve(reserved map[int]string) {
	if b.tls != nil {
		reserved[b.tls.bind.port] = "SEAMLESS_HTTPS_BIND"
	}
}

// viewHTTPS is the HTTPS part of the view; Bind "" means no HTTPS frontend.
type viewHTTPS struct {
	Bind     string
	CrtList  string
	ACMEMap  string          // "" without ACME
	redirect map[string]bool // HTTP backends that send plain HTTP to HTTPS
}

// Redirect reports whether backend sends plain HTTP requests to HTTPS
// (seamless.http.tls=redirect). Without an HTTPS frontend nothing does: a
// redirect would lead nowhere.
func (h viewHTTPS) Redirect(backend string) bool { return h.redirect[backend] }

// setHTTPS fills v.HTTPS from the renderer's HTTPS frontend and the routes.
func (v *view) setHTTPS(http bind, rt Routes) error {
	if http.tls == nil {
		return nil
	}
	v.HTTPS = viewHTTPS{Bind: http.tls.bind.String(), CrtList: http.tls.crtList, ACMEMap: http.tls.acmeMap, redirect: map[string]bool{}}
	for _, s := range rt.Services {
		if s.Redirect && s.HTTPBackend != "" {
			v.HTTPS.redirect[s.HTTPBackend] = true
		}
	}
	return errors.Join(check("bind", bindRe, v.HTTPS.Bind), check("crt-list", fileRe, v.HTTPS.CrtList), v.checkACMEMap())
}
