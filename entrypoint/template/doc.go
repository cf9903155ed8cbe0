// Package template renders user templates (SEAMLESS_TEMPLATE) written for
// consul-template: the same Go template syntax, the same function names,
// argument forms and result fields, rendered from a model.State instead of
// from live Consul queries.
//
// Parse reads a template and checks it once: a call of a consul-template
// function that seamless does not provide (Vault, Connect, Nomad, plugins,
// writing files; FUNCTIONS.md lists every function with its status) fails
// there with an *UnsupportedError naming the function, file, line and
// reason, and a literal argument that can never parse (`service "a|b"`)
// with an *ArgError. Nothing renders partly.
//
// (*Template).Render is a pure function of the State and of the files
// `file` reads: the same inputs give the same bytes. Functions that need
// Consul data record the model.Query they read in Rendering.Queries. A
// query the State has no answer for yet is also recorded in
// Rendering.Missing and the function returns its zero value, as
// consul-template does before its data arrives; the caller must not apply
// such a rendering, fetches the missing queries and renders again.
// A Template keeps what the last render made (fragment.go): the body of
// a `range services` that reads only its item and `service` is executed
// again only for the services whose item or instances changed. The output
// is the same as a render from nothing.
// Catalog functions without "@dc" read model.LocalCatalog, the catalog
// merged from every source (Consul, Docker, files); with "@dc" they read
// Query{Kind: QueryCatalog, Datacenter: dc}.
//
// Where consul-template's behaviour cannot be kept as is:
//
//   - `key` on an absent key, and `safeLs`/`safeTree` on an empty prefix,
//     make consul-template wait silently; here they are render errors
//     (naming the key), so the running configuration stays and the log
//     says why. Missing only ever means "not fetched yet".
//   - `node` without a name is Options.NodeName (default: the hostname,
//     also a local Consul agent's default node name), and a node the
//     catalog does not have is nil rather than an empty node.
//   - `~near` is accepted and ignored: seamless has no network
//     coordinates, so results keep consul-template's sorted order.
//   - `?ns=`, `?partition=` and `?peer=` are refused: the model has no
//     namespaces.
//   - `datacenters true` asks for Query{Kind: QueryDatacenters, Key:
//     DatacentersIgnoreInaccessible}.
//   - `file` reads the file at every render, so an edit is picked up by
//     the next render (consul-template watches the file and renders at
//     once).
//   - `timestamp` and `sprig_now` return Options.Now (the time of Parse by
//     default), not the clock: a clock would change every rendering and
//     reload HAProxy for nothing. Random and clock-reading sprig functions
//     are refused for the same reason.
//   - `loop` returns an iterator instead of a channel fed by a goroutine.
//   - `parseYAML` yields string-keyed maps; `containsAll` and friends, and
//     `join`, accept any list.
//
// Every string in the State is untrusted (names, tags, meta, addresses, KV
// values): the classic `server {{.Node}} {{.Address}}:{{.Port}}` renders
// unchanged for compatibility, but a template meant for untrusted data
// passes names through haproxyName, arguments through haproxyQuote and
// checks addresses with validAddr (see haproxy.go); rendered that way, no
// value can add a line or a directive to the configuration.
package template
