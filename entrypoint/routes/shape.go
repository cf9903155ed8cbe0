package routes

import (
	"fmt"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// shapedView is what of a view follows the routes alone (not their
// servers), kept while the routes keep their shape (Routes.shape): a
// change of servers makes none of it again.
type shapedView struct {
	shape     *assembly // nil: made for routes without one, not kept
	rules     []viewRule
	hostMap   *hostMap // nil: every host has its rule
	def       string
	listeners []viewListener
	https     viewHTTPS
	routes    []model.Route // statusRoutes
	err       error
}

// shape fills r.shaped for rt, checking its strings, unless it holds rt's
// shape already.
func (r *Renderer) shape(rt Routes) {
	if rt.shape != nil && r.shaped.shape == rt.shape {
		return
	}
	sv := shapedView{shape: rt.shape, def: "no-route", routes: statusRoutes(rt)}
	var errs []error
	for _, rule := range rt.Rules {
		errs = append(errs, r.checked.check("backend", identRe, rule.Backend))
		if rule.CatchAll() {
			sv.def = rule.Backend
			continue
		}
		vr := viewRule{Backend: rule.Backend}
		if rule.Host != "" {
			vr.HostMatch, vr.Host = "str", rule.Host
			if suffix, ok := strings.CutPrefix(rule.Host, "*"); ok {
				vr.HostMatch, vr.Host = "end", suffix
			}
			errs = append(errs, r.checked.check("host", hostRe, vr.Host))
		}
		if rule.Path != "/" {
			vr.Path = rule.Path + "/"
			errs = append(errs, r.checked.check("path", pathRe, vr.Path))
		}
		sv.rules = append(sv.rules, vr)
	}
	if sv.rules, sv.hostMap = mapHosts(sv.rules, r.mapDir, r.mapMin); sv.hostMap != nil {
		errs = append(errs, r.checked.check("hosts map", fileRe, sv.hostMap.path))
	}
	var v view
	errs = append(errs, v.setHTTPS(r.http, rt))
	sv.https = v.HTTPS
	for _, l := range rt.Listeners {
		vl := viewListener{Name: fmt.Sprintf("tcp-%d", l.Port), Bind: r.http.hostPort(l.Port), Backend: l.Backend}
		errs = append(errs, r.checked.check("bind", bindRe, vl.Bind), r.checked.check("backend", identRe, vl.Backend))
		sv.listeners = append(sv.listeners, vl)
	}
	for _, s := range rt.Services { // the backends' names, part of the shape
		for _, b := range [2]string{s.HTTPBackend, s.TCPBackend} {
			if b != "" {
				errs = append(errs, r.checked.check("backend", identRe, b))
			}
		}
	}
	for _, err := range errs {
		if err != nil {
			sv.err = err // the first that failed
			break
		}
	}
	r.shaped = sv
}
