// Package routes is seamless's built-in configuration, used when
// SEAMLESS_TEMPLATE is not set: as with Traefik, tags on the services make
// a working load balancer, with no template to write.
//
// # Tags
//
// Any source's instances may carry them (Consul tags; Docker labels and
// service files map onto the same strings):
//
//	seamless.http.host=<host>   route requests for this Host to the service;
//	                            may repeat. Matched without case and without
//	                            the Host header's :port. "*.example.com"
//	                            matches every name under example.com (at any
//	                            depth, not example.com itself). An IPv4
//	                            address is accepted too.
//	seamless.http.path=<prefix> only requests whose path starts with these
//	                            segments ("/api" matches /api and /api/x, not
//	                            /apix); may repeat, and combines with every
//	                            host tag of the instance. Without a host tag
//	                            it applies to any host; "seamless.http.path=/"
//	                            alone makes the service the catch-all.
//	seamless.tcp.port=<port>    a TCP frontend on this port (on the host of
//	                            SEAMLESS_HTTP_BIND), forwarding to the
//	                            instances; may repeat.
//	seamless.http.tls=redirect  plain HTTP requests for the service get a 308
//	                            to https:// (method and body kept), when the
//	                            HTTPS frontend is on (SEAMLESS_HTTPS_BIND);
//	                            any instance of the service asking is enough.
//
// The HTTPS frontend, when on, routes exactly like the HTTP one (the rules
// are one template define used by both), with the certificates of a
// crt-list that the certs package keeps. With ACME (Options.ACMEMap) the
// HTTP frontend first answers /.well-known/acme-challenge/TOKEN from a map
// the certs package fills over the runtime API, and Options.Hosts learns
// the exact hosts routed once HAProxy runs them.
//
// A service's routes are the union of its instances' tags, whatever their
// health; its servers are the instances that pass the health filter
// (SEAMLESS_CONSUL_HEALTH), at their own address and port, weighted by
// their registration (Consul's Weights; 1 when unset). A routed service
// with no such instance answers 503, rather than its requests falling to
// another rule. There is no weight tag: the weight is the registration's.
//
// HAProxy tries the HTTP rules from the most specific host (exact names,
// then wildcards from the longest, then rules for any host), and within a
// host from the longest path. A request no rule matches gets 503 "No
// service is routed for this host and path". Services without any
// seamless.* tag are not routed.
//
// Everything is validated: service names, hosts, paths, ports, addresses
// (IPv4, IPv6, DNS names; a name that does not resolve leaves its server
// disabled, not the configuration broken) and weights (1–256). What cannot
// be used is left out and reported (Rendering.Skipped) in words naming the
// service and instance; the rest applies. Instances pass
// model.CheckInstance, the rule user templates get too. An instance is
// routed with all of its seamless.* tags or not at all: one invalid or
// unknown seamless.* tag leaves it out, so that a bad tag never leaves a
// wider route behind. When two services claim the same host and path, or
// the same TCP port, the one registered first keeps it (source precedence,
// then model.Instance.Registered, then name) and the other is told so,
// naming the holder. Backend names ("http-<service>", "tcp-<service>") and
// server names (the instance ID) go through Ident, so they contain only
// characters HAProxy accepts and stay the same from one render to the next.
//
// # Also in the configuration
//
// HAProxy's stats page at /haproxy?stats and its Prometheus exporter at
// /metrics on SEAMLESS_STATS_BIND (":8404"; empty disables both). The
// exporter is inside `.if feature(PROMEX)`: a HAProxy built without it
// (`haproxy -vv | grep -i prom`) still loads the configuration, and
// /metrics is then not served. Debian's and the official images' HAProxy
// have it. Logs go to stderr with one line per request (option httplog,
// tcplog), except for the stats frontend. option idle-close-on-response
// keeps keep-alive clients safe across reloads; seamless adds
// hard-stop-after and mworker-max-reloads itself.
//
// # Example: three replicas behind one frontend
//
// The classic setup (and `make demo`'s): three replicas of a web service
// behind one HTTP frontend on port 5001, the stats page at
// http://127.0.0.1:8404/haproxy?stats. Three instances and two tags each:
//
//	SEAMLESS_HTTP_BIND=127.0.0.1:5001 SEAMLESS_STATS_BIND=127.0.0.1:8404
//
//	service web, instance web1 at 127.0.0.1:9001, tags seamless.http.host=localhost seamless.http.host=127.0.0.1
//	service web, instance web2 at 127.0.0.1:9002, the same tags
//	service web, instance web3 at 127.0.0.1:9003, the same tags
//
// render (testdata/classic.cfg, which `haproxy -c` checks):
//
//	frontend http
//	    bind 127.0.0.1:5001
//	    ...
//	    use_backend http-web if { var(txn.host) -m str 127.0.0.1 }
//	    use_backend http-web if { var(txn.host) -m str localhost }
//	    default_backend no-route
//
//	frontend stats
//	    bind 127.0.0.1:8404
//	    ...
//	    stats uri /haproxy?stats
//
//	backend http-web
//	    balance roundrobin
//	    server web1 127.0.0.1:9001 weight 1
//	    server web2 127.0.0.1:9002 weight 1
//	    server web3 127.0.0.1:9003 weight 1
//
// With seamless.http.path=/ instead of the host tags, web serves every
// Host (it becomes the default backend).
package routes
