package consul

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/hashicorp/consul/api"
)

// readDump is Raw().Query(nodeDumpPath, &dump, opts), decoded node by
// node as the answer arrives. The API client's decoder reads an answer
// whole before it decodes it, into a buffer it doubles as it fills: at
// 10,000 services × 10 instances the dump is 147 MB of JSON, and reading
// it allocated 529 MB of buffers and held up to 384 MB at once (a 256 MiB
// buffer and the 128 MiB one it was copied from), the process's peak.
func (s *Source) readDump(opts *api.QueryOptions) ([]*nodeInfo, *api.QueryMeta, error) {
	req := s.request.get(opts.Context(), s.request.address, nodeDumpPath, opts.Datacenter, "", opts.AllowStale, opts.WaitIndex, opts.WaitTime)
	if s.plainDump {
		req.Header = req.Header.Clone() // the shared one is read only
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, nil, api.StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	meta, err := queryMeta(resp.Header)
	if err != nil {
		return nil, nil, err
	}
	dump, err := decodeDump(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	return dump, meta, nil
}

// decodeDump decodes a JSON list of nodes one at a time: the decoder's
// buffer holds one node's text, not the list's.
func decodeDump(r io.Reader) ([]*nodeInfo, error) {
	dec := json.NewDecoder(r)
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if t == nil { // null
		return nil, nil
	}
	if d, ok := t.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("the node dump is not a list: it begins with %v", t)
	}
	var dump []*nodeInfo
	for dec.More() {
		var n *nodeInfo
		if err := dec.Decode(&n); err != nil {
			return nil, err
		}
		dump = append(dump, n)
	}
	if _, err := dec.Token(); err != nil { // the closing ]
		return nil, err
	}
	return dump, nil
}

// onThisMachine reports whether every agent is reached on this machine
// (a loopback address, localhost, a unix socket). The dump is then asked
// for without gzip: carrying it costs nothing there, and compressing it
// cost a Consul 1.14 agent 5.7 s against 3.3 s for the whole answer at
// 10,000 services × 10, most of a seeded start's wait for it.
func onThisMachine(hosts []string) bool {
	for _, h := range hosts {
		if strings.HasPrefix(h, "/") || strings.HasPrefix(h, "unix://") {
			continue
		}
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		if a, err := netip.ParseAddr(h); !(err == nil && a.IsLoopback() || strings.EqualFold(h, "localhost")) {
			return false
		}
	}
	return len(hosts) > 0
}
