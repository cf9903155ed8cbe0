// Package model holds the types every part of discovery shares: what a
// source reports (Snapshot), what templates ask Consul for (Query), and the
// merged view they render from (State). It imports nothing of seamless.
package model

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Health states of an instance, as Consul names them. An instance's status
// is the worst of its node's and its own checks, in this order of
// precedence: maintenance, critical, warning, passing.
const (
	StatusPassing     = "passing"
	StatusWarning     = "warning"
	StatusCritical    = "critical"
	StatusMaintenance = "maintenance"
)

// Node is a machine in a catalog (a Consul node; the host of a file or
// Docker source).
type Node struct {
	ID              string            `json:"id,omitempty"`
	Name            string            `json:"name"`
	Address         string            `json:"address"`
	Datacenter      string            `json:"datacenter,omitempty"`
	TaggedAddresses map[string]string `json:"tagged_addresses,omitempty"`
	Meta            map[string]string `json:"meta,omitempty"`
}

// Check is one health check of an instance or of its node.
type Check struct {
	Node        string `json:"node,omitempty"`
	CheckID     string `json:"check_id"`
	Name        string `json:"name,omitempty"`
	Status      string `json:"status"`
	Notes       string `json:"notes,omitempty"`
	Output      string `json:"output,omitempty"`
	ServiceID   string `json:"service_id,omitempty"`
	ServiceName string `json:"service_name,omitempty"`
}

// Instance is one instance of a service, with every health state: filters
// (SEAMLESS_CONSUL_HEALTH, a template's `service "web|any"`) apply later.
// Every string in it comes from outside and is untrusted.
type Instance struct {
	Source              string            `json:"source"`
	Datacenter          string            `json:"datacenter,omitempty"`
	Node                string            `json:"node,omitempty"`
	NodeID              string            `json:"node_id,omitempty"`
	NodeAddress         string            `json:"node_address,omitempty"`
	NodeTaggedAddresses map[string]string `json:"node_tagged_addresses,omitempty"`
	NodeMeta            map[string]string `json:"node_meta,omitempty"`
	ID                  string            `json:"id"`   // unique within the service and source
	Name                string            `json:"name"` // the service's name
	Kind                string            `json:"kind,omitempty"`
	Namespace           string            `json:"namespace,omitempty"`
	// Address is the instance's own address, already defaulted to the
	// node's when the registration has none (as Consul's health endpoint
	// leaves it to the client).
	Address         string            `json:"address"`
	Port            int               `json:"port"`
	Tags            []string          `json:"tags,omitempty"`
	Meta            map[string]string `json:"meta,omitempty"`
	TaggedAddresses map[string]string `json:"tagged_addresses,omitempty"`
	// Weight for a passing instance, WarningWeight for a warning one; 0
	// means unset (HAProxy's default, 1).
	Weight        int     `json:"weight,omitempty"`
	WarningWeight int     `json:"warning_weight,omitempty"`
	Status        string  `json:"status"`           // of NodeChecks and Checks together
	Checks        []Check `json:"checks,omitempty"` // the instance's own
	// NodeChecks are its node's checks (Consul's serfHealth, a node's
	// maintenance), sorted, never written: the Consul source gives the
	// instances of a node one list. A template sees them before Checks.
	NodeChecks []Check `json:"node_checks,omitempty"`
	// Registered orders the registrations of one source, earliest lowest:
	// Consul's CreateIndex, a Docker container's creation time (Unix
	// nanoseconds), the file source's order of first sight. 0 is unknown
	// and orders after every known value. Values of two sources are never
	// compared: the sources' precedence (SEAMLESS_SOURCES) orders them.
	Registered uint64 `json:"registered,omitempty"`
}

// Catalog is one datacenter as a source sees it. A catalog is never
// written once made: successive catalogs of a source share what did not
// change.
type Catalog struct {
	Datacenter string `json:"datacenter,omitempty"`
	Nodes      []Node `json:"nodes,omitempty"`
	// Instances is the catalog as one list, as the sources that build it
	// whole make it (files, Docker) and tests write it. A catalog made by
	// PerService leaves it empty: read the instances through Services,
	// All or Len.
	Instances []Instance `json:"instances,omitempty"`
	// Index is the Consul (Raft) index the catalog is current as of: the
	// highest index among the latest answers it was assembled from. 0 for
	// sources without one. Not part of equality: a catalog that only
	// moved its index is the same.
	Index uint64 `json:"index,omitempty"`
	// services holds a PerService catalog's instances, one list per
	// service in order of name.
	services [][]Instance
}

// QueryKind says what a Query asks for.
type QueryKind string

const (
	// QueryCatalog: every node and instance of Datacenter ("" = local).
	QueryCatalog QueryKind = "catalog"
	// QueryKey: the KV pair at Key (`key`, `keyExists`, `keyOrDefault`).
	QueryKey QueryKind = "key"
	// QueryPrefix: every KV pair under Key (`ls`, `tree`).
	QueryPrefix QueryKind = "prefix"
	// QueryDatacenters: the names of all datacenters.
	QueryDatacenters QueryKind = "datacenters"
)

// Query is one piece of Consul data a template needs. It is comparable, so
// it keys maps. Datacenter "" is the agent's own.
type Query struct {
	Kind       QueryKind
	Datacenter string
	Key        string
}

func (q Query) String() string {
	s := string(q.Kind)
	if q.Key != "" {
		s += " " + q.Key
	}
	if q.Datacenter != "" {
		s += "@" + q.Datacenter
	}
	return s
}

// LocalCatalog is what the default template and every catalog function
// without "@dc" need.
var LocalCatalog = Query{Kind: QueryCatalog}

// KVPair is one key of Consul's KV store; Value is untrusted.
type KVPair struct {
	Key         string `json:"key"`
	Value       string `json:"value"`
	Flags       uint64 `json:"flags,omitempty"`
	CreateIndex uint64 `json:"create_index,omitempty"`
	ModifyIndex uint64 `json:"modify_index,omitempty"`
	LockIndex   uint64 `json:"lock_index,omitempty"`
	Session     string `json:"session,omitempty"`
}

// Result is the answer to one Query. For QueryKey, Pairs holds the pair or
// is empty when the key does not exist.
type Result struct {
	Catalog     *Catalog `json:"catalog,omitempty"`
	Pairs       []KVPair `json:"pairs,omitempty"`
	Datacenters []string `json:"datacenters,omitempty"`
}

// Snapshot is everything one source knows now. Each snapshot replaces every
// earlier one from the same source.
type Snapshot struct {
	Source string `json:"source"`
	// Results holds one entry per Query the source answered. File and
	// Docker sources answer only LocalCatalog; Consul answers what the
	// templates asked for (Consul.Want).
	Results map[Query]Result `json:"-"`
	// Reset is when the source last saw its backend start over with
	// less data (Consul's index went backwards: restarted empty, restored
	// from an old snapshot, a wiped agent); zero if never. What such a
	// source stops reporting soon after is more likely lost than removed,
	// and it may come back in pieces, one partial answer at a time.
	Reset time.Time `json:"-"`
}

// Local returns the source's local catalog, or nil.
func (s Snapshot) Local() *Catalog {
	return s.Results[LocalCatalog].Catalog
}

// Source discovers services. Run's contract:
//   - send a full snapshot first, then one whenever anything changes; each
//     replaces everything the source sent before;
//   - never close out; every send also selects on ctx.Done();
//   - retry failures inside, with backoff, and keep the last good data
//     rather than send an empty snapshot because a request failed;
//   - return when ctx ends.
//
// Configuration errors come from the constructor, never from Run.
type Source interface {
	Name() string
	Run(ctx context.Context, out chan<- Snapshot)
}

// Wanter is a Source that fetches only what it is asked for (Consul):
// Want replaces the set of queries to answer. It must not block.
type Wanter interface {
	Want(queries []Query)
}

// HealthFilter reports whether an instance with status passes a filter
// given as consul-template does: "passing", "passing,warning", "any".
// An empty filter means passing.
func HealthFilter(filter []string, status string) bool {
	if len(filter) == 0 {
		return status == StatusPassing
	}
	if slices.Contains(filter, "any") {
		return true
	}
	return slices.Contains(filter, status)
}

// ParseHealth splits "passing,warning" into its states.
func ParseHealth(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// SourceStatus is how a source is doing, for /status and the metrics.
type SourceStatus struct {
	Name string `json:"name"`
	// Up: the last attempt to read the source succeeded.
	Up          bool      `json:"up"`
	LastSuccess time.Time `json:"last_success,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Stale: the source has not answered within the time it promises (a
	// blocking query's wait plus a margin); its last good data keeps
	// serving. StaleReason says what has not answered since when.
	Stale       bool   `json:"stale,omitempty"`
	StaleReason string `json:"stale_reason,omitempty"`
	// Held counts instances the source no longer reports that are kept
	// until HeldUntil, because one snapshot removed too many at once
	// (the removal guard); HoldsTotal counts such holds since start.
	Held       int       `json:"held,omitempty"`
	HeldUntil  time.Time `json:"held_until,omitzero"`
	HoldsTotal uint64    `json:"holds_total,omitempty"`
	// Withheld counts instances the source reports again just after it
	// started over, though it had removed them, kept out until
	// WithheldUntil (old state served by a restored Consul server);
	// WithholdsTotal counts such withholds since start.
	Withheld       int       `json:"withheld,omitempty"`
	WithheldUntil  time.Time `json:"withheld_until,omitzero"`
	WithholdsTotal uint64    `json:"withholds_total,omitempty"`
}

// Reporter is a Source that says how it is doing.
type Reporter interface {
	Status() SourceStatus
}

// Rendering is what rendering a State produced.
type Rendering struct {
	Config []byte
	// Files are written before Config, which names them (the built-in
	// template's hosts map). A file's name holds a digest of its content,
	// so one written never changes: the configuration that names it,
	// and only that one, reads it.
	Files []File
	// Queries is everything the template asked for; Missing, those of
	// them that have no answer yet. A rendering with Missing is not
	// applied.
	Queries []Query
	Missing []Query
	// Skipped names what was left out and why, sorted ("service web: tag
	// seamless.http.host=\"a b\" is not a host name"), for the log.
	Skipped []string
	// Servers lists the server slots whose address, weight and state can
	// change over HAProxy's runtime API, and Structure identifies
	// everything else in Config: two renderings with the same Structure
	// differ only in those slots. Both are empty for templates without
	// slots, which always reload.
	Servers   Slots
	Structure []byte
	// NoHealthChecks: the servers have no HAProxy health check, so the
	// runtime API leaves their health alone (the source's is the truth).
	NoHealthChecks bool
	// Recheck, when set, is when the same State must be rendered again
	// (a removed instance has finished draining, and the slack after it
	// for other drains and changes to share the apply has passed).
	Recheck time.Time
	// Routes are the built-in template's routes in the order HAProxy
	// tries them, for /status; empty for user templates.
	Routes []Route
	// Commit, when set, is called once HAProxy runs this rendering (or
	// already ran the same bytes). What the renderer keeps for the next
	// rendering (the built-in template's slot table and drain clocks)
	// moves only then, so a rendering HAProxy refused leaves no trace.
	// Nil for renderers that keep nothing.
	Commit func()
}

// File is a file a configuration names, by its absolute path.
type File struct {
	Path string
	Data []byte
}

// Route is where the built-in template sends traffic, for /status.
type Route struct {
	// Match is "host web.example path /api", "any host path /", or
	// "tcp port 5432".
	Match   string `json:"match"`
	Service string `json:"service"`
	Backend string `json:"backend"`
}

// States of a server slot, as the runtime API sets them.
const (
	SlotReady = "ready"
	SlotDrain = "drain" // finishes what it has, takes nothing new
	SlotMaint = "maint" // free or drained
)

// ServerSlot is one server of a backend that the runtime API can change.
type ServerSlot struct {
	Backend  string `json:"backend"`
	Server   string `json:"server"`
	Instance string `json:"instance,omitempty"` // the instance holding it; "" when free
	Address  string `json:"address,omitempty"`  // IP or DNS name, no brackets
	Port     int    `json:"port,omitempty"`
	Weight   int    `json:"weight"`
	State    string `json:"state"`
}

// Renderer turns a State into a configuration. It must be a pure function
// of the State (and of files it reads, and of what its last committed
// rendering left): the same State renders the same bytes, and rendering
// changes nothing until the rendering's Commit is called.
type Renderer interface {
	Render(st State) (Rendering, error)
}

// ServiceID is the instance's ID as its registration names it: Consul's
// service IDs are unique per node only, so the Consul source makes ID
// "node/serviceID"; templates show consul-template's .ID, the part after
// the node.
func (in Instance) ServiceID() string {
	if in.Node != "" {
		if id, ok := strings.CutPrefix(in.ID, in.Node+"/"); ok {
			return id
		}
	}
	return in.ID
}

// WorstStatus is the worst of statuses in Consul's precedence:
// maintenance, critical, warning, passing; passing when there are none.
func WorstStatus(statuses ...string) string {
	rank := func(s string) int {
		switch s {
		case StatusMaintenance:
			return 3
		case StatusCritical:
			return 2
		case StatusWarning:
			return 1
		}
		return 0
	}
	w := StatusPassing
	for _, s := range statuses {
		if rank(s) > rank(w) {
			w = s
		}
	}
	return w
}

// DiffInstances counts instances by ID: new, gone, and different, for the
// sources' log lines.
func DiffInstances(before, after []Instance) (added, removed, changed int) {
	old := map[string]*Instance{}
	for i := range before {
		old[before[i].ID] = &before[i]
	}
	for i := range after {
		b, ok := old[after[i].ID]
		switch {
		case !ok:
			added++
		case !reflect.DeepEqual(*b, after[i]):
			changed++
		}
		delete(old, after[i].ID)
	}
	return added, removed + len(old), changed
}

// Degraded is a readiness answer that still counts as ready: traffic is
// served as configured, but something an operator should know is wrong (a
// source is stale). /readyz answers 200 and names it, since taking every
// replica out of rotation because their shared Consul froze would turn a
// stale catalog into an outage.
type Degraded struct{ Reason string }

func (d *Degraded) Error() string { return d.Reason }
