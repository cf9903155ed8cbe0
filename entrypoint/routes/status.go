package routes

import (
	"strconv"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// statusRoutes lists rt's routes for /status: the HTTP rules in the order
// HAProxy tries them, then the TCP ports.
func statusRoutes(rt Routes) []model.Route {
	out := make([]model.Route, 0, len(rt.Rules)+len(rt.Listeners))
	for _, r := range rt.Rules {
		out = append(out, model.Route{Match: r.String(), Service: r.Service, Backend: r.Backend})
	}
	for _, l := range rt.Listeners {
		out = append(out, model.Route{Match: "tcp port " + strconv.Itoa(l.Port), Service: l.Service, Backend: l.Backend})
	}
	return out
}
