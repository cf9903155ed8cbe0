package consul

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// healthEntry is one entry of /v1/health/service/<name> (Consul's
// api.ServiceEntry) with only the fields an instance is made of. The JSON
// decoder skips the others (proxy and connect settings, raft indexes,
// check definitions) without allocating for them: through
// api.ServiceEntry an answer of 10 instances cost about 140 KiB, and each
// of a thousand held queries answers at least once per wait.
type healthEntry struct {
	Node    *nodeInfo // Services and Checks are not in Consul's node
	Service *nodeService
	Checks  []*healthCheck
}

// readHealth reads the health of service name, every state, waiting on
// index. Without a tag filter the answer is decoded straight into
// healthEntry, and only when it can differ from the last one; the raw
// query cannot add the tag parameter, so with a filter the answer goes
// through the API's types as before.
func (c *splitCatalog) readHealth(opts *api.QueryOptions, name string, index, quietTo uint64) ([]healthEntry, *api.QueryMeta, error) {
	if tag := c.s.cfg.TagFilter; tag != "" {
		entries, meta, err := c.s.client.Health().Service(name, tag, false, opts)
		if err != nil {
			return nil, nil, err
		}
		return entriesFromAPI(entries), meta, nil
	}
	var body healthBody
	// The same request as Health().Service(name, "", false, opts).
	meta, err := c.s.client.Raw().Query("/v1/health/service/"+name, &body, opts)
	if err != nil {
		return nil, nil, err
	}
	entries, err := healthEntries(body.json, index, meta.LastIndex, quietTo)
	if err != nil {
		return nil, nil, err
	}
	if entries != nil {
		c.decoded.Add(1)
	}
	return entries, meta, nil
}

// healthEntries decodes a health answer at index got to a query that
// waited on index, unless the wait ran out (most answers of a thousand
// held queries): after an answer a query waits on its index (cursor), so
// this one is the last again, which run does not convert. An answer at
// or below quietTo (subWatch.quietTo: a seeded query's first wait) is a
// wait that ran out too, which run does not convert either: at the end
// of a seeded start's first wait every query answers so, all at once
// (10,000 at 10,000 services).
func healthEntries(body []byte, index, got, quietTo uint64) ([]healthEntry, error) {
	if index > 1 && got == index || got != 0 && got <= quietTo {
		return nil, nil
	}
	var entries []healthEntry
	if err := json.Unmarshal(body, &entries); err != nil {
		return nil, err
	}
	return entries, nil
}

// healthBody keeps an answer's JSON for readHealth to decode or drop. The
// decoder has checked its syntax.
type healthBody struct{ json []byte }

func (h *healthBody) UnmarshalJSON(b []byte) error {
	h.json = bytes.Clone(b) // b is the decoder's buffer
	return nil
}

// listBody decodes a service list unless its bytes are those of the list
// passed on last (Consul writes a map's keys in order, so the same list is
// the same bytes).
type listBody struct {
	passed   *[32]byte // nil: none passed on yet
	digest   [32]byte
	services map[string][]string
}

func (l *listBody) UnmarshalJSON(b []byte) error {
	l.digest = sha256.Sum256(b)
	if l.passed != nil && l.digest == *l.passed {
		return nil
	}
	return json.Unmarshal(b, &l.services)
}

func entriesFromAPI(entries []*api.ServiceEntry) []healthEntry {
	out := make([]healthEntry, 0, len(entries))
	for _, e := range entries {
		if e == nil || e.Node == nil || e.Service == nil {
			continue
		}
		h := healthEntry{Node: nodeFromAPI(e.Node), Service: fromAgentService(e.Service)}
		for _, ch := range e.Checks {
			if ch != nil {
				h.Checks = append(h.Checks, &healthCheck{Node: ch.Node, CheckID: ch.CheckID, Name: ch.Name,
					Status: ch.Status, Notes: ch.Notes, Output: ch.Output, ServiceID: ch.ServiceID, ServiceName: ch.ServiceName})
			}
		}
		out = append(out, h)
	}
	return out
}

// convertEntries converts the health of one service as the node dump's
// would be: each entry is a node with that one instance and its checks.
func convertEntries(entries []healthEntry, dc, tagFilter string) []model.Instance {
	dump := make([]*nodeInfo, 0, len(entries))
	for _, e := range entries {
		if e.Node == nil || e.Service == nil {
			continue
		}
		n := *e.Node
		n.Services = []*nodeService{e.Service}
		n.Checks = e.Checks
		dump = append(dump, &n)
	}
	return convertDump(dump, dc, tagFilter).Instances
}
