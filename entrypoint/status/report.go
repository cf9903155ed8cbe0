package status

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// Report is the body of GET /status and what the page at / shows. Its JSON
// field names are an interface: add fields, never rename or remove one.
// Lists are always present ([] when empty); fields marked omitempty are
// left out when empty or zero. Every string may come from outside
// (a source's error, a service name in a change) and is untrusted.
type Report struct {
	// Time is when the report was made; the page's "ago"s count from it.
	Time time.Time `json:"time"`
	// Version and Commit identify the seamless binary.
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	// Mode is ModeDropIn or ModeDiscovery.
	Mode string `json:"mode"`

	// Healthy and Ready are what /healthz and /readyz answer at the same
	// moment; the reasons are their 503 bodies. The server fills them in
	// from the checks given to Listen, whatever the Provider set.
	Healthy         bool   `json:"healthy"`
	UnhealthyReason string `json:"unhealthy_reason,omitempty"`
	Ready           bool   `json:"ready"`
	UnreadyReason   string `json:"unready_reason,omitempty"`

	// Sources are the discovery sources in order of precedence; none in
	// drop-in mode.
	Sources []Source `json:"sources"`
	// Applies are the latest discovery applies, newest first; none in
	// drop-in mode.
	Applies []Apply `json:"applies"`
	// Reloads are HAProxy's latest reloads, newest first: signals in
	// drop-in mode, applies that needed one in discovery mode.
	Reloads []Reload `json:"reloads"`
	// ConfigFiles are the files HAProxy loads, as they are on disk now,
	// each with the digest of what runs. In discovery mode the rendered
	// file is always what runs; in drop-in mode a file may have been
	// edited, or refused, since the last reload.
	ConfigFiles []ConfigFile `json:"config_files"`
	// Config fingerprints what HAProxy runs, for comparing replicas of a
	// fleet (also seamless_config_info); empty while unknown.
	Config Fingerprint `json:"config"`
	// ConsulIndex is, by datacenter, the Consul index of the catalog the
	// running configuration was rendered from: the newest change it
	// reflects. Replicas of a fleet on the same catalog show the same or
	// close values; one whose agent is cut off lags. Empty without Consul.
	ConsulIndex map[string]uint64 `json:"consul_index,omitempty"`
	HAProxy     HAProxy           `json:"haproxy"`
	// Routes are where the built-in template sends traffic, in the order
	// HAProxy tries them: each to a service's backend, whose servers are
	// in Backends. Empty for user templates and in drop-in mode.
	Routes []Route `json:"routes"`
	// Backends are the backends and servers the running worker reports
	// (`show stat`), in its order; with the built-in template each server
	// slot also names the instance in it. Whatever the template.
	Backends []Backend `json:"backends"`
	// BackendsError: the worker did not answer; Backends is empty.
	BackendsError string `json:"backends_error,omitempty"`
	// Skipped: what the running configuration leaves out and why (a
	// service without routing tags, a route another service holds, an
	// invalid tag), one line each.
	Skipped []string `json:"skipped"`
	// Certificates are what the HTTPS frontend of the built-in template
	// serves, the self-signed default first; empty without one.
	Certificates []Certificate `json:"certificates"`
}

// Certificate is one certificate HAProxy serves.
type Certificate struct {
	// Name is the installed file's name: the source's file name, the
	// host for ACME, "default" for the self-signed one.
	Name string `json:"name"`
	// Source: dir (SEAMLESS_CERTS_DIR), acme, default, or another source.
	Source string `json:"source"`
	// Hosts are the DNS names it covers (its subjectAltName).
	Hosts    []string  `json:"hosts"`
	Issuer   string    `json:"issuer"`
	Serial   string    `json:"serial"` // hex, as openssl prints it
	NotAfter time.Time `json:"not_after"`
	// Expiring: it ends within 30 days; renew or replace it.
	Expiring bool `json:"expiring"`
	// ServedSince is when this certificate (this serial) was installed.
	ServedSince time.Time `json:"served_since,omitzero"`
	// File is where it came from.
	File string `json:"file,omitempty"`
}

// Route is one HTTP rule or TCP port of the built-in template.
type Route struct {
	// Match: "host web.example path /api", "any host path /" (catches
	// what nothing else does), "tcp port 5432".
	Match   string `json:"match"`
	Service string `json:"service"`
	Backend string `json:"backend"`
}

// Reload is one reload attempt.
type Reload struct {
	Time time.Time `json:"time"`
	// Trigger: the signals ("SIGHUP ×2") or the command ("discovery:
	// consul") that asked for it; coalesced requests are listed together.
	Trigger string `json:"trigger"`
	// Result: ReloadOK, ReloadRefused (haproxy -c, or the new worker, did
	// not load it; the old workers serve on), ReloadFailed (not
	// confirmed, or -c could not run).
	Result          string  `json:"result"`
	DurationSeconds float64 `json:"duration_seconds"`
	Error           string  `json:"error,omitempty"`
	// Alerts are HAProxy's own [ALERT] lines for a refused reload.
	Alerts []string `json:"alerts,omitempty"`
}

// Results of Reload.Result.
const (
	ReloadOK      = "ok"
	ReloadRefused = "refused"
	ReloadFailed  = "failed"
)

// Backend is one backend of the running worker.
type Backend struct {
	Name string `json:"name"`
	// Status as `show stat` gives it: UP, DOWN.
	Status   string          `json:"status"`
	Sessions int             `json:"sessions"` // current sessions
	Servers  []BackendServer `json:"servers"`
}

// BackendServer is one server (slot) of a backend.
type BackendServer struct {
	Name string `json:"name"`
	// Address is address:port as HAProxy uses it; empty for a free slot.
	Address string `json:"address,omitempty"`
	// State is HAProxy's live state: UP, DOWN, DRAIN, MAINT, "no check",
	// with its detail ("UP 1/3", "MAINT (resolution)").
	State    string `json:"state"`
	Sessions int    `json:"sessions"` // current sessions
	// Instance is the instance seamless put in this slot, "" when free
	// or not seamless's (a user template, drop-in); Health is its
	// source's health (passing, warning, critical, maintenance).
	Instance string `json:"instance,omitempty"`
	Health   string `json:"health,omitempty"`
}

// Modes of Report.Mode.
const (
	ModeDropIn    = "drop-in"   // HAProxy runs the configuration it was given
	ModeDiscovery = "discovery" // HAProxy runs the configuration rendered from the sources
)

// Source is how one discovery source is doing.
type Source struct {
	Name string `json:"name"`
	// Up: the last attempt to read the source succeeded.
	Up          bool      `json:"up"`
	LastSuccess time.Time `json:"last_success,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Stale, when set, says why the source is stale: it has not answered
	// within its wait plus a margin, and its last good data serves.
	Stale string `json:"stale,omitempty"`
	// Held instances are gone from the source but kept until HeldUntil:
	// one snapshot removed too many at once (SEAMLESS_REMOVAL_GUARD).
	Held      int       `json:"held,omitempty"`
	HeldUntil time.Time `json:"held_until,omitzero"`
	// Withheld instances are reported again by the source just after it
	// started over, though it had removed them: kept out until
	// WithheldUntil, in case they are old state (SEAMLESS_REMOVAL_GUARD).
	Withheld      int       `json:"withheld,omitempty"`
	WithheldUntil time.Time `json:"withheld_until,omitzero"`
}

// Apply is one rendering of the sources and what became of it.
type Apply struct {
	Time time.Time `json:"time"`
	// Reason: the sources that changed, or the signal.
	Reason string `json:"reason"`
	// Change: what changed, per service.
	Change string `json:"change,omitempty"`
	// How: metrics.Runtime, Reloaded, Unchanged, Refused or Failed, the
	// result label of seamless_config_applies_total.
	How             string  `json:"how"`
	DurationSeconds float64 `json:"duration_seconds"`
	Error           string  `json:"error,omitempty"`
}

// ConfigFile is one configuration file HAProxy loads.
type ConfigFile struct {
	Path string `json:"path"`
	// SHA256 is the hex digest of the content on disk.
	SHA256   string    `json:"sha256,omitempty"`
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified,omitzero"`
	// RunningSHA256 is the digest of what HAProxy runs: the content read
	// for the last confirmed reload, or at start.
	RunningSHA256 string `json:"running_sha256,omitempty"`
	// DiffersSince, when set, is since when the file on disk is not what
	// runs, and DiffersReason why (the refusal's error, or "not reloaded
	// since it changed").
	DiffersSince  time.Time `json:"differs_since,omitzero"`
	DiffersReason string    `json:"differs_reason,omitempty"`
	// Error: the file could not be read; the other fields are empty.
	Error string `json:"error,omitempty"`
}

// Fingerprint identifies the configuration HAProxy runs.
type Fingerprint struct {
	// SHA256 is the hex digest of the running configuration file (of
	// its "digest  path" lines when HAProxy loads several).
	SHA256 string `json:"sha256,omitempty"`
	// MembersSHA256 is the digest of the same file with each backend's
	// server lines sorted and their slot names left out: replicas that
	// run the same servers in different slots (they saw them arrive in a
	// different order) have equal MembersSHA256 and different SHA256.
	MembersSHA256 string `json:"members_sha256,omitempty"`
}

// HAProxy is the running HAProxy as its master CLI's `show proc` lists it.
type HAProxy struct {
	// Version is the running master's version.
	Version    string `json:"version,omitempty"`
	Master     *Proc  `json:"master,omitempty"`
	Workers    []Proc `json:"workers"`     // the current generation
	OldWorkers []Proc `json:"old_workers"` // earlier generations, still draining
	// Error: the master CLI did not answer; the processes are unknown.
	Error string `json:"error,omitempty"`
}

// Proc is one HAProxy process.
type Proc struct {
	Pid int `json:"pid"`
	// Reloads: how many reloads the process has seen since it started.
	Reloads int    `json:"reloads"`
	Version string `json:"version,omitempty"`
}

// Provider makes a Report for one request; the server then fills in the
// health and readiness. It must not fail: what it cannot find out goes
// into the Error field of that part. ctx ends with the request; a Provider
// that asks HAProxy bounds that with a short timeout of its own.
type Provider func(ctx context.Context) Report

// report asks p and fills in what the server knows itself.
func (c checks) report(ctx context.Context, p Provider) Report {
	r := p(ctx)
	r.Healthy, r.UnhealthyReason = outcome(c.healthy())
	r.Ready, r.UnreadyReason = outcome(c.readyz())
	r.Sources = nonNil(r.Sources)
	r.Applies = nonNil(r.Applies)
	r.Reloads = nonNil(r.Reloads)
	r.Backends = nonNil(r.Backends)
	r.Routes = nonNil(r.Routes)
	r.Skipped = nonNil(r.Skipped)
	r.Certificates = nonNil(r.Certificates)
	for i := range r.Certificates {
		r.Certificates[i].Hosts = nonNil(r.Certificates[i].Hosts)
	}
	for i := range r.Backends {
		r.Backends[i].Servers = nonNil(r.Backends[i].Servers)
	}
	r.ConfigFiles = nonNil(r.ConfigFiles)
	r.HAProxy.Workers = nonNil(r.HAProxy.Workers)
	r.HAProxy.OldWorkers = nonNil(r.HAProxy.OldWorkers)
	return r
}

func outcome(err error) (bool, string) {
	if err != nil {
		return false, err.Error()
	}
	return true, ""
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// serveJSON answers GET /status. It is 200 whatever the health: the body
// says it, and /healthz and /readyz are the probes.
func (c checks) serveJSON(p Provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rep := c.report(r.Context(), p)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	}
}
