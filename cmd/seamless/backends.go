package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/status"
)

// backends asks the current worker for its backends and servers (`show
// stat`: live state and current sessions) and names the instance seamless
// put in each slot.
func (p *statusPage) backends(ctx context.Context, run apply.Running) ([]status.Backend, string) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	out, err := p.stats.Do(ctx, "@1 show stat")
	if err != nil {
		return nil, fmt.Sprintf("show stat: %v", err)
	}
	bs, err := parseStat(out)
	if err != nil {
		return nil, err.Error()
	}
	type slotKey struct{ backend, server string }
	slots := map[slotKey]int{}
	for i, s := range run.Slots {
		slots[slotKey{s.Backend, s.Server}] = i
	}
	for i := range bs {
		for j := range bs[i].Servers {
			srv := &bs[i].Servers[j]
			k, ok := slots[slotKey{bs[i].Name, srv.Name}]
			if ok && run.Slots[k].Instance == "" {
				srv.Address = "" // a free slot's placeholder
			}
			if ok && run.Slots[k].Instance != "" {
				srv.Instance = run.Slots[k].Instance
				if k < len(run.Health) {
					srv.Health = run.Health[k]
				}
			}
		}
	}
	return bs, ""
}

// parseStat reads `show stat` CSV by its header's column names: backends
// (type 1) and their servers (type 2), in HAProxy's order. Frontends are
// left out.
func parseStat(out string) ([]status.Backend, error) {
	out = strings.TrimSpace(out)
	head, body, ok := strings.Cut(out, "\n")
	h, found := strings.CutPrefix(head, "# ")
	if !ok || !found {
		return nil, fmt.Errorf("show stat: no CSV header in %.80q", out)
	}
	r := csv.NewReader(strings.NewReader(h + "\n" + body))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("show stat: %w", err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, c := range []string{"pxname", "svname", "scur", "status", "type"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("show stat: no column %s", c)
		}
	}
	get := func(row []string, name string) string {
		if i, ok := col[name]; ok && i < len(row) {
			return row[i]
		}
		return ""
	}
	var bs []status.Backend
	servers := map[string][]status.BackendServer{}
	for _, row := range rows[1:] {
		sessions, _ := strconv.Atoi(get(row, "scur"))
		switch get(row, "type") {
		case "1":
			bs = append(bs, status.Backend{Name: get(row, "pxname"), Status: get(row, "status"), Sessions: sessions})
		case "2":
			srv := status.BackendServer{Name: get(row, "svname"), State: get(row, "status"), Sessions: sessions,
				Address: slotAddress(get(row, "addr"))}
			servers[get(row, "pxname")] = append(servers[get(row, "pxname")], srv)
		}
	}
	for i := range bs {
		bs[i].Servers = servers[bs[i].Name]
	}
	return bs, nil
}

// slotAddress hides the placeholder of a free slot (port 0).
func slotAddress(addr string) string {
	if _, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
		return ""
	}
	return addr
}
