// Package consul is the Consul discovery source: it answers the queries the
// templates want (model.Wanter) from Consul's catalog, health checks and KV
// store, with blocking queries, and reports how it is doing
// (model.Reporter).
//
// # The request budget
//
// consul-template and Prometheus watch a catalog with one blocking query
// for the list of services plus one per service: N+1 queries held open for
// N services, and a change wakes the watchers of everything it touches. Here
// the whole catalog of a datacenter is one blocking query on
//
//	GET /v1/internal/ui/nodes?dc=<dc>&index=<i>&wait=<WaitTime>[&stale]
//
// which the Consul web UI uses. Its answer is every node with all of its
// services and health checks (Internal.NodeDump), and it blocks on the
// catalog's index over the nodes, services and checks tables, so it returns
// once per change to any of them (Consul 1.14: agent/consul/state
// NodeDump). So for N services:
//
//   - one query is held open per catalog query wanted (normally one: the
//     local datacenter), independent of N;
//   - a change anywhere in the catalog costs one request (the query
//     returns and is issued again); changes that land together cost one;
//   - the price is bytes: each answer is the whole catalog, O(N), where
//     per-service watches would fetch only the service that changed. The
//     servers build it from memory; a burst of changes is coalesced
//     because a watch issues at most one request per minInterval.
//
// The endpoint is internal, so not covered by Consul's API compatibility
// promise, but it has existed with this shape since Consul's first UI and is
// served whether or not the agent's UI is enabled. If it answers 404 (a
// newer Consul, or a proxy that only lets public endpoints through) the
// watch falls back to public endpoints, logged once as a warning: blocking
// queries on /v1/catalog/nodes, /v1/catalog/services and
// /v1/health/state/any (three held open, still independent of N), and on any
// change a re-list of those three and one /v1/health/service/<name> per
// service, then the three blocking queries again: N+6 requests per change.
// Correct, but the budget is lost, which is why it is only the fallback.
//
// The datacenter name of the local catalog is not in the dump: when neither
// the query nor Config.Datacenter names it, it is read once per watch from
// /v1/catalog/node/<a node of the dump>.
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
// `service_prefix "" { policy = "read" }`. The second also covers the node
// checks, which Consul files under the empty service name: without it the
// dump silently leaves them out and a node's failing serfHealth check would
// not mark its instances critical. Whatever the token may not read is left
// out of the answer (not an error); the source logs a warning when Consul
// says it filtered something. KV needs key:read (`key_prefix "<prefix>"`),
// the datacenter list none. The same rights serve the fallback.
//
// # Delivery
//
// Each watch keeps the last good answer to its query. A failing request is
// retried with exponential backoff and jitter (250 ms up to 10 s, reset by a
// success) and never removes data from a snapshot. Run sends a snapshot
// whenever the answers change, coalescing: a slow consumer gets only the
// newest state, and no watch ever waits for it. Index handling follows
// Consul's advice for blocking queries: an index that goes backwards (a
// restored or restarted server, a stale read from another server) starts
// the watch over and is logged, an index of 0 is never waited on, and the
// request after a failure reads at once rather than block on an index that
// a Consul restarted with less data would not reach for a long time.
//
// # Staleness
//
// A blocking query waits at most Config.WaitTime (1 minute), plus Consul's
// jitter of up to 1/16; every request's deadline adds Config.Margin (15 s).
// A query that has not answered within that makes the source stale:
// Status says which query and since when, a warning is logged, and the
// last good answer keeps serving.
package consul
