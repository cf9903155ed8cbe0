package template

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// pair returns the pair of a QueryKey result.
func pair(res model.Result, key string) (model.KVPair, bool) {
	for _, p := range res.Pairs {
		if p.Key == key {
			return p, true
		}
	}
	if len(res.Pairs) > 0 {
		return res.Pairs[0], true
	}
	return model.KVPair{}, false
}

// key implements `key "path[@dc]"`. consul-template blocks the render
// until the key exists; here an absent key is an error, so the running
// configuration stays until it exists (use keyOrDefault or keyExists for
// optional keys).
func (r *render) key(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	q, err := parseKVQuery(s, model.QueryKey)
	if err != nil {
		return "", err
	}
	res, ok := r.result(q)
	if !ok {
		return "", nil
	}
	p, ok := pair(res, q.Key)
	if !ok {
		return "", fmt.Errorf("key %q does not exist (use keyOrDefault or keyExists for a key that may be absent)", s)
	}
	return p.Value, nil
}

// keyExists implements `keyExists "path[@dc]"`.
func (r *render) keyExists(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	q, err := parseKVQuery(s, model.QueryKey)
	if err != nil {
		return false, err
	}
	res, ok := r.result(q)
	if !ok {
		return false, nil
	}
	_, exists := pair(res, q.Key)
	return exists, nil
}

// keyOrDefault implements `keyOrDefault "path[@dc]" "default"`: the default
// when the key is absent, empty, or not fetched yet.
func (r *render) keyOrDefault(s, def string) (string, error) {
	if s == "" {
		return def, nil
	}
	q, err := parseKVQuery(s, model.QueryKey)
	if err != nil {
		return "", err
	}
	res, ok := r.result(q)
	if !ok {
		return def, nil
	}
	if p, ok := pair(res, q.Key); ok && p.Value != "" {
		return p.Value, nil
	}
	return def, nil
}

// list implements ls, safeLs, tree and safeTree. Keys are made relative to
// the prefix. ls keeps direct children only (no "/" left in the relative
// key), tree every key but "folders" (keys ending in "/"). The safe forms
// refuse an empty result: consul-template then silently waits; seamless
// returns an error, which keeps the running configuration as well, and
// says why.
func (r *render) list(s, fn string, recursive, safe bool) ([]*KeyPair, error) {
	out := []*KeyPair{}
	if s == "" {
		return out, nil
	}
	q, err := parseKVQuery(s, model.QueryPrefix)
	if err != nil {
		return nil, err
	}
	res, ok := r.result(q)
	if !ok {
		return out, nil
	}
	for _, p := range res.Pairs {
		rel := strings.TrimLeft(strings.TrimPrefix(p.Key, q.Key), "/")
		if recursive {
			if rel == "" || strings.HasSuffix(rel, "/") {
				continue
			}
		} else if rel == "" || strings.Contains(rel, "/") {
			continue
		}
		out = append(out, &KeyPair{
			Path: p.Key, Key: rel, Value: p.Value, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex,
			LockIndex: p.LockIndex, Flags: p.Flags, Session: p.Session,
		})
	}
	slices.SortStableFunc(out, func(a, b *KeyPair) int { return cmp.Compare(a.Path, b.Path) })
	if safe && len(out) == 0 {
		return nil, fmt.Errorf("%s %q: no keys under the prefix; refusing to render an empty list", fn, s)
	}
	return out, nil
}
