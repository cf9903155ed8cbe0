// Package consul is the Consul discovery source: it answers the queries the
// templates want (model.Wanter) from Consul's catalog, health checks and KV
// store, with blocking queries, and reports how it is doing
// (model.Reporter).
//
// # The request budget
//
// A catalog of a datacenter is watched with public endpoints, as Consul
// recommends for many watchers (and as consul-template does):
//
//	GET /v1/catalog/services          which services exist, with their tags
//	GET /v1/catalog/nodes             the node list (Catalog.Nodes)
//	GET /v1/health/service/<name>     per service: instances, node and service checks
//
// each a blocking query (&index=<i>&wait=<WaitTime>[&stale]). A health
// query is started when its service appears (with Config.TagFilter, only
// for services whose tags include it, and the query filters by the tag)
// and stopped when it is gone. With Config.Wanted, only for the services
// it takes, judged from the service list's tags (each service's union
// over its instances, so the answer moves when a tag is added or
// removed): the others are left out of the catalog, in every mode below
// alike (narrow.go), and do not count against the budget. On the local agent a blocking health query
// is served from the agent's streaming view (Consul 1.10+,
// use_streaming_backend, on by default); it needs no parameter: the
// agent takes that path for any request with an index (Consul 1.14
// agent/rpcclient/health). Its first read, and a read afresh after a
// failure, wait on index 1 (any answer passes it) to stay on that path:
// one without an index is forwarded to the leader, which after a leader's
// death held it for the servers' 10 s dial to the dead address while the
// view had caught up within a second. Each service's answer is converted once per
// change of that service and cached; the Catalog is put together from the
// cached parts, so a change to one instance costs one request and one
// service's bytes (a check change does not move the service list), and a
// change to a node check wakes the services of that node. The view is
// not always the cluster's (it lags after a partition, and goes back to
// an older state when it resubscribes to a server still applying its
// log): after a failure, and when an answer is below what was passed on,
// the service is read from the leader and the view is followed again only
// once it has caught up (viewcheck.go).
//
// The start (seed.go): with many services to watch (defaultSeedAt, and at
// least half of those listed), the first answer of every health query
// comes from one read of the node dump (below), and each query starts
// waiting on the dump's index: a blocking query answers once its
// service's index passes the one it waits on, and the dump's is the Raft
// index of its read, so each answers at its service's next change (one
// made between the read and the query's start included, and at once on
// the streaming view too: measured on 1.14.11) rather than S answers at
// once. A seeded query's first answer below the dump's index is its wait
// running out, not a reset. A read afresh (after a failure or a reset)
// is not seeded. With Config.Serving the seeded queries start only once
// HAProxy serves: the agent's set-up of a view per query (about 1 ms of
// CPU each) would otherwise share the machine with HAProxy's first start.
// They are set up 16 at a time (starter.go), as are the queries going on
// after a backoff when the agent is back: each takes a goroutine until
// its request is written, and then waits parked where the connection
// allows.
//
// Connections: S+2 blocking queries per datacenter for S watched services, each
// one HTTP/1.1 connection, kept open and reused (the transport keeps that
// many idle). An agent allows 200 per client address by default
// (http_max_conns_per_client), so the catalog holds at most Config.Watches
// (SEAMLESS_CONSUL_WATCHES, default 128) queries. With more services than
// that allows, the catalog is read with one blocking query on
//
//	GET /v1/internal/ui/nodes?dc=<dc>&index=<i>&wait=<WaitTime>[&stale]
//
// the node dump Consul's web UI reads: one connection, one request per
// change anywhere, but each answer is the whole catalog, O(S) bytes. The
// switch is logged once as a warning naming the count, the budget and the
// settings to raise; once the services fit again with an eighth of the
// budget to spare, the catalog is watched per service again, logged at
// info. Neither switch drops data: the last answer serves until the other
// mode has answered in full.
//
// The node dump is internal, so not covered by Consul's API compatibility
// promise. If it answers 404 (a newer Consul, or a proxy that only lets
// public endpoints through) the watch falls back to public endpoints,
// logged once as a warning: blocking queries on /v1/catalog/nodes,
// /v1/catalog/services and /v1/health/state/any (three held open), and on
// any change a re-list of those three and one /v1/health/service/<name>
// per service: N+6 requests per change. The datacenter name of the local
// catalog is not in the dump: when neither the query nor Config.Datacenter
// names it, it is read once per watch from /v1/catalog/node/<a node>.
//
// KV: one blocking query per distinct key or prefix wanted (/v1/kv/<key>,
// with ?recurse for a prefix), bounded by the templates, not by the number
// of services. The list of datacenters (/v1/catalog/datacenters) cannot
// block; it is polled every 30 s, only while it is wanted.
//
// # ACLs
//
// The token (CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE) needs, for a
// catalog, node:read and service:read on everything to be discovered: in
// policy terms `node_prefix "" { policy = "read" }` and
// `service_prefix "" { policy = "read" }`, for the per-service health
// queries as for the node dump. The second also covers the node checks,
// which Consul files under the empty service name: without it they are
// silently left out and a node's failing serfHealth check would not mark
// its instances critical. Whatever the token may not read is left
// out of the answer (not an error); the source logs a warning when Consul
// says it filtered something. KV needs key:read (`key_prefix "<prefix>"`),
// the datacenter list none. The same rights serve the fallback.
//
// # Delivery
//
// Each watch keeps the last good answer to its query. A failing request is
// retried with exponential backoff and jitter (250 ms up to 10 s, reset by a
// success; each per-service query retries on its own, and waits out its
// backoff with no goroutine, as a held query waits) and never removes
// data from a snapshot. Run sends a snapshot whenever an answer changed (a
// counter, not a comparison of catalogs), coalescing: a slow consumer gets only the
// newest state, and no watch ever waits for it. Index handling follows
// Consul's advice for blocking queries: an index that goes backwards (a
// restored or restarted server, a stale read from another server) starts
// the watch over and is logged, an index of 0 is never waited on, and the
// request after a failure reads at once rather than block on an index that
// a Consul restarted with less data would not reach for a long time.
//
// One probe per source asks the agent for its leader (/v1/status/leader,
// one small request every 5 s, every second while a query is backed off
// or the agent names none; probe.go). While it fails the source is stale,
// within seconds of an agent losing its servers even while a blocking
// query in flight waits out its minute. When the agent names a leader
// again, every backed-off query retries at once: the source follows
// within about a second of the agent's return instead of after the
// longest backoff, and the backoffs keep their length, so an outage costs
// no more retries. After an agent could not reach its servers at all
// (two failed probes at least), every read in flight also starts afresh
// (its connection or stream may be broken); an election alone leaves
// them be.
//
// # Staleness
//
// A blocking query waits at most Config.WaitTime (5 minutes, Consul's
// default), plus Consul's jitter of up to 1/16; every request's deadline
// adds Config.Margin (15 s). A query that has not answered within that
// makes the source stale: Status says which query and since when, a
// warning is logged, and the last good answer keeps serving. A frozen or
// cut-off agent is noticed sooner, by the probe (above); the wait only
// sets what an idle catalog costs: each watched query answered once per
// wait. An answer is stale too when the server
// that gave it last heard from its leader longer than Config.MaxStale ago
// (X-Consul-LastContact) or knows no leader (X-Consul-KnownLeader): the
// client's transport turns it into an error, so every kind of query keeps
// its last good answer, reads afresh and retries after a backoff.
//
// # Connections
//
// Every blocking query held is a connection held (an agent allows 200 per
// client address by default, hence Config.Watches). Over plain HTTP and
// unix sockets the source's client holds each on its caller's goroutine
// alone (holdconn.go): net/http's Transport would add a reader and a
// writer goroutine and their buffers per connection, 3,000 goroutines and
// 22 MiB of stacks at 1,000 services. HTTPS stays on net/http, which
// speaks HTTP/2 with Consul's HTTPS listener: up to 250 queries share a
// connection.
//
// # Several agents
//
// With Config.Agents, the one api.Client of the source (every watch) sends
// through a transport that moves to the next agent when the current one
// cannot be reached, and returns to the first once it names a leader
// again (failover.go). Indexes are the cluster's: a move between agents
// of one cluster keeps them, and the rule for an index that went
// backwards covers a move to anything else.
package consul
