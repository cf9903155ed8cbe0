package template

import (
	"slices"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The types below are what consul-template's functions return, with the
// same field names, so templates written for it read them unchanged. Every
// string in them comes from outside and is untrusted: pass names through
// haproxyName, arguments through haproxyQuote, and check addresses with
// validHost before they reach a configuration line.

// ServiceTags is a sorted list of tags.
type ServiceTags []string

// Contains reports whether the tag is in the list.
func (t ServiceTags) Contains(tag string) bool { return slices.Contains(t, tag) }

// Weights are an instance's load-balancing weights when passing and when
// warning (Consul's default for both is 1).
type Weights struct {
	Passing int
	Warning int
}

// ServiceAddress is one of an instance's tagged addresses.
type ServiceAddress struct {
	Address string
	Port    int
}

// HealthCheck is one health check of an instance or of its node.
type HealthCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
}

// HealthChecks are the checks behind an instance's status.
type HealthChecks []*HealthCheck

// AggregatedStatus is the worst status of the checks: maintenance,
// critical, warning, then passing (Consul's order).
func (c HealthChecks) AggregatedStatus() string {
	st := make([]string, len(c))
	for i, ch := range c {
		st[i] = ch.Status
	}
	return model.WorstStatus(st...)
}

// HealthService is one instance of a service, as `service` returns it.
type HealthService struct {
	Node                   string
	NodeID                 string
	Kind                   string
	NodeAddress            string
	NodeDatacenter         string
	NodeTaggedAddresses    map[string]string
	NodeMeta               map[string]string
	ServiceMeta            map[string]string
	Address                string
	ServiceTaggedAddresses map[string]ServiceAddress
	ID                     string
	Name                   string
	Tags                   ServiceTags
	Checks                 HealthChecks
	Status                 string
	Port                   int
	Weights                Weights
	Namespace              string
	// Source is the seamless source that reported the instance ("consul",
	// "docker", "file:..."); consul-template has no such field.
	Source string
}

// CatalogSnippet is one service as `services` returns it: its name and the
// union of its instances' tags.
type CatalogSnippet struct {
	Name string
	Tags ServiceTags
}

// Node is a node of the catalog.
type Node struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
}

// CatalogNode is a node and the instances it runs, as `node` returns it.
type CatalogNode struct {
	Node     *Node
	Services []*CatalogNodeService
}

// CatalogNodeService is one instance on a node.
type CatalogNodeService struct {
	ID                string
	Service           string
	Tags              ServiceTags
	Meta              map[string]string
	Port              int
	Address           string
	EnableTagOverride bool
}

// KeyPair is one KV pair; Key is relative to the prefix asked for (`ls`,
// `tree`) and Path is the full key.
type KeyPair struct {
	Path        string
	Key         string
	Value       string
	CreateIndex uint64
	ModifyIndex uint64
	LockIndex   uint64
	Flags       uint64
	Session     string
}
