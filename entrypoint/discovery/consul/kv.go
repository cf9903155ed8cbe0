package consul

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// kvFetcher watches one key, or every key under a prefix, with one
// blocking query.
type kvFetcher struct {
	s      *Source
	dc     string
	key    string
	prefix bool
	cur    cursor
	last   model.Result
	have   bool
}

func (f *kvFetcher) fetch(ctx context.Context) (model.Result, error) {
	opts, cancel := f.s.queryOptions(ctx, f.dc, f.cur.wait())
	defer cancel()
	var (
		pairs api.KVPairs
		meta  *api.QueryMeta
		err   error
	)
	if f.prefix {
		pairs, meta, err = f.s.client.KV().List(f.key, opts)
	} else {
		var p *api.KVPair
		p, meta, err = f.s.client.KV().Get(f.key, opts)
		if p != nil {
			pairs = api.KVPairs{p}
		}
	}
	if err != nil {
		f.cur.failed()
		return model.Result{}, err
	}
	kind := model.QueryKey
	if f.prefix {
		kind = model.QueryPrefix
	}
	if !f.cur.answered(meta.LastIndex, f.s, model.Query{Kind: kind, Datacenter: f.dc, Key: f.key}.String()) && f.have {
		return f.last, nil
	}
	r := model.Result{Pairs: []model.KVPair{}}
	for _, p := range pairs {
		if p == nil {
			continue
		}
		r.Pairs = append(r.Pairs, model.KVPair{Key: p.Key, Value: string(p.Value), Flags: p.Flags,
			CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex, LockIndex: p.LockIndex, Session: p.Session})
	}
	f.last, f.have = r, true
	return r, nil
}

// dcFetcher polls the list of datacenters, which Consul cannot watch with
// a blocking query.
type dcFetcher struct {
	s    *Source
	next time.Time // when to read again; zero at first
}

func (f *dcFetcher) fetch(ctx context.Context) (model.Result, error) {
	if !f.next.IsZero() && !sleep(ctx, time.Until(f.next)) {
		return model.Result{}, ctx.Err()
	}
	opts, cancel := f.s.queryOptions(ctx, "", 0)
	defer cancel()
	var names []string
	if _, err := f.s.client.Raw().Query("/v1/catalog/datacenters", &names, opts); err != nil {
		return model.Result{}, err
	}
	f.next = time.Now().Add(f.s.dcPoll)
	names = slices.DeleteFunc(names, func(s string) bool { return s == "" })
	slices.Sort(names)
	return model.Result{Datacenters: slices.Compact(names)}, nil
}
