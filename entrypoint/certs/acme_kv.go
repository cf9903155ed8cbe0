package certs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// ACME shared by replicas through Consul KV (SEAMLESS_ACME_KV=PREFIX):
//
//	PREFIX/accounts/HASH/key.pem, PREFIX/accounts/HASH/account.json
//	PREFIX/certs/HOST.pem          as in SEAMLESS_STATE_DIR/acme
//	PREFIX/lock                    the Consul lock every order is placed under
//	PREFIX/challenges/TOKEN        the HTTP-01 answers every replica serves
//	PREFIX/replicas/SESSION        one per live replica, gone with its session
//	PREFIX/acks/TOKEN/SESSION      a replica serves TOKEN
//
// A replica takes the lock, reads the host's stored certificate again
// (another replica may have ordered it meanwhile: then it is used as is),
// else orders, stores and releases. So N replicas place one order per host
// and renewal. Every replica watches PREFIX/certs/ and installs what is
// stored, and PREFIX/challenges/ so that the CA's validation may reach any
// replica's HAProxy; the orderer lets the CA validate once every live
// replica acknowledged the answer (or after ackWait).

// kvStore is acmeStore under a Consul KV prefix.
type kvStore struct {
	c      *api.Client
	prefix string // with a trailing '/'
}

func (s kvStore) where(name string) string { return "consul kv " + s.prefix + name }

func (s kvStore) get(ctx context.Context, name string) ([]byte, error) {
	p, _, err := s.c.KV().Get(s.prefix+name, (&api.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return nil, err
	case p == nil:
		return nil, errNotStored
	}
	return p.Value, nil
}

func (s kvStore) put(ctx context.Context, name string, data []byte) error {
	_, err := s.c.KV().Put(&api.KVPair{Key: s.prefix + name, Value: data}, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

func (s kvStore) del(ctx context.Context, name string) error {
	_, err := s.c.KV().Delete(s.prefix+name, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

func (s kvStore) list(ctx context.Context, dir string) ([]string, error) {
	keys, _, err := s.c.KV().Keys(s.prefix+dir+"/", "/", (&api.QueryOptions{}).WithContext(ctx))
	var out []string
	for _, k := range keys {
		if n := strings.TrimPrefix(k, s.prefix+dir+"/"); n != "" && !strings.Contains(n, "/") {
			out = append(out, n)
		}
	}
	return out, err
}

// lockWait is how long one wait for the lock blocks: api.Lock cannot
// cancel its query, so it bounds how long a stop waits for it.
const lockWait = 3 * time.Second

// lock takes the Consul lock orders are placed under. The context it
// returns ends when the lock is lost (its session invalidated) or ctx ends;
// unlock releases it.
func (a *ACME) lock(ctx context.Context) (context.Context, func(), error) {
	l, err := a.o.Consul.LockOpts(&api.LockOptions{Key: a.kvPrefix() + "lock", SessionName: "seamless ACME order",
		SessionTTL: "30s", LockWaitTime: lockWait, MonitorRetries: 3})
	if err != nil {
		return nil, nil, err
	}
	lost, err := l.Lock(ctx.Done())
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("the Consul lock %s: %w", a.kvPrefix()+"lock", err)
	case lost == nil:
		return nil, nil, ctx.Err()
	}
	lctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-lost:
			cancel()
		case <-lctx.Done():
		}
	}()
	return lctx, func() {
		cancel()
		if err := l.Unlock(); err != nil {
			a.log.Warn("cannot release the Consul lock; it ends with its session", "key", a.kvPrefix()+"lock", "err", err)
		}
	}, nil
}

func (a *ACME) kvPrefix() string { return strings.TrimSuffix(a.o.KV, "/") + "/" }

// watchStored sends the valid certificates stored under PREFIX/certs/ at
// once and after each change, until ctx ends: what other replicas ordered.
func (a *ACME) watchStored(ctx context.Context, out chan<- map[string]*acmeCert) {
	prefix := a.kvPrefix() + "certs/"
	logged := map[string]uint64{} // the values refused, by key: each is logged once
	// Never removes: a certificate missing from the store (a Consul that
	// lost its data) keeps serving from memory until it ends or is renewed.
	watchKV(ctx, a.o.Consul, prefix, a.log, func(pairs api.KVPairs, _ bool) {
		m := map[string]*acmeCert{}
		refused := map[string]uint64{}
		for _, p := range pairs {
			host, ok := strings.CutSuffix(strings.TrimPrefix(p.Key, prefix), ".pem")
			// The host names the installed file: never from KV unchecked.
			if !ok || !model.IsDNSName(host, false) {
				continue
			}
			c, err := a.entry(host, p.Value)
			if err != nil {
				if logged[p.Key] != p.ModifyIndex {
					a.log.Warn("stored ACME certificate not used", "host", host, "stored", a.store.where(certName(host)), "err", err)
				}
				refused[p.Key] = p.ModifyIndex
				continue
			}
			m[host] = c
		}
		logged = refused
		select {
		case out <- m:
		case <-ctx.Done():
		}
	})
}

// sharedChallenges is the challenge provider with SEAMLESS_ACME_KV: the
// answer is put in the local map and in PREFIX/challenges/, which every
// replica's syncChallenges copies into its own map, since the CA's
// validation may reach any replica.
type sharedChallenges struct {
	a *ACME
}

func (s sharedChallenges) key(token string) string { return s.a.kvPrefix() + "challenges/" + token }

// Present answers locally first, so that this replica's own watch finds
// the token served, then shares it and waits for the acknowledgements.
func (s sharedChallenges) Present(ctx context.Context, domain, token, keyAuth string) error {
	if err := s.a.o.Challenges.Present(ctx, domain, token, keyAuth); err != nil {
		return err
	}
	if _, err := s.a.o.Consul.KV().Put(&api.KVPair{Key: s.key(token), Value: []byte(keyAuth)},
		(&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("ACME challenge for %s: sharing it in Consul KV: %w", domain, err)
	}
	s.a.waitAcks(ctx, domain, token)
	return nil
}

func (s sharedChallenges) CleanUp(ctx context.Context, domain, token, keyAuth string) error {
	err := s.a.o.Challenges.CleanUp(ctx, domain, token, keyAuth)
	wo := (&api.WriteOptions{}).WithContext(ctx)
	if _, derr := s.a.o.Consul.KV().Delete(s.key(token), wo); derr != nil {
		err = errors.Join(err, fmt.Errorf("ACME challenge for %s: removing it from Consul KV: %w", domain, derr))
	}
	if _, derr := s.a.o.Consul.KV().DeleteTree(s.a.kvPrefix()+"acks/"+token+"/", wo); derr != nil {
		err = errors.Join(err, fmt.Errorf("ACME challenge for %s: removing its acknowledgements from Consul KV: %w", domain, derr))
	}
	return err
}

// ackWait bounds how long an order waits for every replica to serve its
// challenge: a replica that died keeps its key until its session expires.
const ackWait = 10 * time.Second

// waitAcks waits until every replica under PREFIX/replicas/ acknowledged
// token, or ackWait; the CA is then asked to validate either way.
func (a *ACME) waitAcks(ctx context.Context, domain, token string) {
	ctx, cancel := context.WithTimeout(ctx, ackWait)
	defer cancel()
	var index uint64
	var missing []string
	for {
		replicas, _, err := a.o.Consul.KV().Keys(a.kvPrefix()+"replicas/", "", (&api.QueryOptions{}).WithContext(ctx))
		var acks []string
		var meta *api.QueryMeta
		if err == nil {
			acks, meta, err = a.o.Consul.KV().Keys(a.kvPrefix()+"acks/"+token+"/", "",
				(&api.QueryOptions{WaitIndex: index, WaitTime: 2 * time.Second}).WithContext(ctx))
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("cannot check that every replica serves the ACME challenge", "host", domain, "err", err)
			}
			break
		}
		missing = missing[:0]
		for _, r := range replicas {
			id := strings.TrimPrefix(r, a.kvPrefix()+"replicas/")
			if !slices.Contains(acks, a.kvPrefix()+"acks/"+token+"/"+id) {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return
		}
		index = meta.LastIndex
	}
	if len(missing) > 0 {
		a.log.Warn("not every replica confirmed that it serves the ACME challenge; the CA may reach one that cannot answer",
			"host", domain, "sessions", strings.Join(missing, ","))
	}
}

// presence keeps PREFIX/replicas/SESSION while this replica runs, under a
// session of its own that deletes the key when the replica dies or stops.
func (a *ACME) presence(ctx context.Context) {
	var backoff time.Duration
	for ctx.Err() == nil {
		err := a.presentOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("cannot announce this replica in Consul KV; orders of other replicas will not wait for it to serve their challenges", "err", err)
		backoff = min(max(2*backoff, time.Second), 30*time.Second)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

func (a *ACME) presentOnce(ctx context.Context) error {
	wo := (&api.WriteOptions{}).WithContext(ctx)
	id, _, err := a.o.Consul.Session().Create(&api.SessionEntry{Name: "seamless ACME replica", TTL: "30s",
		Behavior: api.SessionBehaviorDelete}, wo)
	if err != nil {
		return err
	}
	ok, _, err := a.o.Consul.KV().Acquire(&api.KVPair{Key: a.kvPrefix() + "replicas/" + id, Session: id}, wo)
	if err == nil && !ok {
		err = errors.New("the replica's key was not acquired")
	}
	if err != nil {
		_, _ = a.o.Consul.Session().Destroy(id, nil)
		return err
	}
	a.replica.Store(id)
	defer a.replica.Store("")
	// Destroyed when ctx ends: the key goes at once.
	if err := a.o.Consul.Session().RenewPeriodic("30s", id, nil, ctx.Done()); err != nil {
		return fmt.Errorf("the replica's session: %w", err)
	}
	return nil
}

// ack records that this replica serves token, under its session.
func (a *ACME) ack(ctx context.Context, token string) bool {
	id, _ := a.replica.Load().(string)
	if id == "" {
		return false
	}
	ok, _, err := a.o.Consul.KV().Acquire(&api.KVPair{Key: a.kvPrefix() + "acks/" + token + "/" + id, Session: id},
		(&api.WriteOptions{}).WithContext(ctx))
	return err == nil && ok
}

// syncChallenges copies the answers other replicas put under
// PREFIX/challenges/ into the local map until ctx ends. Only what it added
// is removed by it: a token this replica presents itself is its order's.
func (a *ACME) syncChallenges(ctx context.Context) {
	prefix := a.kvPrefix() + "challenges/"
	added := map[string]string{}
	acked := map[string]bool{}
	watchKV(ctx, a.o.Consul, prefix, a.log, func(pairs api.KVPairs, _ bool) {
		now := map[string]string{}
		for _, p := range pairs {
			token := strings.TrimPrefix(p.Key, prefix)
			if tokenRe.MatchString(token) && keyAuthRe.Match(p.Value) {
				now[token] = string(p.Value)
			}
		}
		for _, token := range sortedKeys(now) {
			if _, ok := added[token]; !ok && !a.o.Challenges.has(token) {
				if err := a.o.Challenges.Present(ctx, "another replica's order", token, now[token]); err != nil {
					a.log.Warn("cannot serve another replica's ACME challenge", "token", token, "err", err)
					continue
				}
				added[token] = now[token]
			}
			if !acked[token] {
				acked[token] = a.ack(ctx, token)
			}
		}
		for token := range acked {
			if _, ok := now[token]; !ok {
				delete(acked, token)
			}
		}
		for _, token := range sortedKeys(added) {
			if _, ok := now[token]; !ok {
				if err := a.o.Challenges.CleanUp(ctx, "", token, added[token]); err != nil {
					a.log.Warn("cannot remove another replica's ACME challenge", "token", token, "err", err)
				}
				delete(added, token)
			}
		}
	})
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
